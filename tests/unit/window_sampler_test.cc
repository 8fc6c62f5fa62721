// The window orders (worker/data/window_sampler.h, worker/data/keyed_permutation.h): sequential epochs walk every
// window exactly once in a shuffled order that changes with the epoch and the seed; random draws are today's; a sampler
// restored from a saved state continues with the same draws, alone and inside InnerTrainer (worker/trainer.h).
#include "worker/data/window_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_coordinator_config.h"
#include "tests/unit/token_files.h"
#include "worker/data/keyed_permutation.h"
#include "worker/data/token_data.h"
#include "worker/trainer.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;

const std::vector<int64_t> kSizes = {1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 97, 128, 1000, 1024, 4099};

TEST(KeyedPermutationTest, IsAPermutationOfEverySize) {
  for (int64_t n : kSizes) {
    for (uint64_t key : {uint64_t{0}, uint64_t{1}, uint64_t{0xdeadbeef}}) {
      KeyedPermutation p(static_cast<uint64_t>(n), key);
      std::vector<int> hits(static_cast<size_t>(n), 0);
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t x = p(static_cast<uint64_t>(i));
        ASSERT_LT(x, static_cast<uint64_t>(n)) << "n " << n;
        ++hits[x];
      }
      EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), n) << "n " << n << " key " << key;
    }
  }
}

TEST(KeyedPermutationTest, KeysGiveDifferentOrdersAndShuffle) {
  const uint64_t n = 1000;
  KeyedPermutation a(n, 1), b(n, 2), a_again(n, 1);
  int same = 0, fixed = 0;
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(a(i), a_again(i));
    same += a(i) == b(i);
    fixed += a(i) == i;
  }
  EXPECT_LT(same, 20) << "two keys should agree on about one position in n";
  EXPECT_LT(fixed, 20) << "a shuffle leaves about one position in place";
}

// A split of n + 1 tokens with seq_len 1 has n sequential windows, starting at 0..n-1.
ShardLayout Windows(int64_t n) { return WholeSplitLayout(n + 1, 1); }

std::vector<int64_t> Epoch(WindowSampler& s, int64_t expected_epoch) {
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < s.windows_per_epoch(); ++i) {
    const WindowDraw d = s.Next();
    EXPECT_EQ(d.epoch, expected_epoch);
    starts.push_back(d.start);
  }
  return starts;
}

TEST(WindowSamplerTest, SequentialEpochsDrawEveryWindowOnce) {
  for (int64_t n : kSizes) {
    WindowSampler s(DataSampling::kSequential, Windows(n), 11);
    ASSERT_EQ(s.windows_per_epoch(), n);
    std::vector<std::vector<int64_t>> epochs;
    for (int64_t e = 0; e < 3; ++e) {
      epochs.push_back(Epoch(s, e));
      std::vector<int64_t> sorted = epochs.back();
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> all(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
      ASSERT_EQ(sorted, all) << "n " << n << " epoch " << e;
      EXPECT_DOUBLE_EQ(s.epochs(), static_cast<double>(e + 1));
    }
    if (n >= 8) {
      EXPECT_NE(epochs[0], epochs[1]) << "n " << n << ": each epoch is reshuffled";
      EXPECT_NE(epochs[1], epochs[2]) << "n " << n;
      WindowSampler other_seed(DataSampling::kSequential, Windows(n), 12);
      EXPECT_NE(Epoch(other_seed, 0), epochs[0]) << "n " << n << ": another seed, another order";
      std::vector<int64_t> in_order(epochs[0]);
      std::sort(in_order.begin(), in_order.end());
      EXPECT_NE(epochs[0], in_order) << "n " << n << ": shuffled";
    }
  }
}

TEST(WindowSamplerTest, SequentialDrawIsAFunctionOfSeedEpochAndPosition) {
  const ShardLayout layout = Windows(97);
  WindowSampler walked(DataSampling::kSequential, layout, 5);
  for (int i = 0; i < 97 + 40; ++i) walked.Next();  // epoch 1, position 40
  WindowSampler jumped(DataSampling::kSequential, layout, 5);
  ASSERT_TRUE(jumped.Restore({1, 40, ""}).ok());
  for (int i = 0; i < 200; ++i) {
    const WindowDraw a = walked.Next(), b = jumped.Next();
    ASSERT_EQ(a.epoch, b.epoch);
    ASSERT_EQ(a.start, b.start) << "draw " << i;
  }
  EXPECT_DOUBLE_EQ(walked.epochs(), 1 + 240.0 / 97);
}

TEST(WindowSamplerTest, SaveAfterThreeBatchesRestoreContinuesTheSameFour) {
  auto data_layout = MakeShardLayout(50000, 16, 1, 3, /*contiguous=*/false);
  ASSERT_TRUE(data_layout.ok());
  for (DataSampling kind : {DataSampling::kRandom, DataSampling::kSequential}) {
    const int batch = 8;
    WindowSampler original(kind, *data_layout, 99);
    std::vector<int64_t> first, after;
    for (int i = 0; i < 3 * batch; ++i) first.push_back(original.Next().start);
    const SamplerState saved = original.state();
    EXPECT_EQ(saved.position, 3 * batch);
    EXPECT_EQ(saved.rng.empty(), kind == DataSampling::kSequential);
    for (int i = 0; i < 4 * batch; ++i) after.push_back(original.Next().start);
    WindowSampler restored(kind, *data_layout, 99);
    ASSERT_TRUE(restored.Restore(saved).ok());
    for (int i = 0; i < 4 * batch; ++i) ASSERT_EQ(restored.Next().start, after[i]) << "draw " << i;
    WindowSampler fresh(kind, *data_layout, 99);  // and without the restore it would have repeated the first three
    EXPECT_EQ(fresh.Next().start, first[0]);
    EXPECT_NE(first[0], after[0]);
  }
}

TEST(WindowSamplerTest, RestoreRejectsStatesThatDoNotFit) {
  const ShardLayout layout = Windows(50);
  WindowSampler sequential(DataSampling::kSequential, layout, 1);
  absl::Status s = sequential.Restore({0, 51, ""});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("51"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("50 windows"));
  EXPECT_TRUE(sequential.Restore({2, 50, ""}).ok()) << "a finished epoch";
  EXPECT_EQ(sequential.state().epoch, 3);
  EXPECT_EQ(sequential.state().position, 0);
  WindowSampler random(DataSampling::kRandom, layout, 1);
  EXPECT_THAT(std::string(sequential.Restore(random.state()).message()), HasSubstr("random"));
  EXPECT_THAT(std::string(random.Restore({0, 3, ""}).message()), HasSubstr("sequential"));
  EXPECT_FALSE(random.Restore({0, 3, "not a generator"}).ok());
}

// Random sampling's draws are the ones TokenData::Sample makes with the same generator, and those are the draws of
// the range-by-range walk over the shard's blocks that TokenData made before the shard layout.
TEST(WindowSamplerTest, RandomDrawsAreTodays) {
  const int64_t n = 30000, seq_len = 16, seed = 4242;
  std::vector<int64_t> walk;
  for (const TokenRange& r : ShardRanges(n, 2, 3, kShardBlockTokens)) {
    for (int64_t s = r.begin; s + seq_len < r.end; ++s) walk.push_back(s);
  }
  auto layout = MakeShardLayout(n, seq_len, 2, 3, false);
  ASSERT_TRUE(layout.ok());
  WindowSampler sampler(DataSampling::kRandom, *layout, seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 500; ++i) {
    std::uniform_int_distribution<int64_t> pick(0, static_cast<int64_t>(walk.size()) - 1);
    const WindowDraw d = sampler.Next();
    ASSERT_EQ(d.start, walk[pick(rng)]) << "draw " << i;
    EXPECT_EQ(d.epoch, 0);
  }
  EXPECT_DOUBLE_EQ(sampler.epochs(), 500.0 / static_cast<double>(layout->sequential_windows()));
}

// InnerTrainer owns the sampler: the same save/restore through its API, with the windows seen by the observer.
class TrainerSamplerTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_ = TinyCoordinatorConfig(dir_);
    config_.run.seed = 3;
    std::vector<uint32_t> ids(20000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7 + i / 5) % 64);
    std::string error;
    ASSERT_TRUE(WriteTokenShard(Path("t.tok"), ids, 64, &error)) << error;
    manifest_ = WriteManifest(Path("m.json"), {{Path("t.tok"), 24, 2, ids.size()}});
  }
  std::unique_ptr<InnerTrainer> Trainer(std::vector<WindowDraw>* seen, int shard_reader = 0) {
    auto t = InnerTrainer::ForShard(config_, manifest_, 1, 2, 0, 1, nullptr, {}, shard_reader);
    EXPECT_TRUE(t.ok()) << t.status();
    (*t)->set_window_observer([seen](const WindowDraw& d) { seen->push_back(d); });
    return std::move(*t);
  }
  Config config_;
  std::string manifest_;
};

TEST_F(TrainerSamplerTest, RestoredTrainerDrawsTheSameNextBatches) {
  for (DataSampling kind : {DataSampling::kRandom, DataSampling::kSequential}) {
    config_.data.sampling = kind;
    std::vector<WindowDraw> a, b;
    auto original = Trainer(&a);
    original->TrainSteps(0, 3);
    const SamplerState saved = original->sampler_state();
    original->TrainSteps(3, 4);
    ASSERT_EQ(a.size(), 7u * config_.inner.batch_size);
    auto restored = Trainer(&b);
    ASSERT_TRUE(restored->RestoreSampler(saved).ok());
    restored->TrainSteps(3, 4);
    ASSERT_EQ(b.size(), 4u * config_.inner.batch_size);
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(b[i].start, a[3 * config_.inner.batch_size + i].start) << "window " << i;
      EXPECT_EQ(b[i].epoch, a[3 * config_.inner.batch_size + i].epoch);
    }
    EXPECT_DOUBLE_EQ(restored->epochs(), original->epochs());
    EXPECT_GT(original->epochs(), 0);
  }
}

// The trainer's random stream is the one it drew before the sampler existed: std::mt19937_64 seeded with
// run.seed x 1000003 + part + 1, one uniform window number per row.
TEST_F(TrainerSamplerTest, RandomTrainerKeepsItsSeededStream) {
  std::vector<WindowDraw> seen;
  auto trainer = Trainer(&seen);
  trainer->TrainSteps(0, 2);
  auto data = TokenData::Load(manifest_, TokenSplit::kTrain, config_.model.seq_len);
  ASSERT_TRUE(data.ok());
  ASSERT_TRUE(data->SelectShard(1, 2).ok());
  std::mt19937_64 rng(3 * 1000003ULL + 1 + 1);
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i].start, DrawRandomStart(data->layout(), rng)) << i;
  ASSERT_EQ(seen.size(), 2u * config_.inner.batch_size);
}

// Members that share a shard (more members than workers.count) have distinct JoinReply.shard_reader numbers: each
// reader draws its own windows (sequential: its own order of the same epoch's windows), reader 0 the stream above.
TEST_F(TrainerSamplerTest, ReadersOfASharedShardDrawDifferentWindows) {
  for (DataSampling kind : {DataSampling::kRandom, DataSampling::kSequential}) {
    config_.data.sampling = kind;
    std::vector<WindowDraw> first, again, second;
    Trainer(&first)->TrainSteps(0, 2);
    Trainer(&again, 0)->TrainSteps(0, 2);
    Trainer(&second, 1)->TrainSteps(0, 2);
    ASSERT_EQ(first.size(), 2u * config_.inner.batch_size);
    ASSERT_EQ(second.size(), first.size());
    int same = 0;
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(again[i].start, first[i].start) << "reader 0 is the unshared stream";
      same += second[i].start == first[i].start ? 1 : 0;
    }
    EXPECT_LE(same, 1) << "reader 1 draws other windows (" << same << " of " << first.size() << " alike)";
  }
}

TEST_F(TrainerSamplerTest, SequentialEpochsCount) {
  config_.data.sampling = DataSampling::kSequential;
  std::vector<WindowDraw> seen;
  auto trainer = Trainer(&seen);
  auto data = TokenData::Load(manifest_, TokenSplit::kTrain, config_.model.seq_len);
  ASSERT_TRUE(data.ok());
  ASSERT_TRUE(data->SelectShard(1, 2).ok());
  const int64_t per_epoch = data->layout().sequential_windows();
  EXPECT_EQ(per_epoch, 2 * 256) << "shard 1 of 2 owns blocks 1 and 3 of 4096 tokens: 255 windows every 16 tokens "
                                   "and one ending at the block's end, each";
  trainer->TrainSteps(0, 5);
  EXPECT_DOUBLE_EQ(trainer->epochs(), 5.0 * config_.inner.batch_size / static_cast<double>(per_epoch));
  std::set<int64_t> distinct;
  for (const WindowDraw& d : seen) distinct.insert(d.start);
  EXPECT_EQ(distinct.size(), seen.size()) << "no window twice within an epoch";
  EXPECT_FALSE(trainer->RestoreSampler({0, per_epoch + 1, ""}).ok());
  EXPECT_DOUBLE_EQ(trainer->epochs(), 5.0 * config_.inner.batch_size / static_cast<double>(per_epoch))
      << "a failed restore changes nothing";
}

}  // namespace
}  // namespace diloco
