// The token cache of a run: where the tokenized train/validation data of a config live, and EnsureTokenized(),
// which makes them exist exactly once even when many processes (coordinator, workers, launcher) start together.
//
// Layout: <data.cache_dir or run.output_dir/data>/tok-<key>/ holding meta.json (the token manifest,
// worker/data/token_manifest.h: the ONLY file readers need), the shards it names (train-00000.tok, ..., val-00000.tok;
// for data.format tokens it names the user's files in place instead) and tokenizer.model. <key> is an xxHash of
// everything the output depends on: format, jsonl_field, token_dtype, on_bad_record, val_fraction, model.vocab_size,
// the given tokenizer's bytes (with a tokenizer.json, those of the config.json / tokenizer_config.json beside it too,
// which name its BOS / EOS), tokenizer_train_mb, and each input's absolute path, size and mtime (not its contents:
// inputs can be many GB and every process computes the key), plus a format version. The directory appears
// atomically (diloco-tokenize builds <dir>.partial and renames it). EnsureTokenized holds an flock on
// tok-<key>.lock while it checks and, if needed, runs diloco-tokenize as a child process (SentencePiece cannot live
// in a process that loads protobuf: docs/development.md, "Platform hazards"); the child's stderr (progress) goes to
// ours. A killed tokenizer leaves <dir>.partial, from which the next EnsureTokenized resumes. Thread-safe across
// processes.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"

namespace diloco {

struct TokenCache {
  std::string dir;
  std::string meta_path() const { return dir + "/meta.json"; }  // the token manifest (worker/data/token_manifest.h)
  std::string tokenizer_model_path() const { return dir + "/tokenizer.model"; }
  // The cache's tokenizer: tokenizer.json when it was made with one, else tokenizer.model.
  std::string tokenizer_path() const;
  // The first shard of each split: what the single-file readers used until they read the manifest (a small corpus
  // fits in one shard). To be removed when every reader goes through meta_path().
  std::string train_path() const { return dir + "/train-00000.tok"; }
  std::string val_path() const { return dir + "/val-00000.tok"; }
};

// The name a tokenizer file keeps when copied (into a cache or an export): "tokenizer.json" for a .json file (a
// Hugging Face tokenizer.json), else "tokenizer.model" (SentencePiece).
std::string TokenizerFileName(const std::string& path);

// Computes the cache location (expands data.files / data.val_files and stats every input). A missing file, an empty
// glob or an empty directory is NotFound with one line naming the key and the path or pattern.
absl::StatusOr<TokenCache> LocateTokenCache(const Config& config);

// InvalidArgument when the run would train a tokenizer for a Hugging Face model.init_from directory that ships none
// (data.tokenizer unset, data.train_tokenizer false): one line saying what to set. EnsureTokenized checks it first.
absl::Status CheckTokenizerChoice(const Config& config);

// Returns the cache, tokenizing first if it does not exist yet. `tokenizer_exe` is the diloco-tokenize binary.
absl::StatusOr<TokenCache> EnsureTokenized(const Config& config, const std::string& tokenizer_exe);

// The vocabulary digest of the cache's tokenizer (`tokenizer_exe digest`, a child process: SentencePiece cannot be
// loaded here), 16 hex digits; "" when the cache has no tokenizer (data.format tokens). What the coordinator and
// workers compare at Join (proto/diloco.proto DataSpec). An error (the tool missing or failing) names the tool and
// what it printed; the callers then warn and do not check.
absl::StatusOr<std::string> VocabDigestOf(const TokenCache& cache, const std::string& tokenizer_exe);

}  // namespace diloco
