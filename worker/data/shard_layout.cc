#include "worker/data/shard_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

// Windows in a range of `len` tokens.
int64_t RandomIn(int64_t len, int64_t seq_len) { return len > seq_len ? len - seq_len : 0; }
// Sequential: one every seq_len tokens, and one more ending at the range's end when the range is not a whole number
// of them (before, those last tokens of every block were never read: 12.5% of the data at seq_len 512).
int64_t SequentialIn(int64_t len, int64_t seq_len) { return len > seq_len ? (len - 2) / seq_len + 1 : 0; }
// The start of sequential window j of a range of `len` tokens beginning at `begin`.
int64_t SequentialAt(int64_t begin, int64_t len, int64_t j, int64_t seq_len) {
  return begin + std::min(j * seq_len, len - seq_len - 1);
}

}  // namespace

std::vector<TokenRange> ShardRanges(int64_t num_tokens, int64_t index, int64_t count, int64_t block_tokens) {
  std::vector<TokenRange> ranges;
  const int64_t num_blocks = (num_tokens + block_tokens - 1) / block_tokens;
  for (int64_t b = index; b < num_blocks; b += count) {
    ranges.push_back({b * block_tokens, std::min(num_tokens, (b + 1) * block_tokens)});
  }
  return ranges;
}

TokenRange ShardLayout::range(int64_t j) const {
  const int64_t begin = first + j * stride;
  return {begin, begin + (j < blocks ? block : tail)};
}

int64_t ShardLayout::random_windows() const { return blocks * RandomIn(block, seq_len) + RandomIn(tail, seq_len); }

int64_t ShardLayout::RandomStart(int64_t w) const {
  const int64_t per_block = RandomIn(block, seq_len);
  if (w < blocks * per_block) return first + (w / per_block) * stride + w % per_block;
  return first + blocks * stride + (w - blocks * per_block);
}

int64_t ShardLayout::sequential_windows() const {
  return blocks * SequentialIn(block, seq_len) + SequentialIn(tail, seq_len);
}

int64_t ShardLayout::SequentialStart(int64_t w) const {
  const int64_t per_block = SequentialIn(block, seq_len);
  if (w < blocks * per_block) return SequentialAt(first + (w / per_block) * stride, block, w % per_block, seq_len);
  return SequentialAt(first + blocks * stride, tail, w - blocks * per_block, seq_len);
}

ShardLayout WholeSplitLayout(int64_t num_tokens, int64_t seq_len) {
  ShardLayout layout;
  layout.seq_len = seq_len;
  layout.stride = layout.block = num_tokens;
  layout.blocks = 1;
  return layout;
}

absl::StatusOr<ShardLayout> MakeShardLayout(int64_t num_tokens, int64_t seq_len, int64_t index, int64_t count,
                                            bool contiguous) {
  if (count <= 0 || index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", index, " of ", count, " does not exist"));
  }
  ShardLayout layout;
  layout.seq_len = seq_len;
  layout.block = contiguous ? (num_tokens + count - 1) / count : std::max(kShardBlockTokens, 4 * (seq_len + 1));
  layout.first = index * layout.block;
  layout.stride = layout.block * count;
  const int64_t num_blocks = (num_tokens + layout.block - 1) / layout.block;
  const int64_t owned = index < num_blocks ? (num_blocks - 1 - index) / count + 1 : 0;
  if (owned > 0) {
    const int64_t last = index + (owned - 1) * count;
    const int64_t last_len = std::min(num_tokens, (last + 1) * layout.block) - last * layout.block;
    layout.blocks = last_len == layout.block ? owned : owned - 1;
    layout.tail = last_len == layout.block ? 0 : last_len;
  }
  if (layout.block <= seq_len) layout.blocks = 0;  // then the tail, shorter still, holds no window either
  if (layout.tail <= seq_len) layout.tail = 0;
  if (layout.num_ranges() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", index, " of ", count, " of ", num_tokens,
                                                      " tokens holds no full window; use fewer workers"));
  }
  return layout;
}

absl::StatusOr<ShardLayout> MakeRankLayout(int64_t num_tokens, int64_t seq_len, int64_t shard, int64_t shard_count,
                                           int64_t rank, int64_t ranks, bool contiguous) {
  if (ranks <= 0 || rank < 0 || rank >= ranks) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", ranks, " does not exist"));
  }
  if (shard_count <= 0 || shard < 0 || shard >= shard_count) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard, " of ", shard_count, " does not exist"));
  }
  if (ranks == 1) return MakeShardLayout(num_tokens, seq_len, shard, shard_count, contiguous);
  if (!contiguous) return MakeShardLayout(num_tokens, seq_len, shard + shard_count * rank, shard_count * ranks, false);
  auto whole = MakeShardLayout(num_tokens, seq_len, shard, shard_count, true);
  if (!whole.ok()) return whole.status();
  const TokenRange region = whole->range(0);      // contiguous: the shard's one range
  const int64_t len = region.end - region.begin;  // pieces differ by at most one token
  const int64_t begin = region.begin + rank * len / ranks;
  const int64_t end = region.begin + (rank + 1) * len / ranks;
  if (end - begin <= seq_len) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " of ", ranks, " of shard ", shard, " of ",
                                                      shard_count, " holds no full window (", end - begin,
                                                      " tokens); use fewer workers or a smaller cluster"));
  }
  ShardLayout layout = WholeSplitLayout(end - begin, seq_len);
  layout.first = begin;
  return layout;
}

}  // namespace diloco
