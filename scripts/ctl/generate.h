// `diloco-ctl generate`: samples text from a trained or imported model. The model is our checkpoint (--checkpoint, with
// the run's YAML for model:) or a Hugging Face directory (--init-from, config.json + safetensors). Text prompts are
// encoded and the result decoded by the tokenizer executable (diloco-tokenize encode/decode; SentencePiece cannot
// share a process with protobuf, docs/development.md, "Platform hazards") with the run's tokenizer: data.tokenizer (an
// HF directory's tokenizer.model), else the run's token cache's. Decoding itself is worker/lm/generate.h (KV cache,
// greedy at temperature 0). Offline (no coordinator); stateless.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace diloco {

struct GenerateCommand {
  std::string config;                  // the run's YAML (model:, data:)
  std::vector<std::string> overrides;  // --set
  std::string checkpoint;              // our checkpoint, or
  std::string init_from;               // a Hugging Face model directory
  std::string prompt;                  // text, or
  std::string prompt_ids;              // "1,2,3"
  int64_t max_new_tokens = 32;
  double temperature = 0.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool print_ids = false;   // only the new ids, space-separated, on one line
  bool ignore_eos = false;  // go on past the model's EOS id
};

// Runs the command and prints the result to stdout. Errors: NotFound, InvalidArgument or FailedPrecondition for bad
// input (flags, config, missing files, a model that does not match), another code for other failures; diloco-ctl prints
// them.
absl::Status RunGenerate(const GenerateCommand& command);

}  // namespace diloco
