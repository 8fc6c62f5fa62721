// The architectures of model.arch: one factory per worker/lm/arch_<name>.cc, one line each in kArchitectures.
// Also the parts of LanguageModel that every architecture shares (loss, parameter lists, init).
#include <stdexcept>
#include <string>

#include "worker/lm/language_model.h"

namespace diloco {

LanguageModelPtr MakeGpt(const ModelConfig& config);      // worker/lm/arch_gpt.cc
LanguageModelPtr MakeGpt2(const ModelConfig& config);     // worker/lm/arch_gpt2.cc
LanguageModelPtr MakeLlama(const ModelConfig& config);    // worker/lm/arch_llama.cc
LanguageModelPtr MakeMistral(const ModelConfig& config);  // worker/lm/arch_mistral.cc
LanguageModelPtr MakeQwen2(const ModelConfig& config);    // worker/lm/arch_qwen2.cc
LanguageModelPtr MakeQwen3(const ModelConfig& config);    // worker/lm/arch_qwen3.cc

namespace {

struct Architecture {
  ModelArch arch;
  LanguageModelPtr (*make)(const ModelConfig&);
};

constexpr Architecture kArchitectures[] = {
    {ModelArch::kGpt, MakeGpt},         {ModelArch::kGpt2, MakeGpt2},   {ModelArch::kLlama, MakeLlama},
    {ModelArch::kMistral, MakeMistral}, {ModelArch::kQwen2, MakeQwen2}, {ModelArch::kQwen3, MakeQwen3},
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

LanguageModelPtr MakeLanguageModel(const ModelConfig& config, int64_t seed) {
  for (const Architecture& a : kArchitectures) {
    if (a.arch != config.arch) continue;
    torch::manual_seed(static_cast<uint64_t>(seed));
    return a.make(config);
  }
  throw std::invalid_argument("model.arch '" + std::string(EnumName(config.arch)) + "' has no implementation");
}

torch::Tensor LanguageModel::Loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  auto logits = forward(tokens);
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

void InitParameters(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    const std::string& name = p.key();
    const bool norm = name.find("ln") != std::string::npos || name.find("norm") != std::string::npos;
    if (norm) {
      EndsWith(name, "bias") ? p.value().zero_() : p.value().fill_(1.0);  // gains 1, shifts 0
    } else if (EndsWith(name, "bias")) {
      p.value().zero_();
    } else {
      p.value().normal_(0.0, 0.02);
    }
  }
}

NamedTensors NamedParameters(const torch::nn::Module& model) {
  NamedTensors out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
  return out;
}

void LoadParameters(torch::nn::Module& model, const NamedTensors& values) {
  torch::NoGradGuard no_grad;
  auto params = model.named_parameters(true);
  if (params.size() != values.size()) throw std::invalid_argument("LoadParameters: tensor count differs");
  for (const auto& [name, value] : values) {
    torch::Tensor* p = params.find(name);
    if (p == nullptr) throw std::invalid_argument("LoadParameters: no parameter '" + name + "'");
    p->copy_(value);
  }
}

}  // namespace diloco
