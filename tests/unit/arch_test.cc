// The llama and gpt2 architectures (worker/lm/arch_llama.cc, arch_gpt2.cc) without Hugging Face: their parameter names
// and shapes are Hugging Face's, the init sets norm gains to 1, the fused attention path equals the composite ops
// (GQA + RoPE for llama), ForwardCached equals forward(), positions past max_positions are refused, and both train
// (the loss of a fixed batch falls under AdamW). The golden comparison with transformers is
// tests/integration/hf_golden_test.cc.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "tests/unit/tiny_models.h"
#include "worker/lm/kernel_dispatch.h"
#include "worker/lm/language_model.h"

namespace diloco {
namespace {

std::vector<std::pair<std::string, std::vector<int64_t>>> Shapes(const LanguageModel& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [name, p] : NamedParameters(model)) out.emplace_back(name, p.sizes().vec());
  return out;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(ArchTest, LlamaParametersHaveHuggingFaceNamesShapesAndOrder) {
  const auto shapes = Shapes(*MakeLanguageModel(TinyLlama(/*tied=*/false), 1));
  using V = std::vector<int64_t>;
  const std::vector<std::pair<std::string, V>> layer0 = {
      {"model.layers.0.self_attn.q_proj.weight", {32, 32}},    {"model.layers.0.self_attn.k_proj.weight", {16, 32}},
      {"model.layers.0.self_attn.v_proj.weight", {16, 32}},    {"model.layers.0.self_attn.o_proj.weight", {32, 32}},
      {"model.layers.0.mlp.gate_proj.weight", {48, 32}},       {"model.layers.0.mlp.up_proj.weight", {48, 32}},
      {"model.layers.0.mlp.down_proj.weight", {32, 48}},       {"model.layers.0.input_layernorm.weight", {32}},
      {"model.layers.0.post_attention_layernorm.weight", {32}}};
  ASSERT_EQ(shapes.size(), 1u + 2 * layer0.size() + 2);
  EXPECT_EQ(shapes.front(), (std::pair<std::string, V>{"model.embed_tokens.weight", {64, 32}}));
  for (size_t i = 0; i < layer0.size(); ++i) EXPECT_EQ(shapes[1 + i], layer0[i]);
  EXPECT_EQ(shapes[shapes.size() - 2], (std::pair<std::string, V>{"model.norm.weight", {32}}));
  EXPECT_EQ(shapes.back(), (std::pair<std::string, V>{"lm_head.weight", {64, 32}}));

  const auto tied = Shapes(*MakeLanguageModel(TinyLlama(/*tied=*/true), 1));
  EXPECT_EQ(tied.size(), shapes.size() - 1);
  EXPECT_EQ(tied.back().first, "model.norm.weight");
}

TEST(ArchTest, Gpt2ParametersHaveHuggingFaceNamesAndConv1DShapes) {
  const auto shapes = Shapes(*MakeLanguageModel(TinyGpt2(), 1));
  using V = std::vector<int64_t>;
  const std::vector<std::pair<std::string, V>> want_start = {{"transformer.wte.weight", {64, 32}},
                                                             {"transformer.wpe.weight", {24, 32}},
                                                             {"transformer.h.0.ln_1.weight", {32}},
                                                             {"transformer.h.0.ln_1.bias", {32}},
                                                             {"transformer.h.0.attn.c_attn.weight", {32, 96}},
                                                             {"transformer.h.0.attn.c_attn.bias", {96}},
                                                             {"transformer.h.0.attn.c_proj.weight", {32, 32}},
                                                             {"transformer.h.0.attn.c_proj.bias", {32}},
                                                             {"transformer.h.0.ln_2.weight", {32}},
                                                             {"transformer.h.0.ln_2.bias", {32}},
                                                             {"transformer.h.0.mlp.c_fc.weight", {32, 40}},
                                                             {"transformer.h.0.mlp.c_fc.bias", {40}},
                                                             {"transformer.h.0.mlp.c_proj.weight", {40, 32}},
                                                             {"transformer.h.0.mlp.c_proj.bias", {32}}};
  ASSERT_EQ(shapes.size(), 2u + 2 * 12 + 2);
  for (size_t i = 0; i < want_start.size(); ++i) EXPECT_EQ(shapes[i], want_start[i]);
  EXPECT_EQ(shapes.back(), (std::pair<std::string, V>{"transformer.ln_f.bias", {32}}));
}

TEST(ArchTest, InitSetsNormGainsToOneAndDrawsMatrices) {
  for (const ModelConfig& c : {TinyLlama(false), TinyGpt2()}) {
    auto model = MakeLanguageModel(c, 3);
    for (const auto& [name, p] : NamedParameters(*model)) {
      const bool gain = (name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos) &&
                        name.size() > 6 && name.substr(name.size() - 6) == "weight";
      if (gain) {
        EXPECT_TRUE(torch::equal(p, torch::ones_like(p))) << name;
      } else if (p.dim() >= 2) {
        EXPECT_NEAR(p.std().item<double>(), 0.02, 0.005) << name;
      }
    }
  }
}

// forward() and gradients with the fused attention against the composite ops (CausalSelfAttentionReference).
TEST(ArchTest, LlamaFusedAttentionEqualsCompositeOpsWithGqaAndRope) {
  auto model = MakeLanguageModel(TinyLlama(false), 5);
  torch::manual_seed(9);
  const torch::Tensor tokens = torch::randint(0, 64, {3, 16}, torch::kLong);
  const torch::Tensor targets = torch::randint(0, 64, {3, 16}, torch::kLong);
  auto run = [&](bool fused) {
    AllowFusedKernels(fused);
    model->zero_grad();
    auto logits = model->forward(tokens);
    model->Loss(tokens, targets).backward();
    std::vector<torch::Tensor> grads;
    for (const auto& [name, p] : NamedParameters(*model)) grads.push_back(p.grad().clone());
    AllowFusedKernels(true);
    return std::make_pair(logits.detach(), grads);
  };
  const auto [fused_logits, fused_grads] = run(true);
  const auto [ref_logits, ref_grads] = run(false);
  EXPECT_LE(MaxAbsDiff(fused_logits, ref_logits), 1e-5);
  EXPECT_GT(fused_logits.abs().max().item<double>(), 1e-2);  // not trivially zero
  for (size_t i = 0; i < fused_grads.size(); ++i) EXPECT_LE(MaxAbsDiff(fused_grads[i], ref_grads[i]), 1e-5) << i;
}

TEST(ArchTest, ForwardCachedEqualsForwardForLlamaAndGpt2) {
  for (const ModelConfig& c : {TinyLlama(false), TinyLlama(true), TinyGpt2()}) {
    auto model = MakeLanguageModel(c, 11);
    torch::NoGradGuard no_grad;
    const torch::Tensor tokens = torch::randint(0, 64, {2, 12}, torch::kLong);
    const torch::Tensor full = model->forward(tokens);
    KvCache cache;
    std::vector<torch::Tensor> parts = {model->ForwardCached(tokens.narrow(1, 0, 5), cache)};
    for (int64_t t = 5; t < 12; ++t) parts.push_back(model->ForwardCached(tokens.narrow(1, t, 1), cache));
    EXPECT_EQ(cache.length, 12);
    EXPECT_LE(MaxAbsDiff(torch::cat(parts, 1), full), 1e-5) << EnumName(c.arch);
  }
}

TEST(ArchTest, PositionsPastMaxPositionsAreRefused) {
  for (const ModelConfig& c : {TinyLlama(false), TinyGpt2()}) {
    auto model = MakeLanguageModel(c, 1);
    torch::NoGradGuard no_grad;
    EXPECT_NO_THROW(model->forward(torch::zeros({1, c.MaxPositions()}, torch::kLong)));
    EXPECT_THROW(model->forward(torch::zeros({1, c.MaxPositions() + 1}, torch::kLong)), std::invalid_argument);
    KvCache cache;
    model->ForwardCached(torch::zeros({1, c.MaxPositions()}, torch::kLong), cache);
    EXPECT_THROW(model->ForwardCached(torch::zeros({1, 1}, torch::kLong), cache), std::invalid_argument);
  }
}

// 30 AdamW steps on one fixed batch of random tokens: a model that trains memorises it.
TEST(ArchTest, LlamaAndGpt2Train) {
  for (const ModelConfig& c : {TinyLlama(false), TinyGpt2()}) {
    auto model = MakeLanguageModel(c, 2);
    torch::manual_seed(4);
    const torch::Tensor data = torch::randint(0, 64, {8, 17}, torch::kLong);
    const torch::Tensor tokens = data.narrow(1, 0, 16), targets = data.narrow(1, 1, 16);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      opt.zero_grad();
      auto loss = model->Loss(tokens, targets);
      loss.backward();
      opt.step();
      (step == 0 ? first : last) = loss.item<double>();
    }
    EXPECT_NEAR(first, std::log(64.0), 0.3) << EnumName(c.arch);  // small init: near-uniform predictions
    EXPECT_LT(last, first - 1.0) << EnumName(c.arch);
  }
}

}  // namespace
}  // namespace diloco
