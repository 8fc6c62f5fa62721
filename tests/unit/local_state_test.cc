// A worker's local state (worker/local_state.h) through its own API: what Save wrote after a push is resumed into a
// new trainer of the same identity (AdamW moments and step count; the data position of the per-step journal, newer
// than the state when the kill came mid-round), a state of another identity is ignored (a cold start), a position
// of other data windows (model.seq_len) is not resumed; a sharded cluster rank's slice of the moments round-trips
// through its own files, the ranks resume the newest round every rank saved, and a state of another sharding layout
// or cluster size is not resumed.
#include "worker/local_state.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_coordinator_config.h"
#include "tests/unit/token_files.h"
#include "worker/trainer.h"

namespace diloco {
namespace {

class LocalStateTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_ = TinyCoordinatorConfig(dir_);
    config_.workers.resume = true;
    config_.data.sampling = DataSampling::kSequential;
    std::vector<uint32_t> ids(20000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7 + i / 5) % 64);
    std::string error;
    ASSERT_TRUE(WriteTokenShard(Path("t.tok"), ids, 64, &error)) << error;
    manifest_ = WriteManifest(Path("m.json"), {{Path("t.tok"), 24, 2, ids.size()}});
  }
  std::unique_ptr<InnerTrainer> Trainer() {
    auto t = InnerTrainer::ForShard(config_, manifest_, 0, 1, 0, 1);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(*t);
  }
  StateIdentity Identity(int64_t seed = 3) const { return {"w0", "fp", seed, "data", 0, 1, "sequential"}; }

  Config config_;
  std::string manifest_;
};

TEST_F(LocalStateTest, ResumesMomentsAndTheJournalsDataPosition) {
  auto before = Trainer();
  SamplerState at_kill;
  torch::Tensor saved_moments;
  {
    LocalState state(config_, *before, Identity(), 1);
    before->TrainSteps(0, 3);
    state.Save(1);
    saved_moments = before->optimizer().exp_avg().clone();
    before->TrainSteps(3, 2);  // the round a kill cuts short: only the journal has these windows
    at_kill = before->sampler_state();
  }
  ASSERT_GT(at_kill.position, 0);
  auto after = Trainer();
  LocalState resumed(config_, *after, Identity(), 1);
  EXPECT_EQ(after->optimizer().steps(), 3);
  EXPECT_TRUE(torch::equal(after->optimizer().exp_avg(), saved_moments));
  EXPECT_EQ(after->sampler_state().epoch, at_kill.epoch);
  EXPECT_EQ(after->sampler_state().position, at_kill.position);

  auto other = Trainer();
  LocalState cold(config_, *other, Identity(/*seed=*/4), 1);
  EXPECT_EQ(other->optimizer().steps(), 0);
  EXPECT_EQ(other->sampler_state().position, 0);
}

// A worker restarted with another model.seq_len (or data.split) resumes its AdamW moments but not its data position:
// the saved window count would name other tokens under the new windows. Before, the position was restored as a
// count of the new windows, silently skipping or repeating data.
TEST_F(LocalStateTest, AnotherSeqLenResumesTheMomentsButNotTheDataPosition) {
  config_.model.arch = ModelArch::kGpt2;  // its position table (max_positions rows) does not follow seq_len
  config_.model.max_positions = 16;
  auto before = Trainer();
  StateIdentity identity = Identity();
  identity.windows = WindowsOf(config_.model.seq_len, "iid");
  {
    LocalState state(config_, *before, identity, 1);
    before->TrainSteps(0, 3);
    state.Save(1);
  }
  ASSERT_GT(before->sampler_state().position, 0);
  config_.model.seq_len /= 2;
  auto after = Trainer();
  identity.windows = WindowsOf(config_.model.seq_len, "iid");
  LocalState resumed(config_, *after, identity, 1);
  EXPECT_EQ(after->optimizer().steps(), 3) << "the moments are resumed";
  EXPECT_EQ(after->sampler_state().epoch, 0);
  EXPECT_EQ(after->sampler_state().position, 0) << "the data stream starts over";
}

// Rank `rank` of a 2-rank cluster with workers.sharding `sharding`: the trainer holds that rank's slice of the moments.
class ClusterRankStateTest : public LocalStateTest {
 protected:
  std::unique_ptr<InnerTrainer> RankTrainer(int rank, int ranks, Sharding sharding) {
    config_.workers.sharding = sharding;
    config_.comm.chunk_bytes = 4096;  // slices of 1024-element multiples: both ranks own parameters of the tiny model
    auto t = InnerTrainer::ForShard(config_, manifest_, 0, 1, rank, ranks, nullptr, ShardOf(config_, rank, ranks));
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(*t);
  }
  static StateIdentity RankIdentity(InnerTrainer& trainer, int rank, int ranks) {
    return {"c", "fp", 3, "data", 0, 1, "sequential", rank, ranks, SliceLayoutOf(trainer.optimizer())};
  }
  // A ShareWithRanks that answers with `others` for the other ranks and records this rank's line.
  ShareWithRanks Share(int rank, std::vector<std::string> lines) {
    return [this, rank, lines](const std::string& topic, const std::string& mine) {
      EXPECT_EQ(topic, "resume_marks");
      shared_ = mine;
      std::vector<std::string> all = lines;
      all[static_cast<size_t>(rank)] = mine;
      return all;
    };
  }
  // Gives the trainer's optimizer moments of its own size, seeded by `seed`, at AdamW step `steps`.
  static torch::Tensor SetMoments(InnerTrainer& trainer, int64_t steps, int seed) {
    torch::manual_seed(seed);
    FlatAdamW& adam = trainer.optimizer();
    torch::Tensor m = torch::randn({adam.exp_avg().numel()});
    adam.RestoreState(steps, m, m.square());
    return m;
  }
  std::string shared_;
};

TEST_F(ClusterRankStateTest, ARanksShardedStateRoundTripsAndKeepsThePreviousOne) {
  auto before = RankTrainer(1, 2, Sharding::kGradients);
  const int64_t slice = before->optimizer().exp_avg().numel();
  ASSERT_LT(slice, before->optimizer().flat_parameters().numel()) << "the rank holds a slice of the moments";
  ASSERT_TRUE(before->optimizer().sharded());
  torch::Tensor round1, round2;
  {
    LocalState state(config_, *before, RankIdentity(*before, 1, 2), 1, Share(1, {"", ""}));
    round1 = SetMoments(*before, 40, 1);
    state.Save(1);
    round2 = SetMoments(*before, 80, 2);
    state.Save(2);
  }
  const std::string dir = config_.WorkerStateDir();
  EXPECT_FALSE(std::filesystem::exists(StatePath(dir, "c"))) << "a rank's files carry its rank";
  absl::StatusOr<WorkerState> current = LoadWorkerState(StatePath(dir, "c.rank-1"));
  absl::StatusOr<WorkerState> previous = LoadWorkerState(PreviousStatePath(dir, "c.rank-1"));
  ASSERT_TRUE(current.ok() && previous.ok()) << current.status() << previous.status();
  EXPECT_EQ(current->round, 2);
  EXPECT_EQ(previous->round, 1);
  EXPECT_EQ(current->identity.cluster_rank, 1);
  EXPECT_EQ(current->identity.cluster_size, 2);
  EXPECT_EQ(current->exp_avg.numel(), slice);
  EXPECT_EQ(current->identity.slice_layout.rfind("gradients ", 0), 0u) << current->identity.slice_layout;

  // Every rank saved round 2: the newest state is resumed (step, moments bit for bit).
  auto after = RankTrainer(1, 2, Sharding::kGradients);
  LocalState resumed(config_, *after, RankIdentity(*after, 1, 2), 1, Share(1, {"2@80,1@40", ""}));
  EXPECT_EQ(shared_, "2@80,1@40");
  EXPECT_EQ(after->optimizer().steps(), 80);
  EXPECT_TRUE(torch::equal(after->optimizer().exp_avg(), round2));
  EXPECT_TRUE(torch::equal(after->optimizer().exp_avg_sq(), round2.square()));
}

TEST_F(ClusterRankStateTest, RanksResumeTheNewestRoundThatEveryRankSaved) {
  auto before = RankTrainer(1, 2, Sharding::kOptimizer);
  torch::Tensor round1;
  {
    LocalState state(config_, *before, RankIdentity(*before, 1, 2), 1, Share(1, {"", ""}));
    round1 = SetMoments(*before, 40, 1);
    state.Save(1);
    SetMoments(*before, 80, 2);
    state.Save(2);
  }
  // Rank 0 was killed before it wrote round 2: both resume round 1 (this rank from its previous state).
  auto after = RankTrainer(1, 2, Sharding::kOptimizer);
  LocalState resumed(config_, *after, RankIdentity(*after, 1, 2), 1, Share(1, {"1@40,0@0", ""}));
  EXPECT_EQ(after->optimizer().steps(), 40);
  EXPECT_TRUE(torch::equal(after->optimizer().exp_avg(), round1));
  // Rank 0 saved round 2 again at a later step (its coordinator went back a round) and kept its first save of round 2
  // as its previous state: both resume that first save, the one state of round 2 they share.
  auto again = RankTrainer(1, 2, Sharding::kOptimizer);
  LocalState shared(config_, *again, RankIdentity(*again, 1, 2), 1, Share(1, {"2@120,2@80", ""}));
  EXPECT_EQ(again->optimizer().steps(), 80);
  // And when rank 0's round-2 saves are both of other steps, round 1 is the newest they share.
  auto other = RankTrainer(1, 2, Sharding::kOptimizer);
  LocalState older(config_, *other, RankIdentity(*other, 1, 2), 1, Share(1, {"2@120,1@40", ""}));
  EXPECT_EQ(other->optimizer().steps(), 40);
  EXPECT_TRUE(torch::equal(other->optimizer().exp_avg(), round1));
  // Rank 0 has no state at all: no rank resumes moments.
  auto fresh = RankTrainer(1, 2, Sharding::kOptimizer);
  LocalState cold(config_, *fresh, RankIdentity(*fresh, 1, 2), 1, Share(1, {"", ""}));
  EXPECT_EQ(fresh->optimizer().steps(), 0);
  EXPECT_EQ(fresh->optimizer().exp_avg().abs().sum().item<float>(), 0.0f);
}

TEST_F(ClusterRankStateTest, AStateOfAnotherShardingOrClusterSizeIsNotResumed) {
  auto before = RankTrainer(1, 2, Sharding::kGradients);
  {
    LocalState state(config_, *before, RankIdentity(*before, 1, 2), 1, Share(1, {"", ""}));
    SetMoments(*before, 40, 1);
    state.Save(1);
  }
  // workers.sharding optimizer: the same slice size, another layout; the rank offers no round and starts fresh.
  auto other = RankTrainer(1, 2, Sharding::kOptimizer);
  StateIdentity identity = RankIdentity(*other, 1, 2);
  ASSERT_NE(identity.slice_layout, RankIdentity(*before, 1, 2).slice_layout);
  LocalState refused(config_, *other, identity, 1, Share(1, {"1@40", ""}));
  EXPECT_EQ(shared_, "");
  EXPECT_EQ(other->optimizer().steps(), 0);
  // The saved rank's identity names what differs.
  absl::StatusOr<WorkerState> saved = LoadWorkerState(StatePath(config_.WorkerStateDir(), "c.rank-1"));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_NE(WhyNotResume(saved->identity, identity).find("workers.sharding slice layout differs (saved gradients "),
            std::string::npos)
      << WhyNotResume(saved->identity, identity);
  StateIdentity three = RankIdentity(*before, 1, 3);
  EXPECT_EQ(WhyNotResume(saved->identity, three), "cluster rank differs (saved 1 of 2, this run 1 of 3)");
}

}  // namespace
}  // namespace diloco
