// TokenData (worker/data/token_data.h): splits of a token manifest mapped in place (segments of both widths, offsets,
// windows across segments), the errors that name the file, the shard layout (worker/data/shard_layout.h) against the
// block list it replaces, and the memory bound: loading a 512 MB split does not raise the process's RSS.
#include "worker/data/token_data.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/token_files.h"
#include "worker/data/window_sampler.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TokenDataTest : public ScratchDirTest {
 protected:
  std::string WritePositions(int64_t n) { return WritePositionsManifest(dir_.string(), n); }

  // Writes `bytes` to a file and returns its path.
  std::string WriteBytes(const std::string& name, const std::vector<char>& bytes) {
    std::ofstream out(Path(name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return Path(name);
  }
  template <typename T>
  static void Append(std::vector<char>* bytes, T id) {
    const char* p = reinterpret_cast<const char*>(&id);
    bytes->insert(bytes->end(), p, p + sizeof(T));
  }
};

TEST_F(TokenDataTest, SamplesStayInsideTheSelectedShard) {
  absl::StatusOr<TokenData> data = TokenData::Load(WritePositions(4 * kShardBlockTokens), TokenSplit::kTrain, 16);
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
  absl::StatusOr<TokenData> data = TokenData::Load(WritePositions(1000), TokenSplit::kVal, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  Batch a = data->EvalBatch(1, 4, 3);
  Batch b = data->EvalBatch(1, 4, 3);
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_TRUE(a.targets.equal(a.inputs + 1));
  EXPECT_LE(a.targets.max().item<int64_t>(), 999);
  // Batch 1 of 4 of 3 windows: windows 3, 4, 5 of 12 evenly spaced over the 1000 - 8 - 1 possible starts.
  EXPECT_TRUE(a.inputs.select(1, 0).equal(torch::tensor({247, 330, 412}, torch::kLong))) << a.inputs;
}

TEST_F(TokenDataTest, BadShardAndShortFileAreErrors) {
  absl::StatusOr<TokenData> data = TokenData::Load(WritePositions(100), TokenSplit::kTrain, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->SelectShard(2, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(data->SelectShard(0, 0).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<TokenData> tiny = TokenData::Load(WritePositions(17), TokenSplit::kTrain, 16);
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tiny.status().message()), HasSubstr(Path("pos.tok")));
  absl::StatusOr<TokenData> missing = TokenData::Load(Path("none.json"), TokenSplit::kTrain, 16);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("none.json"));
}

// data.split contiguous: shard i of k samples only from the i-th of k equal regions; iid shards span the corpus.
TEST_F(TokenDataTest, ContiguousSplitSamplesOnlyItsRegion) {
  auto data = TokenData::Load(WritePositions(10000), TokenSplit::kTrain, 8);
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

// Three segments: our uint16 shard (24-byte header), an llm.c-style uint32 file with a 1024-byte header and ids above
// 65535, and the tail part of a raw uint16 file starting mid-file. Every window, including those that span two
// segments, holds the ids of the concatenation.
TEST_F(TokenDataTest, SegmentsOfBothWidthsConcatenate) {
  std::vector<uint32_t> expected;
  std::vector<uint32_t> shard_ids;
  for (uint32_t i = 0; i < 300; ++i) shard_ids.push_back(i * 7 % 65536);
  std::string error;
  ASSERT_TRUE(WriteTokenShard(Path("a.tok"), shard_ids, 65536, &error)) << error;
  expected.insert(expected.end(), shard_ids.begin(), shard_ids.end());

  std::vector<char> bin(1024, 'h');
  for (uint32_t i = 0; i < 200; ++i) {
    Append<uint32_t>(&bin, 70000 + i);
    expected.push_back(70000 + i);
  }
  WriteBytes("b.bin", bin);

  std::vector<char> raw;
  for (uint16_t i = 0; i < 500; ++i) Append<uint16_t>(&raw, static_cast<uint16_t>(40000 + i));
  WriteBytes("c.bin", raw);
  for (uint32_t i = 123; i < 500; ++i) expected.push_back(40000 + i);  // the segment starts at id 123

  const std::string manifest = WriteManifest(
      Path("m.json"),
      {{Path("a.tok"), 24, 2, 300}, {Path("b.bin"), 1024, 4, 200}, {Path("c.bin"), 2 * 123, 2, 500 - 123}});
  const int64_t seq_len = 32;
  auto data = TokenData::Load(manifest, TokenSplit::kTrain, seq_len);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size(), static_cast<int64_t>(expected.size()));
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + seq_len + 1 <= data->size(); ++s) starts.push_back(s);
  const Batch b = data->Gather(starts);
  for (size_t row = 0; row < starts.size(); ++row) {
    for (int64_t t = 0; t < seq_len; ++t) {
      ASSERT_EQ(b.inputs[row][t].item<int64_t>(), expected[starts[row] + t]) << "start " << starts[row] << " t " << t;
      ASSERT_EQ(b.targets[row][t].item<int64_t>(), expected[starts[row] + t + 1]) << "start " << starts[row];
    }
  }
  // The window across the first boundary, spelled out.
  const Batch across = data->Gather({290});
  EXPECT_EQ(across.inputs[0][9].item<int64_t>(), 299 * 7);
  EXPECT_EQ(across.inputs[0][10].item<int64_t>(), 70000);
  // The val split of the same manifest is the same segments.
  auto val = TokenData::Load(manifest, TokenSplit::kVal, seq_len);
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_TRUE(val->Gather({480}).inputs.equal(data->Gather({480}).inputs));
}

TEST_F(TokenDataTest, MissingAndTruncatedFilesAreNamed) {
  std::vector<char> raw(2 * 1000, 0);
  WriteBytes("short.bin", raw);
  const std::string truncated = WriteManifest(Path("t.json"), {{Path("short.bin"), 0, 2, 1001}});
  auto data = TokenData::Load(truncated, TokenSplit::kTrain, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr(Path("short.bin")));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("truncated"));
  // An offset past the end is truncation too.
  data = TokenData::Load(WriteManifest(Path("o.json"), {{Path("short.bin"), 4000, 2, 1}}), TokenSplit::kTrain, 8);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("truncated"));
  // The exact size loads.
  EXPECT_TRUE(
      TokenData::Load(WriteManifest(Path("x.json"), {{Path("short.bin"), 0, 2, 1000}}), TokenSplit::kTrain, 8).ok());
  const std::string missing = WriteManifest(Path("m.json"), {{Path("gone.bin"), 0, 2, 1000}});
  data = TokenData::Load(missing, TokenSplit::kTrain, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr(Path("gone.bin")));
  // Only the split being loaded is opened: a missing val file does not stop the train split.
  const std::string val_missing =
      WriteManifest(Path("v.json"), {{Path("short.bin"), 0, 2, 1000}}, {{Path("gone.bin"), 0, 2, 1000}});
  EXPECT_TRUE(TokenData::Load(val_missing, TokenSplit::kTrain, 8).ok());
  EXPECT_FALSE(TokenData::Load(val_missing, TokenSplit::kVal, 8).ok());
}

// The layout of a shard is the list of blocks ShardRanges gives, less the blocks shorter than a window, and its
// random window numbering is the range-by-range walk TokenData used to make.
TEST(ShardLayoutTest, MatchesTheBlockList) {
  for (int64_t n : {int64_t{17}, int64_t{4200}, int64_t{10000}, int64_t{40961}, int64_t{65536 + 70}}) {
    for (int64_t k : {1, 2, 3, 7}) {
      for (bool contiguous : {false, true}) {
        for (int64_t i = 0; i < k; ++i) {
          const int64_t seq_len = 16;
          const int64_t block = contiguous ? (n + k - 1) / k : kShardBlockTokens;
          std::vector<TokenRange> usable;
          for (const TokenRange& r : ShardRanges(n, i, k, block)) {
            if (r.end - r.begin > seq_len) usable.push_back(r);
          }
          auto layout = MakeShardLayout(n, seq_len, i, k, contiguous);
          SCOPED_TRACE(testing::Message() << "n " << n << " k " << k << " i " << i << " contiguous " << contiguous);
          if (usable.empty()) {
            EXPECT_EQ(layout.status().code(), absl::StatusCode::kFailedPrecondition);
            continue;
          }
          ASSERT_TRUE(layout.ok()) << layout.status();
          ASSERT_EQ(layout->num_ranges(), static_cast<int64_t>(usable.size()));
          std::vector<int64_t> walk;  // the old numbering of random windows
          for (size_t j = 0; j < usable.size(); ++j) {
            EXPECT_EQ(layout->range(static_cast<int64_t>(j)).begin, usable[j].begin);
            EXPECT_EQ(layout->range(static_cast<int64_t>(j)).end, usable[j].end);
            for (int64_t s = usable[j].begin; s + seq_len < usable[j].end; ++s) walk.push_back(s);
          }
          ASSERT_EQ(layout->random_windows(), static_cast<int64_t>(walk.size()));
          for (size_t w = 0; w < walk.size(); w += 37) EXPECT_EQ(layout->RandomStart(static_cast<int64_t>(w)), walk[w]);
          EXPECT_EQ(layout->RandomStart(layout->random_windows() - 1), walk.back());
        }
      }
    }
  }
}

// Shards own disjoint tokens, every sequential window of a shard lies inside its ranges, an epoch reads every token
// the shard owns, and inputs overlap only in a range's last window (moved back to end at the range's end). Before,
// the last (block - 1) mod seq_len tokens of every block were never read.
TEST(ShardLayoutTest, ShardsAreDisjointAndSequentialWindowsStayInside) {
  const int64_t n = 3 * kShardBlockTokens + 1000, seq_len = 10;
  for (int64_t k : {1, 2, 3, 4}) {
    for (bool contiguous : {false, true}) {
      std::vector<int> owner(n, -1);
      std::vector<int> input_use(n, 0);
      for (int64_t i = 0; i < k; ++i) {
        auto layout = MakeShardLayout(n, seq_len, i, k, contiguous);
        ASSERT_TRUE(layout.ok()) << layout.status();
        for (int64_t j = 0; j < layout->num_ranges(); ++j) {
          const TokenRange r = layout->range(j);
          for (int64_t t = r.begin; t < r.end; ++t) {
            ASSERT_EQ(owner[t], -1) << "token " << t << " in shards " << owner[t] << " and " << i;
            owner[t] = static_cast<int>(i);
          }
        }
        std::vector<bool> read(n, false);
        for (int64_t w = 0; w < layout->sequential_windows(); ++w) {
          const int64_t s = layout->SequentialStart(w);
          ASSERT_GE(s, 0);
          ASSERT_LE(s + seq_len + 1, n);
          for (int64_t t = s; t <= s + seq_len; ++t) {
            ASSERT_EQ(owner[t], i) << "window at " << s << " leaves shard " << i;
            read[t] = true;
          }
          int64_t begin = -1, end = -1;  // the range the window is in
          for (int64_t j = 0; j < layout->num_ranges(); ++j) {
            if (layout->range(j).begin <= s && s < layout->range(j).end)
              begin = layout->range(j).begin, end = layout->range(j).end;
          }
          const bool moved_back = (s - begin) % seq_len != 0;
          if (moved_back) ASSERT_EQ(s + seq_len + 1, end) << "only a range's last window is moved back";
          for (int64_t t = s; t < s + seq_len; ++t) {
            if (input_use[t]++ > 0) ASSERT_TRUE(moved_back) << "inputs overlap at " << t;
          }
        }
        for (int64_t j = 0; j < layout->num_ranges(); ++j) {
          for (int64_t t = layout->range(j).begin; t < layout->range(j).end; ++t) ASSERT_TRUE(read[t]) << "token " << t;
        }
      }
    }
  }
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// A 512 MB split (a sparse file: 256M uint16 ids) loads, shards, samples and evaluates while the process's resident
// memory grows by no more than a few MB: nothing copies the corpus, only the touched pages are read.
TEST_F(TokenDataTest, LoadingALargeSplitDoesNotRaiseResidentMemory) {
  const uint64_t ids = uint64_t{256} << 20;
  const int fd = open(Path("big.bin").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(2 * ids)), 0);
  close(fd);
  const std::string manifest = WriteManifest(Path("big.json"), {{Path("big.bin"), 0, 2, ids}});
  {  // LibTorch's first allocations and the test's own code paths, before the measurement
    auto warm = TokenData::Load(WritePositions(1000), TokenSplit::kTrain, 64);
    ASSERT_TRUE(warm.ok());
    std::mt19937_64 rng(1);
    warm->Sample(8, rng);
  }
  const int64_t before = ResidentBytes();
  auto data = TokenData::Load(manifest, TokenSplit::kTrain, 64);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size(), static_cast<int64_t>(ids));
  ASSERT_TRUE(data->SelectShard(1, 3).ok());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(data->Sample(8, rng).inputs.sum().item<int64_t>(), 0);
  WindowSampler sequential(DataSampling::kSequential, data->layout(), 5);
  std::vector<int64_t> starts;
  for (int i = 0; i < 32; ++i) starts.push_back(sequential.Next().start);
  data->Gather(starts);
  data->EvalBatch(0, 2, 8);
  const int64_t grown = ResidentBytes() - before;
  RecordProperty("resident_growth_bytes", std::to_string(grown));
  EXPECT_LT(grown, int64_t{8} << 20) << "resident memory grew by " << grown << " bytes for a 512 MB split";
}

}  // namespace
}  // namespace diloco
