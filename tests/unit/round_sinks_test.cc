// The round sinks (coordinator/round_sink.h, round_sinks.h): RoundSinks calls its sinks in order, a start-up
// error stops it and a sink that throws on a committed round does not stop the others; the evaluation sink evaluates
// theta_0 once and then every eval_every rounds and the last, with the run's totals, and refuses a non-finite loss;
// the checkpoint writer writes when due and on request, what ThetaStore::ReadSteady shows plus the evals, and turns
// what throws into the write's error; the replay log writes theta_0 at start (not when resumed) and each round's
// delta.
#include "coordinator/round_sinks.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "coordinator/replay_log.h"
#include "tests/unit/scratch_dir_test.h"

namespace diloco {
namespace {

class RecordingSink : public RoundSink {
 public:
  RecordingSink(std::string name, std::vector<std::string>* calls, absl::Status start = absl::OkStatus())
      : name_(std::move(name)), calls_(calls), start_(std::move(start)) {}
  absl::Status OnStart(const ClosedRound&) override {
    calls_->push_back(name_ + ".start");
    return start_;
  }
  void OnStepped(const ClosedRound&) override { calls_->push_back(name_ + ".stepped"); }
  void OnCommitted(const ClosedRound&) override { calls_->push_back(name_ + ".committed"); }
  void OnRunComplete() override { calls_->push_back(name_ + ".complete"); }

 private:
  std::string name_;
  std::vector<std::string>* calls_;
  absl::Status start_;
};

class CountingEvaluator : public Evaluator {
 public:
  explicit CountingEvaluator(int* calls) : calls_(calls) {}
  double Evaluate(const NamedTensors& theta) override {
    ++*calls_;
    return theta[0].second.sum().item<double>();
  }

 private:
  int* calls_;
};

std::shared_ptr<ParamSnapshot> Theta(int64_t round, bool complete = false) {
  auto theta = std::make_shared<ParamSnapshot>();
  theta->round = round;
  theta->complete = complete;
  theta->params.emplace_back("w", at::full({3}, 1.0f));
  return theta;
}

ClosedRound Closed(std::shared_ptr<const ParamSnapshot> theta, int64_t tokens = 0) {
  ClosedRound round;
  round.theta = std::move(theta);
  round.tokens_committed = tokens;
  return round;
}

TEST(RoundSinksTest, CallsSinksInOrderAndStopsAtAStartError) {
  std::vector<std::string> calls;
  RoundSinks sinks;
  sinks.Add(std::make_unique<RecordingSink>("a", &calls));
  sinks.Add(std::make_unique<RecordingSink>("b", &calls, absl::InternalError("no disk")));
  sinks.Add(std::make_unique<RecordingSink>("c", &calls));
  const ClosedRound round = Closed(Theta(1));
  EXPECT_EQ(sinks.OnStart(round).code(), absl::StatusCode::kInternal);
  sinks.OnStepped(round);
  sinks.OnCommitted(round);
  sinks.OnRunComplete();
  EXPECT_EQ(calls, (std::vector<std::string>{"a.start", "b.start", "a.stepped", "b.stepped", "c.stepped", "a.committed",
                                             "b.committed", "c.committed", "a.complete", "b.complete", "c.complete"}));
}

class ThrowingSink : public RoundSink {
 public:
  void OnCommitted(const ClosedRound&) override { throw std::runtime_error("the log sink's disk is gone"); }
  void OnRunComplete() override { throw std::runtime_error("no memory for the summary"); }
};

// A committed round stays committed: a sink that throws is logged, and the sinks after it (the last round's
// checkpoint writer, summary.json) still run. Before, the exception left RoundSinks and the core never set the run
// complete, so the last round's pulls were refused "being checkpointed" for ever.
TEST(RoundSinksTest, ASinkThatThrowsOnACommittedRoundLeavesTheSinksAfterItTheirTurn) {
  std::vector<std::string> calls;
  RoundSinks sinks;
  sinks.Add(std::make_unique<RecordingSink>("a", &calls));
  sinks.Add(std::make_unique<ThrowingSink>());
  sinks.Add(std::make_unique<RecordingSink>("c", &calls));
  const ClosedRound round = Closed(Theta(3, /*complete=*/true));
  EXPECT_NO_THROW(sinks.OnCommitted(round));
  EXPECT_NO_THROW(sinks.OnRunComplete());
  EXPECT_EQ(calls, (std::vector<std::string>{"a.committed", "c.committed", "a.complete", "c.complete"}));
}

TEST(RoundSinksTest, EvaluatesThetaZeroOnceThenEveryNRoundsAndTheLast) {
  int calls = 0;
  auto history = std::make_shared<EvalHistory>(std::vector<EvalRecord>{});
  EvaluationSink sink(3, std::make_unique<CountingEvaluator>(&calls), history);
  ASSERT_TRUE(sink.OnStart(Closed(Theta(0))).ok());
  EXPECT_EQ(calls, 1);
  // The core asks DueAt and runs Vet on the stepped theta before publishing it; OnCommitted records the result.
  for (int64_t r = 1; r <= 4; ++r) {
    if (sink.DueAt(r, /*complete=*/false)) sink.Vet(*Theta(r));
    sink.OnCommitted(Closed(Theta(r), 100 * r));
  }
  EXPECT_EQ(calls, 2) << "round 3 only";
  ASSERT_TRUE(sink.DueAt(5, /*complete=*/true));
  sink.Vet(*Theta(5, /*complete=*/true));
  sink.OnCommitted(Closed(Theta(5, /*complete=*/true), 500));
  // A non-finite loss refuses the stepped theta (issue 32 item 4): Vet throws and nothing is recorded.
  auto inf = Theta(6);
  inf->params[0].second.fill_(std::numeric_limits<float>::infinity());
  EXPECT_THROW(sink.Vet(*inf), NonFiniteStep);
  sink.OnCommitted(Closed(Theta(6), 600));
  const std::vector<EvalRecord> records = history->Records();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[1].round, 3);
  EXPECT_EQ(records[1].tokens, 300);
  EXPECT_DOUBLE_EQ(records[1].val_loss, 3.0);
  EXPECT_EQ(records[2].round, 5);

  EvaluationSink resumed(3, std::make_unique<CountingEvaluator>(&calls), history);
  ASSERT_TRUE(resumed.OnStart(Closed(Theta(5))).ok());
  EXPECT_EQ(calls, 4) << "a resumed run with evals does not evaluate its start again (4: rounds 0, 3, 5 and 6)";
}

class CheckpointWriterTest : public ScratchDirTest {};

TEST_F(CheckpointWriterTest, WritesWhenDueAndOnRequest) {
  Config config;
  config.outer.rounds = 10;
  config.coordinator.checkpoint_every = 2;
  config.coordinator.keep_checkpoints = 0;
  config.coordinator.checkpoint_dir = Path("ckpt");
  std::unique_ptr<ThetaStore> store = ThetaStore::Create(config, Theta(0), {});
  auto history = std::make_shared<EvalHistory>(std::vector<EvalRecord>{{0, 4.5, 0, 0}});
  CheckpointWriter writer(config, "fp", store.get(), history);
  store->Publish(store->Step({at::full({3}, 1.0f)}, nullptr));
  writer.OnCommitted(Closed(store->current()));
  EXPECT_FALSE(std::filesystem::exists(CheckpointPath(Path("ckpt"), 1))) << "round 1 is not due";
  store->Publish(store->Step({at::full({3}, 1.0f)}, nullptr));
  writer.OnCommitted(Closed(store->current()));
  ASSERT_TRUE(std::filesystem::exists(CheckpointPath(Path("ckpt"), 2)));
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(CheckpointPath(Path("ckpt"), 2));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->round, 2);
  EXPECT_EQ(loaded->fingerprint, "fp");
  EXPECT_EQ(loaded->momentum.size(), 1u);
  ASSERT_EQ(loaded->evals.size(), 1u);
  EXPECT_TRUE(loaded->params[0].second.equal(store->current()->params[0].second));

  store->Publish(store->Step({at::full({3}, 1.0f)}, nullptr));
  absl::StatusOr<WrittenCheckpoint> now = writer.Write();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->round, 3);
  EXPECT_EQ(now->path, CheckpointPath(Path("ckpt"), 3));
}

// What throws while a checkpoint is written (here the members' record) is the write's error, as a full disk is: the
// round thread logs it and goes on (the last round's is kept in final_error()). Before, it left the writer.
TEST_F(CheckpointWriterTest, AWriteThatThrowsReturnsItsError) {
  Config config;
  config.outer.rounds = 10;
  config.coordinator.checkpoint_every = 1;
  config.coordinator.checkpoint_dir = Path("ckpt");
  std::unique_ptr<ThetaStore> store = ThetaStore::Create(config, Theta(0), {});
  auto history = std::make_shared<EvalHistory>(std::vector<EvalRecord>{});
  CheckpointWriter writer(config, "fp", store.get(), history, [](int64_t round, CheckpointData&) {
    throw std::runtime_error("no members record for round " + std::to_string(round));
  });
  store->Publish(store->Step({at::full({3}, 1.0f)}, nullptr));
  absl::StatusOr<WrittenCheckpoint> now = writer.Write();
  ASSERT_FALSE(now.ok());
  EXPECT_EQ(now.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(now.status().message().find("no members record for round 1"), std::string::npos) << now.status();
  EXPECT_NO_THROW(writer.OnCommitted(Closed(store->current())));
  EXPECT_FALSE(std::filesystem::exists(CheckpointPath(Path("ckpt"), 1)));
  EXPECT_EQ(writer.final_error(), "") << "round 1 is not the last";
}

TEST_F(CheckpointWriterTest, ReplayLogWritesThetaZeroAndDeltas) {
  ReplayLogSink sink(Path("replay"), "fp", {"w"});
  ASSERT_TRUE(sink.OnStart(Closed(Theta(0))).ok());
  EXPECT_TRUE(std::filesystem::exists(ReplayTheta0Path(Path("replay"))));
  const std::vector<at::Tensor> delta = {at::full({3}, 0.25f)};
  ClosedRound round = Closed(Theta(1));
  round.delta = &delta;
  sink.OnStepped(round);
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(ReplayDeltaPath(Path("replay"), 1));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->params[0].second.equal(delta[0]));

  ReplayLogSink resumed(Path("replay2"), "fp", {"w"});
  ASSERT_TRUE(resumed.OnStart(Closed(Theta(4))).ok());
  EXPECT_FALSE(std::filesystem::exists(ReplayTheta0Path(Path("replay2")))) << "not when resumed";
}

}  // namespace
}  // namespace diloco
