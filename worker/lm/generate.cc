#include "worker/lm/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

// The next token from the last position's logits [vocab].
int64_t NextToken(const torch::Tensor& logits, const GenerateOptions& options, at::Generator& generator) {
  if (options.temperature <= 0) return logits.argmax().item<int64_t>();
  torch::Tensor scaled = logits.to(torch::kDouble) / options.temperature;
  if (options.top_k > 0 && options.top_k < scaled.size(0)) {
    const double kth = std::get<0>(scaled.topk(options.top_k)).min().item<double>();
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<double>::infinity());
  }
  return torch::multinomial(torch::softmax(scaled, 0), 1, /*replacement=*/false, generator).item<int64_t>();
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> Generate(LanguageModel& model, const std::vector<int64_t>& prompt, int64_t context,
                                              const GenerateOptions& options) {
  const int64_t vocab = model.config().vocab_size;
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  for (int64_t id : prompt) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", id, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (static_cast<int64_t>(prompt.size()) >= context) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt.size(), " tokens: no room left in the ",
                                                   "model's context of ", context));
  }
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  KvCache cache;
  torch::Tensor input = torch::tensor(prompt, torch::kLong).unsqueeze(0);  // [1, T]
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < options.max_new_tokens && cache.length + input.size(1) <= context) {
    torch::Tensor logits = model.ForwardCached(input, cache);  // [1, T, vocab]
    const int64_t next = NextToken(logits[0][-1], options, generator);
    out.push_back(next);
    if (next == options.eos_id ||
        std::find(options.stop_ids.begin(), options.stop_ids.end(), next) != options.stop_ids.end()) {
      break;
    }
    input = torch::full({1, 1}, next, torch::kLong);
  }
  model.train(was_training);
  return out;
}

}  // namespace diloco
