// Token shard files (worker/data/token_shard.h) and the block list of data sharding (worker/data/shard_layout.h).
#include "worker/data/token_shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/unit/scratch_dir_test.h"
#include "worker/data/shard_layout.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TokenShardTest : public ScratchDirTest {
 protected:
};

TEST_F(TokenShardTest, RoundTripUint16) {
  const std::vector<uint32_t> ids = {0, 1, 511, 300, 7, 511, 0};
  std::string error;
  ASSERT_TRUE(WriteTokenShard(Path("a.tok"), ids, 512, &error)) << error;
  EXPECT_EQ(fs::file_size(Path("a.tok")), 24u + 2 * ids.size());
  EXPECT_FALSE(fs::exists(Path("a.tok.tmp")));
  std::vector<int32_t> back;
  ASSERT_TRUE(ReadTokenShard(Path("a.tok"), &back, &error)) << error;
  EXPECT_EQ(back, std::vector<int32_t>(ids.begin(), ids.end()));
}

TEST_F(TokenShardTest, RoundTripUint32ForLargeVocab) {
  const std::vector<uint32_t> ids = {69999, 65536, 65535, 0, 12345};
  std::string error;
  ASSERT_TRUE(WriteTokenShard(Path("b.tok"), ids, 70000, &error)) << error;
  EXPECT_EQ(fs::file_size(Path("b.tok")), 24u + 4 * ids.size());
  std::vector<int32_t> back;
  ASSERT_TRUE(ReadTokenShard(Path("b.tok"), &back, &error)) << error;
  EXPECT_EQ(back, std::vector<int32_t>(ids.begin(), ids.end()));
}

TEST_F(TokenShardTest, EmptyShardRoundTrips) {
  std::string error;
  ASSERT_TRUE(WriteTokenShard(Path("e.tok"), {}, 512, &error)) << error;
  std::vector<int32_t> back = {42};
  ASSERT_TRUE(ReadTokenShard(Path("e.tok"), &back, &error)) << error;
  EXPECT_TRUE(back.empty());
}

TEST_F(TokenShardTest, TruncatedFileIsRejected) {
  std::vector<uint32_t> ids(100);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i);
  std::string error;
  ASSERT_TRUE(WriteTokenShard(Path("t.tok"), ids, 512, &error)) << error;
  fs::resize_file(Path("t.tok"), 24 + 2 * 100 - 1);
  std::vector<int32_t> back;
  EXPECT_FALSE(ReadTokenShard(Path("t.tok"), &back, &error));
  EXPECT_THAT(error, HasSubstr("truncated"));
  EXPECT_THAT(error, HasSubstr(Path("t.tok")));
  fs::resize_file(Path("t.tok"), 10);  // not even a header
  error.clear();
  EXPECT_FALSE(ReadTokenShard(Path("t.tok"), &back, &error));
  EXPECT_FALSE(error.empty());
}

TEST_F(TokenShardTest, BadMagicAndMissingFileAreRejected) {
  std::string error;
  {
    std::ofstream out(Path("x.tok"), std::ios::binary);
    out << std::string(64, 'x');
  }
  std::vector<int32_t> back;
  EXPECT_FALSE(ReadTokenShard(Path("x.tok"), &back, &error));
  EXPECT_THAT(error, HasSubstr("magic"));
  EXPECT_FALSE(ReadTokenShard(Path("missing.tok"), &back, &error));
  EXPECT_THAT(error, HasSubstr("missing.tok"));
}

TEST(ShardRangesTest, DisjointAndCoverEverything) {
  for (int64_t n : {int64_t{10000}, int64_t{10500}, int64_t{999}, int64_t{1}}) {
    for (int64_t k : {1, 2, 3, 8, 20}) {
      std::vector<int> owner(n, -1);
      for (int64_t i = 0; i < k; ++i) {
        for (const TokenRange& r : ShardRanges(n, i, k, 1000)) {
          ASSERT_LT(r.begin, r.end);
          ASSERT_GE(r.begin, 0);
          ASSERT_LE(r.end, n);
          EXPECT_EQ((r.begin / 1000) % k, i) << "block-interleaved";
          for (int64_t t = r.begin; t < r.end; ++t) {
            ASSERT_EQ(owner[t], -1) << "token " << t << " in shards " << owner[t] << " and " << i;
            owner[t] = static_cast<int>(i);
          }
        }
      }
      for (int64_t t = 0; t < n; ++t) ASSERT_NE(owner[t], -1) << "token " << t << " of " << n << ", k " << k;
    }
  }
}

// Workers of different cluster sizes (heterogeneous clusters: 1, 2 and 4 ranks here): every rank reads a part of its
// worker's shard, no token is read by two ranks, and a worker's ranks together read exactly its shard, with both
// data.split styles. Before, rank r read part shard x n + r of shard_count x n: with iid blocks the 2-rank worker 0
// and the 1-rank worker 1 both read blocks 1 mod 6, and blocks 2 mod 6 were no one's.
TEST(ShardRangesTest, RanksOfWorkersOfDifferentClusterSizesSplitTheirShardExactly) {
  const int64_t seq_len = 16;
  const std::vector<int64_t> ranks_of = {2, 1, 4};  // worker k's cluster size
  const int64_t count = static_cast<int64_t>(ranks_of.size());
  for (bool contiguous : {false, true}) {
    for (int64_t n : {int64_t{200000}, int64_t{123457}}) {
      SCOPED_TRACE(::testing::Message() << (contiguous ? "contiguous" : "iid") << ", " << n << " tokens");
      std::vector<int> owner(static_cast<size_t>(n), -1);  // worker x 8 + rank
      for (int64_t shard = 0; shard < count; ++shard) {
        auto whole = MakeShardLayout(n, seq_len, shard, count, contiguous);
        ASSERT_TRUE(whole.ok()) << whole.status();
        std::vector<bool> in_shard(static_cast<size_t>(n), false);
        int64_t shard_tokens = 0;
        for (int64_t j = 0; j < whole->num_ranges(); ++j) {
          for (int64_t t = whole->range(j).begin; t < whole->range(j).end; ++t) in_shard[t] = true;
          shard_tokens += whole->range(j).end - whole->range(j).begin;
        }
        int64_t read = 0;
        for (int64_t rank = 0; rank < ranks_of[shard]; ++rank) {
          auto part = MakeRankLayout(n, seq_len, shard, count, rank, ranks_of[shard], contiguous);
          ASSERT_TRUE(part.ok()) << part.status();
          for (int64_t j = 0; j < part->num_ranges(); ++j) {
            const TokenRange r = part->range(j);
            ASSERT_GT(r.end - r.begin, seq_len) << "a range holds a window";
            for (int64_t t = r.begin; t < r.end; ++t) {
              ASSERT_TRUE(in_shard[t]) << "token " << t << " of rank " << rank << " is outside shard " << shard;
              ASSERT_EQ(owner[t], -1) << "token " << t << " read by " << owner[t] << " and " << shard * 8 + rank;
              owner[t] = static_cast<int>(shard * 8 + rank);
            }
            read += r.end - r.begin;
          }
        }
        EXPECT_EQ(read, shard_tokens) << "the ranks of worker " << shard << " read all of its shard";
      }
    }
  }
  auto one = MakeRankLayout(200000, seq_len, 1, 3, 0, 1, false);
  auto shard = MakeShardLayout(200000, seq_len, 1, 3, false);
  ASSERT_TRUE(one.ok() && shard.ok());
  EXPECT_EQ(one->first, shard->first) << "one rank reads its shard as before";
  EXPECT_EQ(one->stride, shard->stride);
  EXPECT_EQ(one->random_windows(), shard->random_windows());
  EXPECT_EQ(MakeRankLayout(200000, seq_len, 0, 3, 2, 2, false).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeRankLayout(200000, seq_len, 3, 3, 0, 2, false).status().code(), absl::StatusCode::kInvalidArgument)
      << "shard 3 of 3 does not exist, whatever the ranks";
}

TEST(ShardRangesTest, ExactBlocks) {
  const std::vector<TokenRange> r = ShardRanges(10500, 1, 3, 1000);
  ASSERT_EQ(r.size(), 4u);  // blocks 1, 4, 7, 10
  EXPECT_EQ(r[0].begin, 1000);
  EXPECT_EQ(r[0].end, 2000);
  EXPECT_EQ(r[3].begin, 10000);
  EXPECT_EQ(r[3].end, 10500);
}

}  // namespace
}  // namespace diloco
