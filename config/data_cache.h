// The token cache of a run: where the tokenized train/validation shards of a config live, and EnsureTokenized(),
// which makes them exist exactly once even when many processes (coordinator, workers, launcher) start together.
//
// Layout: <data.cache_dir or run.output_dir/data>/tok-<key>/{train.tok, val.tok, tokenizer.model, meta.json},
// where <key> hashes the text file's bytes, model.vocab_size and data.val_fraction, so a changed input never reuses
// a stale cache. The directory appears atomically (the tokenizer writes tok-<key>.partial-<pid> and renames it).
// EnsureTokenized holds an flock on tok-<key>.lock while it checks and, if needed, runs diloco-tokenize as a child
// process (SentencePiece cannot live in a process that loads protobuf: DESIGN.md §5). Thread-safe across processes.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"

namespace diloco {

struct TokenCache {
  std::string dir;
  std::string train_path() const { return dir + "/train.tok"; }
  std::string val_path() const { return dir + "/val.tok"; }
  std::string tokenizer_model_path() const { return dir + "/tokenizer.model"; }
  std::string meta_path() const { return dir + "/meta.json"; }  // the token manifest (worker/lm/token_manifest.h)
};

// Computes the cache location (reads data.text to hash it). NotFound names data.text if the file is missing.
absl::StatusOr<TokenCache> LocateTokenCache(const Config& config);

// Returns the cache, tokenizing first if it does not exist yet. `tokenizer_exe` is the diloco-tokenize binary.
absl::StatusOr<TokenCache> EnsureTokenized(const Config& config, const std::string& tokenizer_exe);

}  // namespace diloco
