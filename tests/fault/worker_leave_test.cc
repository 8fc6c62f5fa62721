// How a worker leaves when something goes wrong after its Join (real coordinator and worker processes on 127.0.0.1):
// a set-up that fails after the Join tells the coordinator at once, a signal while the worker joins again mid-run
// (the coordinator forgot it and is full) or while its coordinator does not answer ends it as any signal mid-run
// does, with exit 0, and a training that diverges round after round ends it with exit 1.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

// The tiny model with long rounds, short heartbeats and leases, two shards, and min_workers 1 (one worker trains
// alone); `address` is a free port on 127.0.0.1.
std::vector<std::string> Args(const std::string& dir, const std::string& address, std::vector<std::string> extra) {
  std::vector<std::string> overrides = {"coordinator.listen=" + address,
                                        "inner.steps=200",
                                        "outer.rounds=200",
                                        "coordinator.heartbeat_interval_s=0.3",
                                        "coordinator.lease_s=2",
                                        "workers.count=2",
                                        "coordinator.min_workers=1"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return TinyArgs(dir, overrides);
}

std::unique_ptr<RunningProcess> StartWorker(const std::vector<std::string>& args, const std::string& address,
                                            const std::string& id) {
  return std::make_unique<RunningProcess>("diloco-worker", With(args, {"--coordinator", address, "--id", id}));
}

// A worker whose set-up fails after the Join (here: its shard of a 5000-byte text holds no full window) leaves with
// that reason, so the coordinator stops counting on it at once. Before, it exited without a Leave and the
// coordinator noticed only when its lease ran out ("lost: ... no heartbeat").
TEST(WorkerLeave, ASetUpThatFailsAfterTheJoinLeavesAtOnce) {
  const std::string dir = ScratchDir("setup_fails_after_join");
  const std::string text = dir + "/small.txt";
  {
    std::ifstream in(SourceDir() + "/tests/data/tinyshakespeare.txt");
    std::string head(5000, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(text) << head;
  }
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const auto args = Args(dir, address, {"data.text=" + text, "data.cache_dir=" + dir + "/cache"});
  RunningProcess coordinator("diloco-coordinator", args);
  ASSERT_TRUE(coordinator.WaitForOutput("listening on", 120)) << coordinator.output();
  auto w0 = StartWorker(args, address, "w0");  // shard 0: the text's one block
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker w0", 120)) << coordinator.output();
  auto w1 = StartWorker(args, address, "w1");  // shard 1: nothing to train on
  EXPECT_EQ(w1->Wait(120), 2) << w1->output();
  EXPECT_NE(w1->output().find("shard 1 of 2 of "), std::string::npos) << w1->output();
  EXPECT_NE(w1->output().find(" tokens holds no full window; use fewer workers"), std::string::npos) << w1->output();
  ASSERT_TRUE(coordinator.WaitForOutput("left: worker w1", 30)) << coordinator.output();
  EXPECT_NE(coordinator.output().find("left: worker w1 (its set-up failed)"), std::string::npos)
      << coordinator.output();
  EXPECT_EQ(coordinator.output().find("lost: worker w1"), std::string::npos) << coordinator.output();
  w0->Signal(SIGTERM);
  EXPECT_EQ(w0->Wait(60), 0) << w0->output();
  coordinator.Signal(SIGTERM);
  coordinator.Wait(60);
}

// A worker the coordinator declared lost (SIGSTOP past its lease) whose place was taken meanwhile
// (coordinator.max_members 1) joins again and is told to join later, retrying. A SIGTERM then ends it as a SIGTERM
// anywhere mid-run does: "signal received: leaving the run", exit 0. Before, the retried Join's "asked to stop" became
// the worker's failure, and it exited 130 (the code of a signal before any Join).
TEST(WorkerLeave, ASignalWhileJoiningAgainMidRunExitsZero) {
  const std::string dir = ScratchDir("signal_while_rejoining");
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const auto args = Args(dir, address, {"coordinator.max_members=1"});
  RunningProcess coordinator("diloco-coordinator", args);
  ASSERT_TRUE(coordinator.WaitForOutput("listening on", 120)) << coordinator.output();
  auto w0 = StartWorker(args, address, "w0");
  ASSERT_TRUE(coordinator.WaitForOutput("round 1/200 closed", 120)) << coordinator.output();
  w0->Signal(SIGSTOP);
  ASSERT_TRUE(coordinator.WaitForOutput("lost: worker w0", 60)) << coordinator.output();
  auto w1 = StartWorker(args, address, "w1");
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker w1", 120)) << coordinator.output();
  const size_t before = w0->output().size();
  w0->Signal(SIGCONT);
  // Its next call is refused (not a member), and the Join again finds the coordinator full: it waits and retries.
  ASSERT_TRUE(w0->WaitForOutput("waiting for coordinator", 60)) << w0->output();
  EXPECT_GT(w0->output().rfind("waiting for coordinator"), before) << w0->output();
  w0->Signal(SIGTERM);
  EXPECT_EQ(w0->Wait(60), 0) << w0->output();
  EXPECT_NE(w0->output().find("signal received: leaving the run"), std::string::npos) << w0->output();
  w1->Signal(SIGTERM);
  EXPECT_EQ(w1->Wait(60), 0) << w1->output();
  coordinator.Signal(SIGTERM);
  coordinator.Wait(60);
}

// A SIGTERM while the coordinator does not answer (SIGSTOPped: a partition) ends the round at the next inner step.
// Before, only the heartbeat thread turned the signal into the inner loop's stop, after its sleep: a signal that came
// while it sat in a heartbeat call (held workers.rpc_timeout_s by a coordinator that does not answer) was never
// passed on, and the worker trained the rest of its round (here a million steps) before it saw it.
TEST(WorkerLeave, ASignalWhileTheCoordinatorDoesNotAnswerEndsTheRound) {
  const std::string dir = ScratchDir("signal_while_partitioned");
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const auto args = Args(dir, address, {"inner.steps=1000000", "workers.rpc_timeout_s=5"});
  RunningProcess coordinator("diloco-coordinator", args);
  ASSERT_TRUE(coordinator.WaitForOutput("listening on", 120)) << coordinator.output();
  auto w0 = StartWorker(args, address, "w0");
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker w0", 120)) << coordinator.output();
  ASSERT_TRUE(w0->WaitForOutput("joined ", 60)) << w0->output();  // then it pulls theta and trains round 1
  std::this_thread::sleep_for(std::chrono::seconds(1));
  coordinator.Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // > heartbeat_interval_s: a heartbeat call now waits
  w0->Signal(SIGTERM);
  const int code = w0->Wait(60);  // the Leave to the stopped coordinator takes up to rpc_timeout_s
  coordinator.Signal(SIGCONT);
  EXPECT_EQ(code, 0) << w0->output();
  EXPECT_NE(w0->output().find("signal received: leaving the run"), std::string::npos) << w0->output();
  coordinator.Signal(SIGTERM);
  coordinator.Wait(60);
}

// A worker whose training turns non-finite every round (inner.lr 1e30), each time from the pulled global model with
// its moments started over, leaves after three rounds in a row with one line and exit 1 (and the coordinator sees it
// leave, so the rounds stop waiting for it). Before, it pulled and diverged again forever, pushing nothing, and
// every synchronous round waited coordinator.round_timeout_s for it.
TEST(WorkerLeave, ATrainingThatDivergesEveryRoundLeavesWithExit1) {
  const std::string dir = ScratchDir("diverges_every_round");
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const auto args = Args(dir, address, {"inner.steps=10"});
  RunningProcess coordinator("diloco-coordinator", args);
  ASSERT_TRUE(coordinator.WaitForOutput("listening on", 120)) << coordinator.output();
  auto w0 = StartWorker(With(args, {"--set", "inner.lr=1e30"}), address, "w0");
  EXPECT_EQ(w0->Wait(120), 1) << w0->output();
  const std::string out = w0->output();
  EXPECT_NE(out.find("training turned non-finite in 3 rounds in a row"), std::string::npos) << out;
  EXPECT_NE(out.find("lower inner.lr"), std::string::npos) << out;
  ASSERT_TRUE(coordinator.WaitForOutput("left: worker w0 (it failed)", 30)) << coordinator.output();
  coordinator.Signal(SIGTERM);
  coordinator.Wait(60);
}

// A one-process worker whose training throws mid-round (test-only --attack throw-step:N, as a CUDA out-of-memory
// error would) says so in one line, tells the coordinator it failed and exits 1; before, it called itself a failed
// cluster (exit 5). The other worker completes the run without waiting coordinator.lease_s for it.
TEST(WorkerLeave, AOneProcessWorkerWhoseTrainingThrowsLeavesWithExit1) {
  const std::string dir = ScratchDir("training_throws");
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const auto args = Args(dir, address,
                         {"inner.steps=10", "outer.rounds=3", "coordinator.min_workers=1", "coordinator.lease_s=600",
                          "coordinator.round_timeout_s=600"});
  RunningProcess coordinator("diloco-coordinator", args);
  ASSERT_TRUE(coordinator.WaitForOutput("listening on", 120)) << coordinator.output();
  // w1 first: it trains from round 1, so it reaches global inner step 14 (round 2) whenever w0 joins.
  auto w1 = StartWorker(With(args, {"--attack", "throw-step:14"}), address, "w1");
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker w1", 120)) << coordinator.output();
  auto w0 = StartWorker(args, address, "w0");
  EXPECT_EQ(w1->Wait(120), 1) << w1->output();
  const std::string out = w1->output();
  EXPECT_NE(out.find("worker failed: test-only --attack throw-step: inner step 14 failed (as a device error would); "
                     "leaving the run"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("worker cluster failed"), std::string::npos) << out;
  ASSERT_TRUE(coordinator.WaitForOutput("left: worker w1 (it failed)", 30)) << coordinator.output();
  EXPECT_EQ(w0->Wait(120), 0) << w0->output();
  EXPECT_EQ(coordinator.Wait(60), 0) << coordinator.output();
}

}  // namespace
}  // namespace diloco::testing
