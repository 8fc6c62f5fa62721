// The worker's local state (worker/worker_state.h): an optimizer restored from a saved file continues exactly as the
// one that never stopped (moments and bias correction), the identity check names what differs, and damaged or
// foreign files are refused with the path.
#include "worker/worker_state.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "tests/unit/scratch_dir_test.h"
#include "worker/flat_adamw.h"

namespace diloco {
namespace {

class WorkerStateTest : public ScratchDirTest {};

StateIdentity Identity() { return {"w1", "fp-abc", 7, "tok-0123", 1, 4, "sequential"}; }

// Three parameters, gradients from a fixed quadratic loss per step.
struct Problem {
  std::vector<torch::Tensor> params;
  Problem() {
    torch::manual_seed(11);
    params = {torch::randn({8, 5}), torch::randn({5}), torch::randn({3, 3})};
    for (auto& p : params) p.requires_grad_(true);
  }
  void Backward(int step) {
    torch::Tensor loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i) {
      loss = loss + ((params[i] - 0.1 * (step + 1) * static_cast<double>(i)) * params[i]).pow(2).sum();
    }
    loss.backward();
  }
};

AdamWSettings Settings() {
  AdamWSettings s;
  s.beta2 = 0.95;
  s.weight_decay = 0.1;
  return s;
}

TEST_F(WorkerStateTest, RestoredOptimizerContinuesExactlyAsTheUninterruptedOne) {
  Problem straight, first_half;
  FlatAdamW a(straight.params, Settings());
  for (int step = 0; step < 6; ++step) {
    a.ZeroGrad();
    straight.Backward(step);
    a.Step(1e-2);
  }

  FlatAdamW b(first_half.params, Settings());
  for (int step = 0; step < 3; ++step) {
    b.ZeroGrad();
    first_half.Backward(step);
    b.Step(1e-2);
  }
  WorkerState saved{Identity(), 2, b.steps(), {0, 96, ""}, b.exp_avg(), b.exp_avg_sq()};
  ASSERT_TRUE(SaveWorkerState(Path("w1.state"), saved).ok());

  // A new process: the parameters come back from the coordinator's pull, the moments from the file.
  Problem resumed;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < resumed.params.size(); ++i) resumed.params[i].copy_(first_half.params[i]);
  }
  FlatAdamW c(resumed.params, Settings());
  absl::StatusOr<WorkerState> loaded = LoadWorkerState(Path("w1.state"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(WhyNotResume(loaded->identity, Identity()), "");
  EXPECT_EQ(loaded->round, 2);
  EXPECT_EQ(loaded->adam_steps, 3);
  EXPECT_EQ(loaded->sampler.position, 96);
  c.RestoreState(loaded->adam_steps, loaded->exp_avg, loaded->exp_avg_sq);
  for (int step = 3; step < 6; ++step) {
    c.ZeroGrad();
    resumed.Backward(step);
    c.Step(1e-2);
  }
  EXPECT_EQ(c.steps(), 6);
  for (size_t i = 0; i < straight.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(resumed.params[i], straight.params[i])) << "parameter " << i;
  }

  // Without the moments (a cold start) the same three steps land elsewhere: the check above can fail.
  Problem cold;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < cold.params.size(); ++i) cold.params[i].copy_(first_half.params[i]);
  }
  FlatAdamW d(cold.params, Settings());
  for (int step = 3; step < 6; ++step) {
    d.ZeroGrad();
    cold.Backward(step);
    d.Step(1e-2);
  }
  EXPECT_FALSE(torch::allclose(cold.params[0], straight.params[0], 1e-4, 1e-5));
}

TEST_F(WorkerStateTest, RestoreRefusesMomentsOfAnotherSize) {
  Problem p;
  FlatAdamW adam(p.params, Settings());
  EXPECT_THROW(adam.RestoreState(3, torch::zeros({10}), torch::zeros({10})), std::invalid_argument);
}

TEST_F(WorkerStateTest, IdentityMismatchNamesTheKeyAndBothValues) {
  StateIdentity other = Identity();
  other.fingerprint = "fp-xyz";
  EXPECT_EQ(WhyNotResume(other, Identity()), "model fingerprint differs (saved fp-xyz, this run fp-abc)");
  other = Identity();
  other.seed = 8;
  EXPECT_EQ(WhyNotResume(other, Identity()), "run.seed differs (saved 8, this run 7)");
  other = Identity();
  other.shard_count = 2;
  EXPECT_EQ(WhyNotResume(other, Identity()), "data shard differs (saved 1 of 2, this run 1 of 4)");
  other = Identity();
  other.data = "tok-ffff";
  EXPECT_NE(WhyNotResume(other, Identity()).find("token data differs"), std::string::npos);
  other = Identity();
  other.sampling = "random";
  EXPECT_NE(WhyNotResume(other, Identity()).find("data.sampling"), std::string::npos);
}

TEST_F(WorkerStateTest, DamagedAndForeignFilesAreRefusedWithThePath) {
  EXPECT_TRUE(absl::IsNotFound(LoadWorkerState(Path("none.state")).status()));
  torch::Tensor m = torch::ones({4});
  ASSERT_TRUE(SaveWorkerState(Path("w.state"), {Identity(), 1, 1, {}, m, m}).ok());
  std::filesystem::resize_file(Path("w.state"), std::filesystem::file_size(Path("w.state")) - 3);
  absl::StatusOr<WorkerState> truncated = LoadWorkerState(Path("w.state"));
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find(Path("w.state")), std::string::npos) << truncated.status();
  std::ofstream(Path("junk.state")) << "not a state";
  EXPECT_FALSE(LoadWorkerState(Path("junk.state")).ok());
}

TEST_F(WorkerStateTest, ClusterRanksAgreeOnTheNewestSaveEveryRankHas) {
  ResumeAgreement a = AgreeOnResumeRound({{{3, 30}, {2, 20}}, {{2, 20}, {1, 10}}, {{3, 30}, {2, 20}}});
  ASSERT_TRUE(a.mark.has_value());
  EXPECT_EQ(a.mark->round, 2);
  EXPECT_EQ(a.mark->adam_steps, 20);
  EXPECT_EQ(a.reason,
            "round 2 at AdamW step 20, the newest save that every rank has (rank 0: 3@30,2@20; rank 1: 2@20,1@10; "
            "rank 2: 3@30,2@20)");
  a = AgreeOnResumeRound({{{5, 50}, {4, 40}}, {{5, 50}, {4, 40}}});
  EXPECT_EQ(a.mark->round, 5);
  a = AgreeOnResumeRound({{{3, 30}}, {}});
  EXPECT_FALSE(a.mark.has_value());
  EXPECT_EQ(a.reason, "no save that every rank has (rank 0: 3@30; rank 1: none)");
  EXPECT_FALSE(AgreeOnResumeRound({{{4, 40}}, {{3, 30}}}).mark.has_value());
  // A round saved twice (the coordinator went back a round, the cluster trained it again) and a kill between the
  // ranks' second writes: rank 0 has the new save of round 3 and the old one, rank 1 the old one and round 2. The
  // round number alone is on both; only the old save of round 3 is the same state on both.
  a = AgreeOnResumeRound({{{3, 50}, {3, 30}}, {{3, 30}, {2, 20}}});
  ASSERT_TRUE(a.mark.has_value());
  EXPECT_EQ(a.mark->adam_steps, 30);
  a = AgreeOnResumeRound({{{3, 50}, {2, 20}}, {{3, 30}, {2, 20}}});
  ASSERT_TRUE(a.mark.has_value());
  EXPECT_EQ(a.mark->round, 2) << "round 3 at two steps is two saves: neither is on both ranks";
  EXPECT_EQ(MarkText({7, 700}), "7@700");
  EXPECT_EQ(ParseMark("7@700")->adam_steps, 700);
  EXPECT_FALSE(ParseMark("7").has_value());
  EXPECT_FALSE(ParseMark("x@1").has_value());
}

TEST_F(WorkerStateTest, ClusterKeysRoundTripAndStateKeysNameTheRank) {
  StateIdentity id = Identity();
  id.cluster_rank = 2;
  id.cluster_size = 4;
  id.slice_layout = SliceLayout(1000, true, true, 4, 256);
  EXPECT_EQ(id.slice_layout, "gradients 1000 in 4 slices of 256");
  EXPECT_EQ(SliceLayout(1000, false, false, 1, 1000), "none");
  torch::Tensor m = torch::arange(8, torch::kFloat);
  ASSERT_TRUE(SaveWorkerState(Path("r.state"), {id, 3, 30, {}, m, m}).ok());
  absl::StatusOr<WorkerState> back = LoadWorkerState(Path("r.state"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(WhyNotResume(back->identity, id), "");
  EXPECT_EQ(back->identity.cluster_rank, 2);
  EXPECT_EQ(back->identity.slice_layout, "gradients 1000 in 4 slices of 256");
  EXPECT_FALSE(back->slice_residual.defined()) << "no slice residual saved, none loaded";
  // comm.cluster_parts: the rank's slice of the error-feedback residual travels with the state.
  WorkerState with_residual{id, 4, 40, {}, m, m};
  with_residual.slice_residual = torch::linspace(-1, 1, 5);
  ASSERT_TRUE(SaveWorkerState(Path("r.state"), with_residual).ok());
  back = LoadWorkerState(Path("r.state"));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->slice_residual.defined());
  EXPECT_TRUE(back->slice_residual.equal(with_residual.slice_residual));
  EXPECT_TRUE(back->error_feedback.empty()) << "the slice residual is not a fragment's";
  EXPECT_EQ(StateKey("w1", 0, 1), "w1");
  EXPECT_EQ(StateKey("w1", 1, 2), "w1.rank-1");
  EXPECT_EQ(PreviousStatePath("d", "w1.rank-1"), "d/w1.rank-1.state.prev");
}

TEST_F(WorkerStateTest, PositionJournalRoundTrips) {
  SamplerState s{2, 1234, "rng-text 1 2 3"};
  ASSERT_TRUE(SavePosition(Path("w1.position"), Identity(), s).ok());
  auto back = LoadPosition(Path("w1.position"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(WhyNotResume(back->first, Identity()), "");
  EXPECT_EQ(back->second.epoch, 2);
  EXPECT_EQ(back->second.position, 1234);
  EXPECT_EQ(back->second.rng, "rng-text 1 2 3");
}

// The windows a data position counts travel with the state and the journal; a file that does not record them (saved
// before they were) resumes its position as before.
TEST_F(WorkerStateTest, TheDataWindowsRoundTripAndOnlyTheirChangeStopsThePosition) {
  StateIdentity id = Identity();
  id.windows = WindowsOf(64, "iid");
  EXPECT_EQ(id.windows, "seq_len 64, data.split iid");
  torch::Tensor m = torch::arange(8, torch::kFloat);
  ASSERT_TRUE(SaveWorkerState(Path("w.state"), {id, 3, 30, {}, m, m}).ok());
  absl::StatusOr<WorkerState> back = LoadWorkerState(Path("w.state"));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->identity.windows, "seq_len 64, data.split iid");
  ASSERT_TRUE(SavePosition(Path("w.position"), id, {0, 12, ""}).ok());
  auto journal = LoadPosition(Path("w.position"));
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ(journal->first.windows, "seq_len 64, data.split iid");

  StateIdentity shorter = id;
  shorter.windows = WindowsOf(32, "iid");
  EXPECT_EQ(WhyNotResume(back->identity, shorter), "") << "the moments still fit";
  EXPECT_EQ(WhyNotResumePosition(back->identity, shorter),
            "the data windows differ (saved seq_len 64, data.split iid, this run seq_len 32, data.split iid)");
  EXPECT_EQ(WhyNotResumePosition(back->identity, id), "");
  StateIdentity unrecorded = id;
  unrecorded.windows = "";
  ASSERT_TRUE(SavePosition(Path("old.position"), unrecorded, {0, 12, ""}).ok());
  journal = LoadPosition(Path("old.position"));
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ(journal->first.windows, "");
  EXPECT_EQ(WhyNotResumePosition(journal->first, shorter), "");
}

}  // namespace
}  // namespace diloco
