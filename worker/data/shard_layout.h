// ShardLayout: which token ranges of a split one data shard owns, and the windows inside them, in O(1) memory (a
// shard of billions of tokens owns hundreds of thousands of blocks; none of them is listed). The split's global token
// index [0, N) is cut into blocks; shard `index` of `count` owns blocks index, index + count, ... (data.split iid:
// blocks of max(kShardBlockTokens, 4 x (seq_len + 1)) tokens, interleaved) or the one block index (data.split
// contiguous: blocks of ceil(N / count), one region each). Owned blocks shorter than a window are dropped; only the
// split's last block can be one. A window is seq_len + 1 ids (inputs and targets shifted by one):
//   random windows:     every start s in a range r with s + seq_len + 1 <= r.end (windows may overlap);
//   sequential windows: starts r.begin + j * seq_len with start + seq_len + 1 <= r.end, and when that leaves tokens
//                       at r.end unread, one more window ending at r.end (its inputs overlap the one before it; every
//                       token of a range is read once an epoch, the overlap twice).
// Windows are numbered range by range in token order. Plain value type; pure functions; thread-safe.
#pragma once

#include <cstdint>
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

struct ShardLayout {
  int64_t seq_len = 0;
  int64_t first = 0;   // begin of the first owned range
  int64_t stride = 0;  // distance between the begins of consecutive owned ranges (block x count)
  int64_t block = 0;   // tokens in each full range
  int64_t blocks = 0;  // full ranges: range j in [0, blocks) is [first + j x stride, + block)
  int64_t tail = 0;    // tokens of a last, shorter range at first + blocks x stride (0: none)

  int64_t num_ranges() const { return blocks + (tail > 0 ? 1 : 0); }
  TokenRange range(int64_t j) const;
  int64_t tokens() const { return blocks * block + tail; }

  // Random windows: how many, and the start (global token index) of window w in [0, random_windows()).
  int64_t random_windows() const;
  int64_t RandomStart(int64_t w) const;
  // Sequential windows: how many (one epoch), and the start of window w in [0, sequential_windows()).
  int64_t sequential_windows() const;
  int64_t SequentialStart(int64_t w) const;
};

// The whole split as one range (no shard selected).
ShardLayout WholeSplitLayout(int64_t num_tokens, int64_t seq_len);

// Shard `index` of `count` of a split of num_tokens (see above). InvalidArgument for a shard that does not exist,
// FailedPrecondition when the shard holds no full window.
absl::StatusOr<ShardLayout> MakeShardLayout(int64_t num_tokens, int64_t seq_len, int64_t index, int64_t count,
                                            bool contiguous);

// Rank `rank` of `ranks` of a worker cluster reading shard `shard` of `shard_count` (workers.cluster_size): the
// shard's tokens split among its ranks, so that the ranks of every worker together read exactly their shard, whatever
// the other workers' cluster sizes. iid: the shard's blocks dealt out in turn (block j of the split goes to shard
// j mod shard_count and, within it, to rank (j div shard_count) mod ranks: shard + shard_count x rank of
// shard_count x ranks); contiguous: the shard's one region cut into `ranks` consecutive pieces. One rank: the shard.
// (Before, rank r read part shard x ranks + r of shard_count x ranks: workers of different cluster sizes read
// overlapping blocks, and some blocks no one read.) Errors as MakeShardLayout's.
absl::StatusOr<ShardLayout> MakeRankLayout(int64_t num_tokens, int64_t seq_len, int64_t shard, int64_t shard_count,
                                           int64_t rank, int64_t ranks, bool contiguous);

}  // namespace diloco
