#include "scripts/ctl/generate.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/hf_model_config.h"
#include "config/subprocess.h"
#include "worker/lm/generate.h"
#include "worker/lm/init_from.h"

namespace diloco {
namespace {

// The model with the weights of --checkpoint or --init-from (both through model.init_from's loader).
absl::StatusOr<LanguageModelPtr> LoadModel(const Config& config) {
  LanguageModelPtr model;
  try {
    model = MakeLanguageModel(config.model, config.run.seed);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  absl::Status s = LoadInitFrom(config.model, *model);
  if (!s.ok()) return s;
  return model;
}

// The tokenizer of the run (SentencePiece or tokenizer.json): data.tokenizer (set from an HF directory's), else the
// run's token cache's ("" when there is none).
std::string FindTokenizer(const Config& config) {
  std::error_code ec;
  if (!config.data.tokenizer.empty() && std::filesystem::is_regular_file(config.data.tokenizer, ec)) {
    return config.data.tokenizer;
  }
  auto cache = LocateTokenCache(config);
  if (cache.ok() && std::filesystem::is_regular_file(cache->tokenizer_path(), ec)) return cache->tokenizer_path();
  return "";
}

// Runs diloco-tokenize (next to this executable) and returns its standard output.
absl::StatusOr<std::string> RunTokenizer(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {SiblingExecutable("diloco-tokenize")};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunForOutput(argv);
}

absl::StatusOr<std::vector<int64_t>> ParseIds(const std::string& text, const char* what) {
  std::vector<int64_t> ids;
  for (absl::string_view word : absl::StrSplit(text, absl::ByAnyChar(", \n"), absl::SkipEmpty())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(word, &id))
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", word, "' is not a token id"));
    ids.push_back(id);
  }
  return ids;
}

// The prompt's ids: --prompt-ids as given, or --prompt through the tokenizer with the special tokens transformers'
// tokenizer(prompt) adds (a tokenizer.json's post-processor: BOS for Llama 3, none for Qwen2.5 or GPT-2).
absl::StatusOr<std::vector<int64_t>> PromptIds(const GenerateCommand& c, const std::string& tokenizer) {
  if (!c.prompt_ids.empty()) return ParseIds(c.prompt_ids, "--prompt-ids");
  if (tokenizer.empty()) {
    return absl::NotFoundError(
        "--prompt needs the run's tokenizer (the HF directory's tokenizer.model or the run's "
        "token cache), and none was found; pass --prompt-ids instead");
  }
  auto out = RunTokenizer({"encode", "--model", tokenizer, "--text", c.prompt, "--add-special-tokens"});
  if (!out.ok()) return out.status();
  return ParseIds(*out, "diloco-tokenize encode");
}

}  // namespace

absl::Status RunGenerate(const GenerateCommand& c) {
  if (c.checkpoint.empty() == c.init_from.empty()) {
    return absl::InvalidArgumentError("pass exactly one of --checkpoint and --init-from");
  }
  if (c.prompt.empty() == c.prompt_ids.empty()) {
    return absl::InvalidArgumentError("pass exactly one of --prompt and --prompt-ids");
  }
  std::vector<std::string> overrides = c.overrides;
  if (!c.init_from.empty()) overrides.push_back("model.init_from=" + c.init_from);  // config.json fills model:
  auto config = LoadConfig(c.config, overrides);
  if (!config.ok()) return config.status();
  // The model directory's stop ids (a list of EOS ids), read before a checkpoint takes init_from's place: from a
  // Hugging Face directory those alone stop generation (as transformers' generate()), else the model's EOS.
  const std::vector<int64_t> stop_ids = HfStopTokenIds(config->model.init_from, config->model.vocab_size);
  const bool hf_dir = IsHfModelDir(config->model.init_from);
  if (!c.checkpoint.empty()) config->model.init_from = c.checkpoint;  // after the run's own init_from shaped model:
  auto model = LoadModel(*config);
  if (!model.ok()) return model.status();
  const std::string tokenizer = FindTokenizer(*config);
  auto prompt = PromptIds(c, tokenizer);
  if (!prompt.ok()) return prompt.status();
  GenerateOptions options;
  options.max_new_tokens = c.max_new_tokens;
  options.temperature = c.temperature;
  options.top_k = c.top_k;
  options.seed = c.seed;
  options.eos_id = c.ignore_eos || hf_dir ? -1 : config->model.eos_token_id;
  if (!c.ignore_eos) options.stop_ids = stop_ids;
  auto ids = Generate(**model, *prompt, config->model.MaxPositions(), options);
  if (!ids.ok()) return ids.status();
  if (c.print_ids || tokenizer.empty()) {
    if (!c.print_ids) std::cerr << "diloco-ctl: no tokenizer found: printing token ids\n";
    std::cout << absl::StrJoin(*ids, " ") << "\n";
    return absl::OkStatus();
  }
  auto text = RunTokenizer({"decode", "--model", tokenizer, "--ids", absl::StrJoin(*ids, " ")});
  if (!text.ok()) return text.status();
  std::cout << (c.prompt.empty() ? "" : c.prompt) << *text << "\n";
  return absl::OkStatus();
}

}  // namespace diloco
