// Fault tests: real coordinator and worker processes on 127.0.0.1, killed with kill -9, stopped with SIGTERM,
// drained by an operator, restarted; checkpoints corrupted on disk. Each prints "[measure]" lines: seconds from the
// fault to the next committed round (figures for the notes, never asserted: no timing thresholds in tests).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "config/config_loader.h"
#include "config/model_spec.h"
#include "proto/tensor_chunks.h"
#include "proto/tensor_spec.h"
#include "tests/process_harness.h"
#include "worker/client.h"
#include "worker/lm/language_model.h"
#include "worker/round_result.h"
#include "worker/worker_state.h"

namespace diloco::testing {
namespace {

using Clock = std::chrono::steady_clock;

// The tiny model with longer rounds (so a fault lands mid-round), short heartbeats and leases, a checkpoint every
// round, and a fixed port (a restarted coordinator must come back at the same address).
std::vector<std::string> FaultArgs(const std::string& dir, const std::string& address,
                                   std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {"coordinator.listen=" + address,
                                        "inner.steps=200",
                                        "coordinator.heartbeat_interval_s=0.3",
                                        "coordinator.lease_s=2",
                                        "coordinator.round_timeout_s=20",
                                        "coordinator.checkpoint_every=1",
                                        "workers.count=3",
                                        "coordinator.min_workers=2"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return TinyArgs(dir, overrides);
}

std::string Loopback() { return "127.0.0.1:" + std::to_string(FreePort()); }

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void Measure(const std::string& what, double seconds) {
  std::cout << "[measure] " << what << ": " << seconds << " s" << std::endl;
  ::testing::Test::RecordProperty(what, std::to_string(seconds));
}

// Starts the coordinator and waits until it listens, so workers started next all join before the first push.
std::unique_ptr<RunningProcess> StartCoordinator(const std::vector<std::string>& args) {
  auto c = std::make_unique<RunningProcess>("diloco-coordinator", args);
  EXPECT_TRUE(c->WaitForOutput("listening on", 120)) << c->output();
  return c;
}

std::unique_ptr<RunningProcess> StartWorker(const std::vector<std::string>& args, const std::string& address,
                                            const std::string& id) {
  return std::make_unique<RunningProcess>("diloco-worker", With(args, {"--coordinator", address, "--id", id}));
}

const nlohmann::json* FindWorker(const nlohmann::json& summary, const std::string& id) {
  for (const auto& w : summary["workers"]) {
    if (w["id"] == id) return &w;
  }
  return nullptr;
}

// The value after "eval: round <round> val_loss " in a coordinator log, or NaN.
double EvalLossInLog(const std::string& log, int round) {
  std::smatch m;
  const std::regex re("eval: round " + std::to_string(round) + " val_loss ([0-9.]+)");
  return std::regex_search(log, m, re) ? std::stod(m[1]) : NAN;
}

TEST(Fault, KilledWorkerIsMarkedLostAndTheRoundClosesWithTheOthers) {
  const std::string dir = ScratchDir("kill_worker");
  const std::string address = Loopback();
  const auto args = FaultArgs(dir, address, {"outer.rounds=6"});
  auto coordinator_process = StartCoordinator(args);
  RunningProcess& coordinator = *coordinator_process;
  auto w0 = StartWorker(args, address, "w0");
  auto w1 = StartWorker(args, address, "w1");
  auto w2 = StartWorker(args, address, "w2");
  ASSERT_TRUE(coordinator.WaitForOutput("round 2/6 closed", 120)) << coordinator.output();
  // The rounds closed when w2 joined: 0 unless a loaded machine let w0 and w1 close round 1 before w2's join (the log
  // names the round under way, from 1).
  std::smatch joined;
  const std::string early = coordinator.output();
  ASSERT_TRUE(std::regex_search(early, joined, std::regex(R"(joined: worker w2 \(.*\) at round (\d+))"))) << early;
  const int w2_joined_at = std::stoi(joined[1]) - 1;
  ASSERT_LE(w2_joined_at, 1) << early;

  w2->Signal(SIGKILL);  // mid-round 3: the workers are training
  const auto killed = Clock::now();
  ASSERT_TRUE(coordinator.WaitForOutput("round 3/6 closed", 60)) << coordinator.output();
  Measure("kill -9 worker -> next round committed", SecondsSince(killed));

  EXPECT_EQ(w0->Wait(120), 0) << w0->output();
  EXPECT_EQ(w1->Wait(120), 0) << w1->output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  EXPECT_NE(coordinator.output().find("lost: worker w2"), std::string::npos);
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"], 6);
  EXPECT_EQ((*FindWorker(summary, "w2"))["state"], "lost");
  EXPECT_EQ((*FindWorker(summary, "w2"))["rounds_contributed"], 2 - w2_joined_at);
  EXPECT_EQ((*FindWorker(summary, "w0"))["rounds_contributed"], 6);
  EXPECT_EQ((*FindWorker(summary, "w1"))["rounds_contributed"], 6);
  // Rounds 1-2 had all three (from w2's join); every round after the kill closed with the two survivors.
  const std::string log = coordinator.output();
  for (int r = 1; r <= 6; ++r) {
    const std::string pushes = r <= 2 && r > w2_joined_at ? "3 pushes" : "2 pushes";
    std::smatch m;
    ASSERT_TRUE(
        std::regex_search(log, m, std::regex("round " + std::to_string(r) + "/6 closed \\(.*\\): (\\d+ pushes)")));
    EXPECT_EQ(m[1], pushes) << "round " << r;
  }
}

TEST(Fault, WorkerJoiningAtRound3StartsFromTheGlobalModel) {
  const std::string dir = ScratchDir("late_joiner");
  const std::string address = Loopback();
  // lease_s and round_timeout_s long: w0 is held stopped below while w3 joins.
  const auto args = FaultArgs(
      dir, address, {"outer.rounds=7", "workers.count=4", "coordinator.lease_s=60", "coordinator.round_timeout_s=90"});
  auto coordinator_process = StartCoordinator(args);
  RunningProcess& coordinator = *coordinator_process;
  auto w0 = StartWorker(args, address, "w0");
  auto w1 = StartWorker(args, address, "w1");
  auto w2 = StartWorker(args, address, "w2");
  ASSERT_TRUE(coordinator.WaitForOutput("eval: round 3 val_loss", 120)) << coordinator.output();
  const double val_at_join = EvalLossInLog(coordinator.output(), 3);
  const double val_initial = EvalLossInLog(coordinator.output(), 0);
  // Hold the run at round 4 (it cannot close without w0) until w3 has joined, so that w3 joins a run that is still
  // going however fast the rounds are.
  w0->Signal(SIGSTOP);
  auto w3 = StartWorker(args, address, "w3");
  const bool joined = coordinator.WaitForOutput("joined: worker w3", 60);
  w0->Signal(SIGCONT);
  ASSERT_TRUE(joined) << coordinator.output() << w3->output();

  for (auto* w : {w0.get(), w1.get(), w2.get(), w3.get()}) EXPECT_EQ(w->Wait(120), 0) << w->output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_GE((*FindWorker(summary, "w3"))["rounds_contributed"].get<int>(), 1);

  // Its first local loss ("loss A -> B" of its first round) is near the global model's, far from a random init's.
  std::smatch m;
  const std::string log = w3->output();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("inner steps, loss ([0-9.]+) ->"))) << log;
  const double first_loss = std::stod(m[1]);
  std::cout << "[measure] joiner first loss " << first_loss << ", global val_loss at join " << val_at_join
            << ", initial " << val_initial << std::endl;
  EXPECT_LT(val_at_join, val_initial - 0.5);
  EXPECT_NEAR(first_loss, val_at_join, 0.35);
}

// kill -9 of the coordinator mid-round 4 and a restart with the same command; `transport`: comm.transport.
void KillAndRestartCoordinator(const std::string& transport, int tcp_port = 0) {
  const std::string dir = ScratchDir("kill_coordinator_" + transport + std::to_string(tcp_port));
  const std::string address = Loopback();
  // A fixed port: a lease that outlasts the restart however slowly it starts on a loaded machine, so that the workers
  // stay members (their heartbeats back off while the coordinator is gone) and never join again, and rounds long enough
  // for the heartbeats after which a worker tries TCP again (10, 3 s here).
  const auto args = FaultArgs(
      dir, address,
      {"outer.rounds=6", "workers.count=2", "comm.transport=" + transport, "comm.tcp_port=" + std::to_string(tcp_port),
       tcp_port > 0 ? "coordinator.lease_s=60" : "coordinator.lease_s=2",
       tcp_port > 0 ? "inner.steps=2000" : "inner.steps=200"});
  auto coordinator = StartCoordinator(args);
  auto w0 = StartWorker(args, address, "w0");
  auto w1 = StartWorker(args, address, "w1");
  ASSERT_TRUE(coordinator->WaitForOutput("ckpt-00000003.bin", 120)) << coordinator->output();
  const std::string before = coordinator->output();

  coordinator->Signal(SIGKILL);  // mid-round 4
  const auto killed = Clock::now();
  ASSERT_EQ(coordinator->Wait(10), 128 + SIGKILL);
  coordinator = std::make_unique<RunningProcess>("diloco-coordinator", args);  // the same command
  ASSERT_TRUE(coordinator->WaitForOutput("round 4/6 closed", 120)) << coordinator->output();
  Measure("kill -9 coordinator + restart -> next round committed", SecondsSince(killed));

  EXPECT_EQ(w0->Wait(120), 0) << w0->output();
  EXPECT_EQ(w1->Wait(120), 0) << w1->output();
  ASSERT_EQ(coordinator->Wait(60), 0) << coordinator->output();
  const std::string after = coordinator->output();
  EXPECT_NE(after.find("resumed from"), std::string::npos) << after;
  EXPECT_NE(after.find("round 3, "), std::string::npos) << after;  // "resumed from ...: round 3, 4 evals"

  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"], 6);
  const auto& evals = summary["evals"];
  ASSERT_EQ(evals.size(), 7u) << evals.dump();  // rounds 0..6, each once: the history survived the restart
  for (int r = 0; r <= 6; ++r) EXPECT_EQ(evals[r]["round"], r);
  const double initial = evals[0]["val_loss"], at3 = evals[3]["val_loss"], at4 = evals[4]["val_loss"];
  EXPECT_NEAR(at3, EvalLossInLog(before, 3), 1e-3);
  EXPECT_LT(at4, at3 + 0.05) << "no jump back after the restart";
  EXPECT_LT(at4, initial - 0.5);
  if (transport == "tcp") {  // the restarted coordinator listens on a new push port: both workers learned it (a
                             // heartbeat names it to a restored member; a Join to one that joined again)
    for (RunningProcess* w : {w0.get(), w1.get()}) {
      const std::string out = w->output();
      const size_t first = out.find("pushes over tcp to port ");
      ASSERT_NE(first, std::string::npos) << out;
      EXPECT_NE(out.find("pushes over tcp to port ", first + 1), std::string::npos) << out;
      if (tcp_port > 0) EXPECT_EQ(out.find(" joined ", first), std::string::npos) << "a restored member" << out;
    }
  }
}

TEST(Fault, CoordinatorKilledAndRestartedResumesFromItsCheckpoint) { KillAndRestartCoordinator("grpc"); }

// The same over comm.transport tcp: the restarted coordinator restores the workers as members (its checkpoint lists
// them) and names its new push port in their heartbeats; a push to the dead port meanwhile falls back to gRPC.
TEST(Fault, CoordinatorKilledAndRestartedWithTcpPushesWorkersFindTheNewPort) { KillAndRestartCoordinator("tcp"); }

// The same with a fixed comm.tcp_port: the restarted coordinator listens on the same port, so the worker's push to the
// dead process fails and falls back to gRPC (which counts: the worker is a restored member); a few heartbeats later
// it pushes over TCP again ("tcp again: pushes over tcp to port P"). Before, it stayed on gRPC for the rest of the run.
TEST(Fault, CoordinatorKilledAndRestartedOnAFixedTcpPortWorkersPushOverTcpAgain) {
  KillAndRestartCoordinator("tcp", FreePort());
}

// Theta ids across a kill -9 of the coordinator (PROTOCOL.md "Lease, heartbeat and re-pushing"), with the worker's
// own client: w0 pulls theta_1, the coordinator dies before any checkpoint (checkpoint_every far off) and starts
// again from theta_0, w1 alone steps round 1 to another theta_1, and w0, joining again, pushes "round 1" computed
// against the first one. Its pull named that theta's id, its push echoes it, and the coordinator refuses the push
// (FAILED_PRECONDITION; its heartbeat shows the round still open: the worker pushes once more and then pulls). Before,
// the round numbers matched and the push was averaged in.
TEST(Fault, APushAgainstAThetaFromBeforeACoordinatorRestartIsRefused) {
  const std::string dir = ScratchDir("theta_id_restart");
  const std::string address = Loopback();
  const std::vector<std::string> extra = {"workers.count=2", "coordinator.min_workers=1",
                                          "coordinator.checkpoint_every=100", "coordinator.eval_every=0",
                                          "coordinator.lease_s=30"};
  const auto args = FaultArgs(dir, address, extra);
  std::vector<std::string> overrides = {"coordinator.listen=" + address};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  auto config = LoadConfig(SourceDir() + "/config/tiny.yaml", overrides);
  ASSERT_TRUE(config.ok()) << config.status();
  LanguageModelPtr model = MakeLanguageModel(config->model, config->run.seed);
  NamedTensors zeros;
  for (const auto& [name, p] : NamedParameters(*model)) zeros.emplace_back(name, torch::zeros_like(p));
  const std::string fingerprint = Fingerprint(SpecsOf(zeros));
  const ModelSpec spec = ModelSpecOf(config->model);
  RoundResult result;
  result.pseudo_gradient = zeros;
  result.report.tokens = 1000;
  result.report.steps = 10;
  const auto pull = [&](CoordinatorClient& client) {
    NamedTensors into;
    for (const auto& [name, t] : zeros) into.emplace_back(name, torch::empty_like(t));
    ChunkAssembler assembler(into);
    return client.Pull(assembler);
  };

  auto coordinator = StartCoordinator(args);
  CoordinatorClient w0(address, "w0", fingerprint, 30.0, config->comm.chunk_bytes, CODEC_RAW);
  ASSERT_TRUE(w0.Join(spec, 1, "cpu").ok());
  ASSERT_TRUE(pull(w0).ok());
  ASSERT_TRUE(w0.Push(0, result).ok());  // the round's only member: round 1 closes
  absl::StatusOr<PullResult> first = absl::UnavailableError("not yet");
  for (int i = 0; i < 200 && (!first.ok() || first->round < 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    first = pull(w0);
  }
  ASSERT_TRUE(first.ok() && first->round == 1) << first.status();
  EXPECT_NE(first->theta_id, 0u);

  coordinator->Signal(SIGKILL);
  ASSERT_EQ(coordinator->Wait(10), 128 + SIGKILL);
  coordinator = StartCoordinator(args);  // no checkpoint: theta_0 again
  CoordinatorClient w1(address, "w1", fingerprint, 30.0, config->comm.chunk_bytes, CODEC_RAW);
  const auto join = [&](CoordinatorClient& client) {  // the first call after the kill may find the old connection
    absl::StatusOr<JoinReply> joined = absl::UnavailableError("not yet");
    for (int i = 0; i < 100 && absl::IsUnavailable(joined.status()); ++i) {
      joined = client.Join(spec, 1, "cpu");
      if (!joined.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return joined.status();
  };
  ASSERT_TRUE(join(w1).ok()) << coordinator->output();
  ASSERT_TRUE(pull(w1).ok());
  ASSERT_TRUE(w1.Push(0, result).ok());  // round 1 again, to another theta
  absl::StatusOr<PullResult> second = absl::UnavailableError("not yet");
  for (int i = 0; i < 200 && (!second.ok() || second->round < 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    second = pull(w1);
  }
  ASSERT_TRUE(second.ok() && second->round == 1) << second.status();
  EXPECT_NE(second->theta_id, first->theta_id);

  ASSERT_TRUE(join(w0).ok());  // not a member of the new coordinator: it joins again
  const absl::StatusOr<int64_t> stale = w0.Push(1, result);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << stale.status();
  EXPECT_NE(std::string(stale.status().message()).find("computed against another theta of that round"),
            std::string::npos)
      << stale.status();
  // What the worker's session does next (CoordinatorSession::WaitAfterRefusal): the heartbeat shows the open round
  // still based on round 1 and training, so it pushes once more, is refused again, and pulls. Before, it waited for
  // round 1 to close, which waited for it.
  absl::StatusOr<HeartbeatReply> beat = w0.Heartbeat(1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  WaitDecision next = DecideAfterRefusal(HeartbeatViewOf(*beat), 1, /*async=*/false);
  EXPECT_EQ(next.action, WaitAction::kRepush) << next.reason << " (phase " << beat->phase() << ")";
  EXPECT_EQ(w0.Push(1, result).status().code(), absl::StatusCode::kFailedPrecondition);
  beat = w0.Heartbeat(1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  next = DecideAfterRefusal(HeartbeatViewOf(*beat), 1, /*async=*/false, /*repushed=*/true);
  EXPECT_EQ(next.action, WaitAction::kRoundClosed) << next.reason << " (phase " << beat->phase() << ")";
  ASSERT_TRUE(pull(w0).ok());  // the current theta_1: its push counts
  EXPECT_TRUE(w0.Push(1, result).ok());
}

TEST(Fault, SigtermedWorkerLeavesAndTheRoundStopsWaitingAtOnce) {
  const std::string dir = ScratchDir("sigterm_worker");
  const std::string address = Loopback();
  // A long lease and round timeout: if the coordinator waited for them, the round's reason would say so.
  const auto args =
      FaultArgs(dir, address, {"outer.rounds=4", "coordinator.lease_s=60", "coordinator.round_timeout_s=90"});
  auto coordinator_process = StartCoordinator(args);
  RunningProcess& coordinator = *coordinator_process;
  auto w0 = StartWorker(args, address, "w0");
  auto w1 = StartWorker(args, address, "w1");
  auto w2 = StartWorker(args, address, "w2");
  ASSERT_TRUE(coordinator.WaitForOutput("round 1/4 closed", 120)) << coordinator.output();

  w2->Signal(SIGTERM);
  const auto signalled = Clock::now();
  EXPECT_EQ(w2->Wait(30), 0) << w2->output();
  EXPECT_NE(w2->output().find("signal received: leaving the run"), std::string::npos) << w2->output();
  ASSERT_TRUE(coordinator.WaitForOutput("round 2/4 closed", 60)) << coordinator.output();
  Measure("SIGTERM worker -> next round committed", SecondsSince(signalled));
  EXPECT_NE(coordinator.output().find("left: worker w2 (signal)"), std::string::npos) << coordinator.output();
  EXPECT_NE(coordinator.output().find("round 2/4 closed (all 2 active members pushed)"), std::string::npos)
      << coordinator.output();

  EXPECT_EQ(w0->Wait(120), 0);
  EXPECT_EQ(w1->Wait(120), 0);
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  EXPECT_EQ((*FindWorker(ReadJson(dir + "/summary.json"), "w2"))["state"], "left");
}

// A coordinator that dies and never comes back (kill -9, no restart): the workers gave up only while joining, so a
// worker mid-round retried its heartbeats, pulls or pushes forever. Once the coordinator has answered nothing for
// workers.connect_timeout_s they exit 4, naming it.
TEST(Fault, WorkersGiveUpOnACoordinatorGoneForConnectTimeout) {
  const std::string dir = ScratchDir("coordinator_gone");
  const std::string address = Loopback();
  const auto args = FaultArgs(dir, address, {"outer.rounds=50", "workers.count=2", "workers.connect_timeout_s=5"});
  auto coordinator = StartCoordinator(args);
  auto w0 = StartWorker(args, address, "w0");
  auto w1 = StartWorker(args, address, "w1");
  ASSERT_TRUE(coordinator->WaitForOutput("round 1/50 closed", 120)) << coordinator->output();
  coordinator->Signal(SIGKILL);
  const auto killed = Clock::now();
  for (RunningProcess* w : {w0.get(), w1.get()}) {
    EXPECT_EQ(w->Wait(120), 4) << w->output();
    EXPECT_NE(w->output().find("has not answered for"), std::string::npos) << w->output();
  }
  Measure("coordinator killed -> workers exit 4", SecondsSince(killed));
}

TEST(Fault, OperatorLeaveDrainsAWorkerAndCheckpointIsWrittenOnRequest) {
  const std::string dir = ScratchDir("operator");
  const std::string address = Loopback();
  const auto args = FaultArgs(
      dir, address,
      {"outer.rounds=4", "coordinator.lease_s=60", "coordinator.round_timeout_s=90", "coordinator.checkpoint_every=0"});
  auto coordinator_process = StartCoordinator(args);
  RunningProcess& coordinator = *coordinator_process;
  auto w0 = StartWorker(args, address, "w0");
  auto w1 = StartWorker(args, address, "w1");
  auto w2 = StartWorker(args, address, "w2");
  ASSERT_TRUE(coordinator.WaitForOutput("round 1/4 closed", 120)) << coordinator.output();
  // Hold the run open while the operator acts: with w0 stopped no later round can close (round_timeout_s 90), so
  // the run cannot finish before the leave arrives, however fast the rounds are.
  w0->Signal(SIGSTOP);

  RunningProcess checkpoint("diloco-ctl", {"checkpoint", "--addr", address});
  ASSERT_EQ(checkpoint.Wait(30), 0) << checkpoint.output();
  EXPECT_NE(checkpoint.output().find("checkpoint of round"), std::string::npos) << checkpoint.output();

  RunningProcess leave("diloco-ctl", {"leave", "--addr", address, "--id", "w2"});
  ASSERT_EQ(leave.Wait(30), 0) << leave.output();
  const int w2_exit = w2->Wait(30);
  w0->Signal(SIGCONT);
  EXPECT_EQ(w2_exit, 0) << w2->output();
  EXPECT_NE(w2->output().find("leaving at the operator's request"), std::string::npos) << w2->output();

  EXPECT_EQ(w0->Wait(120), 0);
  EXPECT_EQ(w1->Wait(120), 0);
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"], 4);
  EXPECT_EQ((*FindWorker(summary, "w2"))["state"], "left");
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/ckpt-00000001.bin") ||
              std::filesystem::exists(dir + "/checkpoints/ckpt-00000002.bin"));
}

// A slow worker (50x the inner steps) misses a round that closed on round_timeout_s with the fast one alone: its late
// push is refused, nothing of it is applied, and outer.late_policy decides where it goes on from. With int8 error
// feedback, what a refused push left out of its residual comes back: none of the slow worker's pushes counted, so its
// saved residual is none at all (the fast one's is not zero). Before, each refused push kept compensated - sent as
// the residual, though nothing of it was received. The run then completes while the slow worker trains its next
// round: the run-complete heartbeat makes it abandon that round and leave (exit 0). Before, it trained on and pushed
// to a coordinator that had exited after waiting max(15 s, 3 heartbeats) for it, and exited 4 after
// workers.connect_timeout_s of retries.
TEST(Fault, LatePushIsRefusedAndLatePolicyDecidesTheRestart) {
  for (const std::string policy : {"drop", "reuse_local"}) {
    const std::string dir = ScratchDir("late_" + policy);
    const std::string address = Loopback();
    const auto args = FaultArgs(dir, address,
                                {"outer.rounds=6", "workers.count=2", "coordinator.min_workers=1",
                                 "coordinator.round_timeout_s=0.2", "coordinator.lease_s=120", "inner.steps=20",
                                 "outer.late_policy=" + policy, "comm.codec=int8", "comm.error_feedback=true"});
    auto coordinator = StartCoordinator(args);
    // The slow worker pulls round 0 and draws its first batch (its position journal exists), and is held stopped
    // until the fast one's round 1 closed without it: its push of round 1 is then late whatever the machine's
    // speed. The fast worker is held stopped from then until that push was refused, so that the run goes on (five
    // rounds to go: the fast worker cannot close them all before it is stopped) and the late push finds it open.
    // lease_s 120 keeps each stopped worker a member.
    auto slow = StartWorker(With(args, {"--set", "inner.steps=1000"}), address, "slow");
    bool drawn = false;
    for (int i = 0; i < 6000 && !drawn; ++i) {
      drawn = LoadPosition(PositionPath(dir + "/worker-state", "slow")).ok();
      if (!drawn) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(drawn) << slow->output();
    slow->Signal(SIGSTOP);
    auto fast = StartWorker(args, address, "fast");
    const bool closed = coordinator->WaitForOutput("round 1/6 closed", 60);
    fast->Signal(SIGSTOP);
    slow->Signal(SIGCONT);
    const std::string expected = policy == "drop" ? "restarting from the new global parameters"
                                                  : "continuing from local parameters (late_policy reuse_local)";
    const bool refused = closed && slow->WaitForOutput(expected, 240);
    fast->Signal(SIGCONT);
    ASSERT_TRUE(closed) << coordinator->output() << fast->output();
    ASSERT_TRUE(refused) << slow->output();
    EXPECT_EQ(fast->Wait(120), 0) << fast->output();
    EXPECT_EQ(slow->Wait(120), 0) << slow->output();
    ASSERT_EQ(coordinator->Wait(60), 0) << coordinator->output();
    EXPECT_NE(slow->output().find("push not counted"), std::string::npos) << slow->output();
    EXPECT_NE(slow->output().find("the run completed (round 6) while this worker trained round"), std::string::npos)
        << slow->output();
    const nlohmann::json summary = ReadJson(dir + "/summary.json");
    EXPECT_EQ(summary["round"], 6);
    EXPECT_EQ((*FindWorker(summary, "fast"))["rounds_contributed"], 6);
    EXPECT_EQ((*FindWorker(summary, "slow"))["rounds_contributed"], 0);
    EXPECT_EQ((*FindWorker(summary, "slow"))["bytes_pushed"], 0) << "a refused push is never credited";
    EXPECT_EQ((*FindWorker(summary, "slow"))["state"], "left") << "it left at once, before the coordinator ended";
    auto residual = [&](const std::string& id) {
      auto state = LoadWorkerState(StatePath(dir + "/worker-state", id));
      EXPECT_TRUE(state.ok()) << id << ": " << state.status();
      if (!state.ok() || state->error_feedback.empty() || !state->error_feedback[0].defined()) return 0.0;
      return state->error_feedback[0].norm().item<double>();
    };
    EXPECT_GT(residual("fast"), 0);
    EXPECT_EQ(residual("slow"), 0) << "nothing the slow worker compensated was counted";
  }
}

// A run continued after both its workers stopped, its workers arriving the other way round: each asks at Join for
// the shard its saved journal names, gets it back, and resumes its moments and data position. Before, the first to
// join took the lowest free shard (the other's), and both found their saved state on another shard and started over.
TEST(Fault, ARestartedWorkerAsksForItsOwnShardBack) {
  const std::string dir = ScratchDir("shard_back");
  // A run to `rounds` whose worker `first` joins before `second`; each worker's output by id.
  auto run = [&](const std::string& rounds, const std::string& first, const std::string& second) {
    const std::string address = Loopback();
    const auto args = FaultArgs(
        dir, address, {"workers.count=2", "coordinator.min_workers=2", "inner.steps=20", "outer.rounds=" + rounds});
    auto coordinator = StartCoordinator(args);
    auto one = StartWorker(args, address, first);
    EXPECT_TRUE(coordinator->WaitForOutput("joined: worker " + first, 60)) << coordinator->output();
    auto two = StartWorker(args, address, second);
    EXPECT_EQ(one->Wait(120), 0) << one->output();
    EXPECT_EQ(two->Wait(120), 0) << two->output();
    EXPECT_EQ(coordinator->Wait(60), 0) << coordinator->output();
    return std::map<std::string, std::string>{{first, one->output()}, {second, two->output()}};
  };
  auto before = run("2", "a", "b");
  ASSERT_NE(before["a"].find("shard 0/2"), std::string::npos) << before["a"];
  ASSERT_NE(before["b"].find("shard 1/2"), std::string::npos) << before["b"];
  auto after = run("3", "b", "a");
  for (const auto& [id, shard] : {std::pair{"a", "shard 0/2"}, std::pair{"b", "shard 1/2"}}) {
    EXPECT_NE(after[id].find(shard), std::string::npos) << after[id];
    EXPECT_NE(after[id].find("resuming from"), std::string::npos) << after[id];
    EXPECT_EQ(after[id].find("ignoring the saved state"), std::string::npos) << after[id];
  }
}

TEST(Fault, TruncatedNewestCheckpointIsSkippedAndTheOneBeforeIsUsed) {
  const std::string dir = ScratchDir("corrupt_checkpoint");
  const std::vector<std::string> one = {"workers.count=1", "coordinator.min_workers=1", "inner.steps=20"};
  {
    const std::string address = Loopback();
    auto args = FaultArgs(dir, address, one);
    args = With(args, {"--set", "outer.rounds=3"});
    RunningProcess coordinator("diloco-coordinator", args);
    auto w = StartWorker(args, address, "w");
    ASSERT_EQ(w->Wait(120), 0) << w->output();
    ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  }
  const std::string newest = dir + "/checkpoints/ckpt-00000003.bin";
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) / 2);

  const std::string address = Loopback();
  auto args = With(FaultArgs(dir, address, one), {"--set", "outer.rounds=4"});
  RunningProcess coordinator("diloco-coordinator", args);
  auto w = StartWorker(args, address, "w");
  ASSERT_EQ(w->Wait(120), 0) << w->output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const std::string log = coordinator.output();
  EXPECT_NE(log.find("skipping checkpoint: checkpoint " + newest), std::string::npos) << log;
  EXPECT_NE(log.find("resumed from " + dir + "/checkpoints/ckpt-00000002.bin: round 2"), std::string::npos) << log;
  EXPECT_EQ(ReadJson(dir + "/summary.json")["round"], 4);
}

// Worker clusters: kill -9 of one rank of a 2-rank cluster takes that cluster out of the run (its leader's next
// all-reduce fails, or its next command is not taken by a follower that stopped polling: it says why, leaves and
// exits 5), not the whole run: the rounds go on with the other worker.
// Restarted (both ranks, a new store), the cluster joins again as the same worker and contributes again.
TEST(Fault, KilledClusterRankTakesOnlyItsClusterOutAndTheClusterRejoins) {
  const std::string dir = ScratchDir("kill_rank");
  const std::string address = Loopback();
  // lease_s 60: the plain worker is held stopped below while the cluster restarts (the cluster's failure is detected
  // by its leader's all-reduce or command, not by the lease).
  const auto args = FaultArgs(
      dir, address, {"outer.rounds=7", "workers.count=2", "coordinator.min_workers=1", "coordinator.lease_s=60"});
  const auto cluster_args = With(args, {"--set", "workers.cluster_size=2", "--set", "workers.cluster_timeout_s=20"});
  auto coordinator_process = StartCoordinator(args);
  RunningProcess& coordinator = *coordinator_process;
  auto start_rank = [&](int rank, const std::string& store) {
    return StartWorker(With(cluster_args, {"--rank", std::to_string(rank), "--cluster-store", store}), address, "c");
  };
  std::string store = "127.0.0.1:" + std::to_string(FreePort());
  auto leader = start_rank(0, store);
  auto follower = start_rank(1, store);
  // The plain worker starts once the cluster has joined: with min_workers 1 it would otherwise close rounds 1-2
  // alone while a slow rendezvous (2 cores, four processes starting) is still under way, and the kill below would
  // hit a cluster that never trained.
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker c ", 120)) << coordinator.output() << leader->output();
  auto plain = StartWorker(args, address, "p");
  ASSERT_TRUE(coordinator.WaitForOutput("round 2/7 closed", 180)) << coordinator.output();

  follower->Signal(SIGKILL);  // mid-round 3
  const auto killed = Clock::now();
  EXPECT_EQ(leader->Wait(120), 5) << leader->output();
  EXPECT_NE(leader->output().find("worker cluster failed"), std::string::npos) << leader->output();
  ASSERT_TRUE(coordinator.WaitForOutput("round 3/7 closed", 60)) << coordinator.output();
  Measure("kill -9 of a cluster rank -> next round committed", SecondsSince(killed));
  EXPECT_NE(coordinator.output().find("left: worker c (its cluster failed)"), std::string::npos);

  // Hold the plain worker until the cluster is back: with min_workers 1 it would otherwise close rounds 4-7 alone
  // while the restarted ranks rendezvous, and the cluster would rejoin a finished run.
  plain->Signal(SIGSTOP);
  store = "127.0.0.1:" + std::to_string(FreePort());
  leader = start_rank(0, store);
  follower = start_rank(1, store);
  const bool rejoined = coordinator.WaitForOutput("rejoined: worker c", 120);
  plain->Signal(SIGCONT);
  ASSERT_TRUE(rejoined) << coordinator.output() << leader->output();
  EXPECT_EQ(plain->Wait(240), 0) << plain->output();
  EXPECT_EQ(leader->Wait(120), 0) << leader->output();
  EXPECT_EQ(follower->Wait(120), 0) << follower->output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"], 7);
  ASSERT_NE(FindWorker(summary, "p"), nullptr) << summary.dump();
  ASSERT_NE(FindWorker(summary, "c"), nullptr) << summary.dump();
  // p contributed to every round from the one it joined in (the cluster may close round 1 alone while p starts; the
  // log numbers rounds from 1).
  std::smatch joined;
  const std::string p_log = plain->output();
  ASSERT_TRUE(std::regex_search(p_log, joined, std::regex("joined \\S+ at round (\\d+)"))) << p_log;
  EXPECT_EQ((*FindWorker(summary, "p"))["rounds_contributed"].get<int>(), 8 - std::stoi(joined[1])) << p_log;
  const auto& c = *FindWorker(summary, "c");
  EXPECT_EQ(c["cluster_size"], 2);
  EXPECT_GE(c["rounds_contributed"].get<int>(), 3);  // rounds 1-2 before the kill, and at least one after rejoining
  EXPECT_LT(c["rounds_contributed"].get<int>(), 7);  // not round 3
}

// A worker killed with kill -9 mid-round and restarted with the same id resumes from its local state
// (worker/worker_state.h): it says so with its last pushed round and data position, its first inner step starts
// from the saved AdamW moments (the norm it logs is the saved file's), and with sequential sampling no window it
// drew before the kill is drawn again in the same epoch (data.trace_windows lists every draw).
TEST(Fault, KilledWorkerRestartedWithItsIdResumesMomentsAndDataPosition) {
  const std::string dir = ScratchDir("resume_worker");
  const std::string address = Loopback();
  const auto args = FaultArgs(dir, address,
                              {"outer.rounds=5", "workers.count=2", "coordinator.min_workers=2",
                               "data.sampling=sequential", "data.trace_windows=true"});
  auto coordinator = StartCoordinator(args);
  auto w0 = StartWorker(args, address, "w0");
  auto w1 = StartWorker(args, address, "w1");
  const std::string state_dir = dir + "/worker-state";
  // Wait until w1 saved its state after its second push and has drawn batches of the next round, then kill it
  // mid-round. min_workers = 2: no round closes without w1, so the run cannot end before the restart (however fast
  // the machine) and the restarted worker always has rounds left to train.
  absl::StatusOr<WorkerState> saved = absl::NotFoundError("");
  for (int i = 0; i < 12000; ++i) {
    saved = LoadWorkerState(StatePath(state_dir, "w1"));
    if (saved.ok() && saved->round >= 2) {
      auto drawn = LoadPosition(PositionPath(state_dir, "w1"));
      if (drawn.ok() && std::tie(drawn->second.epoch, drawn->second.position) >
                            std::tie(saved->sampler.epoch, saved->sampler.position)) {
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(saved.ok() && saved->round >= 2) << w1->output();
  w1->Signal(SIGKILL);
  ASSERT_NE(w1->Wait(30), 0);
  saved = LoadWorkerState(StatePath(state_dir, "w1"));  // the state the restart must use
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto journal = LoadPosition(PositionPath(state_dir, "w1"));
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_GE(journal->second.position, saved->sampler.position) << "the journal is at least as far as the state";
  const std::string trace_before = ReadFile(WindowsPath(state_dir, "w1"));

  auto restarted = StartWorker(args, address, "w1");
  ASSERT_TRUE(restarted->WaitForOutput("first inner step after resume", 120)) << restarted->output();
  const std::string log = restarted->output();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m,
                                std::regex("resuming from .*w1\\.state: last pushed round (\\d+), AdamW step (\\d+), "
                                           "data position epoch (\\d+) window (\\d+)")))
      << log;
  EXPECT_EQ(std::stoll(m[1]), saved->round);
  EXPECT_EQ(std::stoll(m[2]), saved->adam_steps);
  EXPECT_EQ(std::stoll(m[3]), journal->second.epoch);
  EXPECT_EQ(std::stoll(m[4]), journal->second.position);
  ASSERT_TRUE(std::regex_search(
      log, m,
      std::regex("first inner step after resume: AdamW step (\\d+) from saved moments, \\|exp_avg\\| = ([0-9.e+-]+)")))
      << log;
  EXPECT_EQ(std::stoll(m[1]), saved->adam_steps + 1);
  const double saved_norm = saved->exp_avg.norm().item<double>();
  EXPECT_GT(saved_norm, 0);
  EXPECT_NEAR(std::stod(m[2]), saved_norm, 1e-6 * saved_norm);

  EXPECT_EQ(restarted->Wait(180), 0) << restarted->output();
  EXPECT_EQ(w0->Wait(180), 0) << w0->output();
  ASSERT_EQ(coordinator->Wait(60), 0) << coordinator->output();

  // Every window w1 drew, before and after the kill: none twice within an epoch.
  const std::string trace = ReadFile(WindowsPath(state_dir, "w1"));
  ASSERT_GT(trace.size(), trace_before.size()) << "the restarted worker drew more windows";
  std::istringstream lines(trace);
  std::set<std::pair<long long, long long>> seen;
  long long epoch = 0, start = 0, draws = 0;
  while (lines >> epoch >> start) {
    ++draws;
    EXPECT_TRUE(seen.insert({epoch, start}).second) << "window " << start << " drawn twice in epoch " << epoch;
  }
  EXPECT_GT(draws, 8 * 200 * 2) << "more than two rounds of batches were traced";
}

// A worker killed while it waits for the round its push counted in resumes the state of that push: its error-feedback
// residual (codec topk) is what the counted push left out, so the restart does not send the residual of the round
// before a second time. Before, the state was saved only after the round closed and the worker pulled: killed in the
// wait (most of a round, for a fast worker), it resumed the round before's residual, half of which the counted push
// had already delivered. Here w1 is held (SIGSTOP) so that round 1 cannot close while w0 waits in it.
TEST(Fault, AWorkerKilledAfterItsPushCountedResumesThatPushsResidual) {
  const std::string dir = ScratchDir("resume_after_count");
  const std::string address = Loopback();
  const auto args = FaultArgs(dir, address,
                              {"outer.rounds=3", "workers.count=2", "coordinator.min_workers=2", "comm.codec=topk",
                               "coordinator.lease_s=120", "coordinator.round_timeout_s=600"});
  auto coordinator = StartCoordinator(args);
  auto w0 = StartWorker(args, address, "w0");
  auto w1 = StartWorker(args, address, "w1");
  ASSERT_TRUE(coordinator->WaitForOutput("joined: worker w1", 120)) << coordinator->output();
  w1->Signal(SIGSTOP);
  const std::string state_dir = dir + "/worker-state";
  absl::StatusOr<WorkerState> saved = absl::NotFoundError("");
  for (int i = 0; i < 12000 && !(saved.ok() && saved->round >= 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    saved = LoadWorkerState(StatePath(state_dir, "w0"));
  }
  ASSERT_TRUE(saved.ok()) << "no state saved while round 1 waits for w1: " << saved.status() << "\n" << w0->output();
  EXPECT_EQ(saved->round, 1);
  ASSERT_EQ(saved->error_feedback.size(), 1u);
  ASSERT_TRUE(saved->error_feedback[0].defined());
  EXPECT_GT(saved->error_feedback[0].norm().item<double>(), 0) << "the residual the counted push left out";
  EXPECT_EQ(coordinator->output().find("round 1/3 closed"), std::string::npos) << "round 1 closed without w1";
  w0->Signal(SIGKILL);
  ASSERT_NE(w0->Wait(30), 0);
  w1->Signal(SIGCONT);
  ASSERT_TRUE(coordinator->WaitForOutput("round 1/3 closed", 120)) << coordinator->output();

  auto restarted = StartWorker(args, address, "w0");
  ASSERT_TRUE(restarted->WaitForOutput("first inner step after resume", 120)) << restarted->output();
  std::smatch m;
  const std::string log = restarted->output();
  ASSERT_TRUE(std::regex_search(log, m, std::regex("resuming from .*w0\\.state: last pushed round (\\d+)"))) << log;
  EXPECT_EQ(std::stoll(m[1]), 1);
  EXPECT_EQ(restarted->Wait(180), 0) << restarted->output();
  EXPECT_EQ(w1->Wait(180), 0) << w1->output();
  ASSERT_EQ(coordinator->Wait(60), 0) << coordinator->output();
}

// What each rank of a killed cluster must resume (keys: the ranks' StateKeys): the state of the newest round every
// rank saved (a rank's current or previous state) and whether it is the previous one, and its journal's position.
struct ResumeExpectation {
  std::vector<WorkerState> saved;
  std::vector<bool> from_previous;
  std::vector<SamplerState> journal;
};

ResumeExpectation ExpectedResume(const std::string& state_dir, const std::vector<std::string>& keys) {
  ResumeExpectation out;
  int64_t common = -1;
  for (const std::string& key : keys) {
    auto current = LoadWorkerState(StatePath(state_dir, key));
    EXPECT_TRUE(current.ok()) << current.status();
    if (!current.ok()) return out;
    common = common < 0 ? current->round : std::min(common, current->round);
    auto position = LoadPosition(PositionPath(state_dir, key));
    EXPECT_TRUE(position.ok()) << position.status();
    out.journal.push_back(position.ok() ? position->second : SamplerState());
  }
  for (const std::string& key : keys) {
    auto current = LoadWorkerState(StatePath(state_dir, key));
    auto state = current->round == common ? current : LoadWorkerState(PreviousStatePath(state_dir, key));
    EXPECT_TRUE(state.ok() && state->round == common) << state.status();
    if (!state.ok()) return out;
    out.from_previous.push_back(current->round != common);
    out.saved.push_back(std::move(*state));
  }
  return out;
}

// A restarted rank's log (key: its StateKey) says it resumed `saved` (from its previous state or not) and the data
// position of its journal, and its first step starts from the saved moments (their norm) at the next AdamW step.
void ExpectResumed(const std::string& log, const std::string& key, const WorkerState& saved,
                   const SamplerState& journal, bool from_previous) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m,
                                std::regex("resuming from \\S*" + key +
                                           "\\.state[^:]*: last pushed round (\\d+), AdamW step (\\d+), "
                                           "data position epoch (\\d+) window (\\d+)")))
      << log;
  EXPECT_EQ(std::stoll(m[1]), saved.round);
  EXPECT_EQ(log.find("(its previous state)") != std::string::npos, from_previous) << log;
  EXPECT_EQ(std::stoll(m[2]), saved.adam_steps);
  EXPECT_EQ(std::stoll(m[3]), journal.epoch);
  EXPECT_EQ(std::stoll(m[4]), journal.position);
  EXPECT_TRUE(journal.epoch > 0 || journal.position > 0) << "the data position continues, not restarts";
  ASSERT_TRUE(std::regex_search(
      log, m,
      std::regex("first inner step after resume: AdamW step (\\d+) from saved moments, \\|exp_avg\\| = ([0-9.e+-]+)")))
      << log;
  EXPECT_EQ(std::stoll(m[1]), saved.adam_steps + 1);
  const double norm = saved.exp_avg.norm().item<double>();
  EXPECT_GT(norm, 0) << "the rank owns parameters";
  EXPECT_NEAR(std::stod(m[2]), norm, 1e-6 * norm);
}

// Two ranks' saved moments (workers.sharding gradients) are their slices: rank 0 the first S elements, rank 1 the
// rest, together the model once.
void ExpectSlicesOfTheModel(const std::vector<WorkerState>& saved) {
  ASSERT_EQ(saved.size(), 2u);
  std::smatch layout;
  ASSERT_TRUE(
      std::regex_match(saved[0].identity.slice_layout, layout, std::regex("gradients (\\d+) in 2 slices of (\\d+)")))
      << saved[0].identity.slice_layout;
  const int64_t numel = std::stoll(layout[1]), slice = std::stoll(layout[2]);
  EXPECT_LT(slice, numel);
  EXPECT_EQ(saved[0].exp_avg.numel(), slice);
  EXPECT_EQ(saved[0].exp_avg.numel() + saved[1].exp_avg.numel(), numel);
  EXPECT_GT(std::abs(saved[0].exp_avg.norm().item<double>() - saved[1].exp_avg.norm().item<double>()), 0)
      << "each rank keeps its own slice";
}

// Waits (up to 3 minutes) until both ranks' states (keys: their StateKeys) are of the same round >= 2 and rank 0's
// journal is past its state (it trains the next round).
bool BothRanksSavedAndMidRound(const std::string& state_dir, const std::vector<std::string>& keys) {
  for (int i = 0; i < 18000; ++i) {
    auto s0 = LoadWorkerState(StatePath(state_dir, keys[0]));
    auto s1 = LoadWorkerState(StatePath(state_dir, keys[1]));
    auto drawn = LoadPosition(PositionPath(state_dir, keys[0]));
    if (s0.ok() && s1.ok() && s0->round >= 2 && s1->round == s0->round && drawn.ok() &&
        std::tie(drawn->second.epoch, drawn->second.position) > std::tie(s0->sampler.epoch, s0->sampler.position)) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A sharded worker cluster (workers.sharding gradients, 2 ranks) whose leader is killed with kill -9 mid-round:
// the round closes with the other worker (at its deadline: the dead leader never left), the cluster restarted with
// its id rejoins, and each rank resumes its own state (worker/local_state.h): the round every rank saved, its own
// slice's AdamW moments (the first step's logged norm is that rank's saved slice's, and the slice is shorter than
// the model) and step, and its own data position (each rank's journal at the kill, not the start of its data).
// follower_missed_last_save: before the restart the follower's state is put back to its previous one, as if the kill
// had come between the leader's write and the follower's: both ranks must then resume the round before (the leader
// from its previous state).
void KillShardedLeaderAndRestart(bool follower_missed_last_save) {
  const std::string dir = ScratchDir(follower_missed_last_save ? "resume_cluster_cut" : "resume_cluster");
  const std::string address = Loopback();
  // lease_s 60: the plain worker is held stopped while the cluster restarts; round_timeout_s (20, FaultArgs) closes the
  // round the killed leader never pushed. comm.chunk_bytes 4096: slices of 1024-element multiples, so both ranks own
  // parameters of the tiny model.
  const auto args = FaultArgs(dir, address,
                              {"outer.rounds=7", "workers.count=2", "coordinator.min_workers=1",
                               "coordinator.lease_s=60", "comm.chunk_bytes=4096", "data.sampling=sequential"});
  const auto cluster_args = With(args, {"--set", "workers.cluster_size=2", "--set", "workers.cluster_timeout_s=30",
                                        "--set", "workers.sharding=gradients"});
  auto coordinator_process = StartCoordinator(args);
  RunningProcess& coordinator = *coordinator_process;
  auto start_rank = [&](int rank, const std::string& store) {
    return StartWorker(With(cluster_args, {"--rank", std::to_string(rank), "--cluster-store", store}), address, "c");
  };
  std::string store = Loopback();
  std::vector<std::unique_ptr<RunningProcess>> ranks;
  ranks.push_back(start_rank(0, store));
  ranks.push_back(start_rank(1, store));
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker c ", 120)) << coordinator.output() << ranks[0]->output();
  auto plain = StartWorker(args, address, "p");

  // Wait until both ranks saved their state after the cluster's second push and the leader has drawn batches of the
  // next round, then kill the leader mid-round.
  const std::string state_dir = dir + "/worker-state";
  const std::vector<std::string> keys = {StateKey("c", 0, 2), StateKey("c", 1, 2)};
  const bool ready = BothRanksSavedAndMidRound(state_dir, keys);
  ASSERT_TRUE(ready) << ranks[0]->output() << ranks[1]->output();
  ranks[0]->Signal(SIGKILL);
  const auto killed = Clock::now();
  ASSERT_NE(ranks[0]->Wait(30), 0);
  EXPECT_NE(ranks[1]->Wait(120), 0) << "the follower leaves once its leader (the store's host) is gone";
  auto leader_state = LoadWorkerState(StatePath(state_dir, keys[0]));
  ASSERT_TRUE(leader_state.ok()) << leader_state.status();
  const std::string cut = "round " + std::to_string(leader_state->round + 1) + "/7 closed";  // the round of the kill
  if (follower_missed_last_save) {
    ASSERT_EQ(std::rename(PreviousStatePath(state_dir, keys[1]).c_str(), StatePath(state_dir, keys[1]).c_str()), 0);
  }
  const ResumeExpectation expected = ExpectedResume(state_dir, keys);
  ASSERT_EQ(expected.saved.size(), 2u);
  const int64_t common = expected.saved[0].round;
  const std::vector<bool>& from_previous = expected.from_previous;
  if (follower_missed_last_save) {
    EXPECT_EQ(common, leader_state->round - 1);
    EXPECT_TRUE(from_previous[0]) << "the leader resumes its previous state";
  }
  ASSERT_TRUE(coordinator.WaitForOutput(cut, 90)) << coordinator.output();
  Measure("kill -9 of a sharded cluster's leader -> next round committed", SecondsSince(killed));

  plain->Signal(SIGSTOP);  // until the cluster is back (else p alone finishes the run while the ranks rendezvous)
  store = Loopback();
  ranks.clear();
  ranks.push_back(start_rank(0, store));
  ranks.push_back(start_rank(1, store));
  const bool rejoined = coordinator.WaitForOutput("rejoined: worker c", 120);
  plain->Signal(SIGCONT);
  ASSERT_TRUE(rejoined) << coordinator.output() << ranks[0]->output();
  for (size_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(ranks[r]->WaitForOutput("first inner step after resume", 120)) << ranks[r]->output();
    ExpectResumed(ranks[r]->output(), keys[r], expected.saved[r], expected.journal[r], from_previous[r]);
  }
  ExpectSlicesOfTheModel(expected.saved);

  EXPECT_EQ(plain->Wait(240), 0) << plain->output();
  EXPECT_EQ(ranks[0]->Wait(120), 0) << ranks[0]->output();
  EXPECT_EQ(ranks[1]->Wait(120), 0) << ranks[1]->output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"], 7);
  const double first = EvalLossInLog(coordinator.output(), 1), last = EvalLossInLog(coordinator.output(), 7);
  EXPECT_TRUE(std::isfinite(last)) << coordinator.output();
  EXPECT_LT(last, first) << coordinator.output();
}

TEST(Fault, KilledShardedClusterRankRestartedWithItsIdResumesEveryRanksState) { KillShardedLeaderAndRestart(false); }

TEST(Fault, ShardedClusterRanksWhoseSavesDifferResumeTheRoundBothSaved) { KillShardedLeaderAndRestart(true); }

}  // namespace
}  // namespace diloco::testing
