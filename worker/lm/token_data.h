// TokenData: a tokenized split held in memory, the disjoint part of it one worker trains on, and the batches drawn
// from it. Training batches are random windows of seq_len + 1 tokens inside the worker's blocks (iid sampling);
// evaluation batches are fixed, evenly spaced windows, so every evaluation of the same split sees the same tokens.
// Sharding interleaves blocks of kShardBlockTokens tokens: shard i of k owns blocks b with b % k == i, so shards are
// disjoint and each covers the whole corpus. Not thread-safe (the sampler RNG); one per trainer.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace diloco {

constexpr int64_t kShardBlockTokens = 4096;

struct TokenRange {
  int64_t begin;
  int64_t end;  // exclusive
};

// Blocks of [0, num_tokens) owned by shard `index` of `count` (pure; unit-tested).
std::vector<TokenRange> ShardRanges(int64_t num_tokens, int64_t index, int64_t count, int64_t block_tokens);

struct Batch {
  torch::Tensor inputs;   // [B, T] int64
  torch::Tensor targets;  // [B, T] int64, inputs shifted by one
};

class TokenData {
 public:
  // Loads a token shard file (token_shard.h). Fails if it holds fewer than seq_len + 2 tokens.
  static absl::StatusOr<TokenData> Load(const std::string& path, int64_t seq_len);

  int64_t size() const { return tokens_.numel(); }

  // Restricts sampling to shard `index` of `count`. Blocks shorter than a window are dropped.
  // contiguous: the shard is one region, the index-th of `count` equal parts of the corpus (data.split contiguous:
  // shards differ in style, the paper's non-iid case); otherwise interleaved blocks (data.split iid).
  absl::Status SelectShard(int64_t index, int64_t count, bool contiguous = false);

  // A random batch of windows from the selected ranges.
  Batch Sample(int64_t batch_size, std::mt19937_64& rng) const;

  // Evaluation batch i of n: batch_size windows at fixed, evenly spaced offsets over the whole split.
  Batch EvalBatch(int64_t i, int64_t n, int64_t batch_size) const;

 private:
  Batch Gather(const std::vector<int64_t>& starts) const;
  torch::Tensor tokens_;  // [N] int64
  int64_t seq_len_ = 0;
  std::vector<TokenRange> ranges_;
  int64_t range_windows_ = 0;  // number of window starts across ranges_
};

}  // namespace diloco
