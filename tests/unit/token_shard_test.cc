// Token shard files (worker/lm/token_shard.h) and data sharding (worker/lm/token_data.h).
#include "worker/lm/token_shard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/unit/scratch_dir_test.h"
#include "worker/lm/token_data.h"

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

TEST(ShardRangesTest, ExactBlocks) {
  const std::vector<TokenRange> r = ShardRanges(10500, 1, 3, 1000);
  ASSERT_EQ(r.size(), 4u);  // blocks 1, 4, 7, 10
  EXPECT_EQ(r[0].begin, 1000);
  EXPECT_EQ(r[0].end, 2000);
  EXPECT_EQ(r[3].begin, 10000);
  EXPECT_EQ(r[3].end, 10500);
}

// Token ids equal to their position, so a batch tells where it was drawn from.
class TokenDataTest : public TokenShardTest {
 protected:
  std::string WritePositions(int64_t n) {
    std::vector<uint32_t> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<uint32_t>(i);
    std::string error;
    EXPECT_TRUE(WriteTokenShard(Path("pos.tok"), ids, 65536, &error)) << error;
    return Path("pos.tok");
  }
};

TEST_F(TokenDataTest, SamplesStayInsideTheSelectedShard) {
  absl::StatusOr<TokenData> data = TokenData::Load(WritePositions(4 * kShardBlockTokens), 16);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size(), 4 * kShardBlockTokens);
  ASSERT_TRUE(data->SelectShard(1, 2).ok());
  std::mt19937_64 rng(3);
  Batch b = data->Sample(64, rng);
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(b.inputs.scalar_type(), torch::kLong);
  EXPECT_TRUE(b.targets.equal(b.inputs + 1)) << "targets are the inputs shifted by one";
  const torch::Tensor block = torch::div(b.inputs, kShardBlockTokens, "floor");
  EXPECT_TRUE(block.remainder(2).eq(1).all().item<bool>()) << "every token from an odd block";
  EXPECT_TRUE(torch::div(b.targets, kShardBlockTokens, "floor").equal(block)) << "windows never cross a block";
}

TEST_F(TokenDataTest, EvalBatchesAreFixed) {
  absl::StatusOr<TokenData> data = TokenData::Load(WritePositions(1000), 8);
  ASSERT_TRUE(data.ok()) << data.status();
  Batch a = data->EvalBatch(1, 4, 3);
  Batch b = data->EvalBatch(1, 4, 3);
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_TRUE(a.targets.equal(a.inputs + 1));
  EXPECT_LE(a.targets.max().item<int64_t>(), 999);
}

TEST_F(TokenDataTest, BadShardAndShortFileAreErrors) {
  absl::StatusOr<TokenData> data = TokenData::Load(WritePositions(100), 16);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->SelectShard(2, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(data->SelectShard(0, 0).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<TokenData> tiny = TokenData::Load(WritePositions(17), 16);
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<TokenData> missing = TokenData::Load(Path("none.tok"), 16);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("none.tok"));
}

// data.split contiguous: shard i of k samples only from the i-th of k equal regions; iid shards span the corpus.
TEST_F(TokenShardTest, ContiguousSplitSamplesOnlyItsRegion) {
  std::vector<uint32_t> ids(10000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i);  // a token's value is its position
  std::string error;
  ASSERT_TRUE(WriteTokenShard(Path("t.tok"), ids, 10000, &error)) << error;
  auto data = TokenData::Load(Path("t.tok"), 8);
  ASSERT_TRUE(data.ok()) << data.status();
  std::mt19937_64 rng(1);
  ASSERT_TRUE(data->SelectShard(1, 4, /*contiguous=*/true).ok());
  Batch b = data->Sample(256, rng);
  EXPECT_GE(b.inputs.min().item<int64_t>(), 2500);
  EXPECT_LT(b.targets.max().item<int64_t>(), 5000);
  ASSERT_TRUE(data->SelectShard(1, 4, /*contiguous=*/false).ok());  // blocks of 4096: shard 1 owns [4096, 8192)
  b = data->Sample(256, rng);
  EXPECT_GE(b.inputs.min().item<int64_t>(), 4096);
  EXPECT_LT(b.targets.max().item<int64_t>(), 8192);
  EXPECT_FALSE(data->SelectShard(4, 4, true).ok());
}

}  // namespace
}  // namespace diloco
