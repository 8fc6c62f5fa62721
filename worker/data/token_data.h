// TokenData: one split (train or val) of a token manifest (worker/data/token_manifest.h), memory-mapped in place
// (worker/data/mapped_tokens.h), the part of it one trainer reads (its shard, worker/data/shard_layout.h), and the
// batches built from it: only the windows a batch needs are copied out of the mapping into int64 tensors, so no process
// holds a copy of the corpus. Training windows come from a WindowSampler (worker/data/window_sampler.h) or from
// Sample's random draws; evaluation batches are fixed, evenly spaced windows over the whole split, so every evaluation
// of the same split sees the same tokens. Owns its mappings; move-only. Const methods are thread-safe.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/mapped_tokens.h"
#include "worker/data/shard_layout.h"

namespace diloco {

enum class TokenSplit { kTrain, kVal };

struct Batch {
  torch::Tensor inputs;   // [B, T] int64
  torch::Tensor targets;  // [B, T] int64, inputs shifted by one
};

class TokenData {
 public:
  // Maps split `split` of the manifest at manifest_path. Errors name the manifest or the token file: missing,
  // truncated (shorter than the manifest says), or fewer than seq_len + 2 tokens in the split.
  static absl::StatusOr<TokenData> Load(const std::string& manifest_path, TokenSplit split, int64_t seq_len);

  int64_t size() const { return tokens_.size(); }
  int64_t seq_len() const { return layout_.seq_len; }

  // Restricts training windows to shard `index` of `count` (worker/data/shard_layout.h). contiguous: the shard is one
  // region, the index-th of `count` equal parts of the split (data.split contiguous: shards differ in style, the
  // paper's non-iid case); otherwise interleaved blocks (data.split iid).
  absl::Status SelectShard(int64_t index, int64_t count, bool contiguous = false);
  // Rank `rank` of `ranks` of a worker cluster reading shard `index` of `count` (MakeRankLayout): its part of the
  // shard.
  absl::Status SelectRankShard(int64_t index, int64_t count, int64_t rank, int64_t ranks, bool contiguous);
  // The selected shard (the whole split until SelectShard).
  const ShardLayout& layout() const { return layout_; }

  // A batch of random windows from the selected shard (data.sampling random's draws).
  Batch Sample(int64_t batch_size, std::mt19937_64& rng) const;
  // The batch of the windows starting at `starts` (global token indices; start + seq_len + 1 <= size()).
  Batch Gather(const std::vector<int64_t>& starts) const;
  // Evaluation batch i of n: batch_size windows at fixed, evenly spaced offsets over the whole split.
  Batch EvalBatch(int64_t i, int64_t n, int64_t batch_size) const;

 private:
  MappedTokens tokens_;
  ShardLayout layout_;
};

}  // namespace diloco
