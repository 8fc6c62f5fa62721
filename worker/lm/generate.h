// Generate: autoregressive decoding from a LanguageModel with its KV cache (worker/lm/kv_cache.h): the prompt is run
// once, then each new token costs one ForwardCached call over one position (O(context) attention), as Hugging Face's
// generate() does with use_cache. temperature 0 is greedy (argmax, ties to the lowest id as torch.argmax); otherwise
// logits / temperature, optionally cut to the top_k largest, sampled with a generator seeded by `seed`. Stops after
// max_new_tokens, at eos_id or any of stop_ids (included in the result), or at the model's context.
// Stateless; uses the caller's model (not thread-safe with respect to it).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/lm/language_model.h"

namespace diloco {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: the whole vocabulary
  uint64_t seed = 0;
  int64_t eos_id = -1;            // -1: never stop early
  std::vector<int64_t> stop_ids;  // more ids that end it as eos_id does (a model's list: Llama 3 Instruct's <|eot_id|>)
};

// The new token ids (not the prompt). InvalidArgument for an empty prompt, an id outside the vocabulary, or a prompt
// that leaves no room in the model's context (`context` positions).
absl::StatusOr<std::vector<int64_t>> Generate(LanguageModel& model, const std::vector<int64_t>& prompt, int64_t context,
                                              const GenerateOptions& options);

}  // namespace diloco
