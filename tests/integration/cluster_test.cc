// Worker clusters (workers.cluster_size, worker/cluster.h) end to end: real processes on 127.0.0.1, ranks meeting at a
// c10d store, gradients all-reduced with ProcessGroupGloo every inner step.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

// One worker that is a cluster of 2 ranks trains 3 rounds with the coordinator. With workers.check_replicas every
// rank compares a float64 checksum of its parameters with rank 0's after every inner step (the run fails if one
// differs); both ranks report having checked all 30 steps, the worker's tokens count both ranks, and loss falls.
TEST(Cluster, TwoRanksTrainWithTheCoordinatorAndStayIdenticalAfterEveryStep) {
  const std::string dir = ScratchDir("cluster_launch");
  std::vector<std::string> args = TinyArgs(
      dir, {"workers.count=1", "coordinator.min_workers=1", "workers.cluster_size=2", "workers.check_replicas=true"});
  args.erase(args.begin());  // the launcher takes the config as a positional argument
  RunningProcess launch("diloco-launch", args);
  ASSERT_EQ(launch.Wait(240), 0) << launch.output();
  const std::string out = launch.output();
  EXPECT_NE(out.find("[worker-0.0] "), std::string::npos) << out;
  EXPECT_NE(out.find("replica check: parameters identical on all 2 ranks after each of 30 inner steps"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("replica check: parameters identical to rank 0 after each of 30 inner steps"), std::string::npos)
      << out;
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  ASSERT_EQ(summary["workers"].size(), 1u);
  const auto& w = summary["workers"][0];
  EXPECT_EQ(w["cluster_size"], 2);
  EXPECT_EQ(w["rounds_contributed"], 3);
  EXPECT_EQ(w["tokens"], 2 * 3 * 10 * 8 * 32);  // ranks x rounds x H x batch x seq_len
  EXPECT_LT(summary["evals"].back()["val_loss"].get<double>(),
            summary["evals"].front()["val_loss"].get<double>() - 0.2);
}

// Streaming DiLoCo in a cluster: the followers receive each fragment's merge on their parameters' device (not through
// host buffers) and load theta straight into their parameters; the replica check then finds every rank identical to
// rank 0 after every inner step, merges included, and the run trains.
TEST(Cluster, StreamingFragmentMergesKeepTheRanksIdentical) {
  const std::string dir = ScratchDir("cluster_fragments");
  std::vector<std::string> args =
      TinyArgs(dir, {"workers.count=1", "coordinator.min_workers=1", "workers.cluster_size=2",
                     "workers.check_replicas=true", "comm.fragments=2"});
  args.erase(args.begin());  // the launcher takes the config as a positional argument
  RunningProcess launch("diloco-launch", args);
  ASSERT_EQ(launch.Wait(240), 0) << launch.output();
  const std::string out = launch.output();
  EXPECT_NE(out.find("replica check: parameters identical to rank 0 after each of"), std::string::npos) << out;
  EXPECT_EQ(out.find("differ"), std::string::npos) << out;
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  ASSERT_EQ(summary["workers"].size(), 1u);
  EXPECT_LT(summary["evals"].back()["val_loss"].get<double>(),
            summary["evals"].front()["val_loss"].get<double>() - 0.2);
}

// A round whose training turns non-finite in a cluster of 2 (test-only --attack nan-step:12 on rank 0: the loss of
// inner step 12, in round 2, is NaN; the averaged gradients spread it to both ranks' parameters and AdamW moments):
// the worker says so and does not push, every rank starts its moments over, and the round is trained again from the
// pulled theta. The replica check then finds the ranks identical after every later step, and the run completes with
// a finite, falling loss. Before, only rank 0's moments were started over: rank 1's stayed NaN and its step count
// ahead, the ranks' parameters differed after the next step and the replica check ended the cluster.
TEST(Cluster, ANonFiniteRoundStartsEveryRanksMomentsOver) {
  const std::string dir = ScratchDir("cluster_nan_step");
  const auto args = TinyArgs(
      dir, {"workers.count=1", "coordinator.min_workers=1", "workers.cluster_size=2", "workers.check_replicas=true"});
  RunningProcess coordinator("diloco-coordinator", With(args, {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  auto rank = [&](int r, const std::vector<std::string>& extra) {
    return std::make_unique<RunningProcess>(
        "diloco-worker",
        With(With(args, {"--coordinator", address, "--id", "c", "--rank", std::to_string(r), "--cluster-store", store}),
             extra));
  };
  auto leader = rank(0, {"--attack", "nan-step:12"});
  auto follower = rank(1, {});
  EXPECT_EQ(leader->Wait(240), 0) << leader->output();
  EXPECT_EQ(follower->Wait(60), 0) << follower->output();
  EXPECT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  EXPECT_NE(leader->output().find("round 2: training turned non-finite"), std::string::npos) << leader->output();
  EXPECT_EQ(follower->output().find("differ"), std::string::npos) << follower->output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  ASSERT_TRUE(summary.is_object()) << coordinator.output();
  EXPECT_EQ(summary["round"], 3);
  ASSERT_EQ(summary["workers"].size(), 1u);
  EXPECT_EQ(summary["workers"][0]["rounds_contributed"], 3);
  for (const auto& e : summary["evals"]) EXPECT_TRUE(std::isfinite(e["val_loss"].get<double>())) << e.dump();
  EXPECT_LT(summary["evals"].back()["val_loss"].get<double>(), summary["evals"].front()["val_loss"].get<double>());
}

// A cluster whose training diverges every round (inner.lr 1e30) leaves the run as a one-process worker does (exit 1,
// its line), and each of its followers leaves with the leader's code and line (three ranks: each takes its own copy
// of the line; one shared key, which the first reader deletes, left the second without it). Before, the leader's
// StopCommand carried code 0 after the ShardCommand: the follower exited 0 as if the run were complete (systemd and
// diloco-launch took the cluster's failure for a success on every rank but rank 0).
TEST(Cluster, ALeaderThatLeavesFailedStopsItsFollowerWithItsCodeAndLine) {
  const std::string dir = ScratchDir("cluster_diverges");
  const auto args = TinyArgs(dir, {"workers.count=1", "coordinator.min_workers=1", "workers.cluster_size=3",
                                   "inner.steps=10", "inner.lr=1e30"});
  RunningProcess coordinator("diloco-coordinator", With(args, {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  auto rank = [&](int r) {
    return std::make_unique<RunningProcess>(
        "diloco-worker",
        With(args, {"--coordinator", address, "--id", "c", "--rank", std::to_string(r), "--cluster-store", store}));
  };
  auto leader = rank(0);
  auto first = rank(1);
  auto second = rank(2);
  EXPECT_EQ(leader->Wait(240), 1) << leader->output();
  EXPECT_NE(leader->output().find("training turned non-finite in 3 rounds in a row"), std::string::npos)
      << leader->output();
  for (auto* follower : {first.get(), second.get()}) {
    EXPECT_EQ(follower->Wait(60), 1) << follower->output();
    EXPECT_NE(follower->output().find("rank 0 of worker c left the run (exit 1): training turned non-finite in 3 "
                                      "rounds in a row"),
              std::string::npos)
        << follower->output();
  }
  ASSERT_TRUE(coordinator.WaitForOutput("left: worker c (it failed)", 30)) << coordinator.output();
  coordinator.Signal(SIGTERM);
  coordinator.Wait(60);
}

// A rank given an unreachable store gives one clear line and exit 5 (kWorkerClusterFailed) once
// workers.cluster_timeout_s passes; a rank outside [0, cluster_size) is a config error (exit 2).
TEST(Cluster, BadRankOrUnreachableStoreIsOneClearLine) {
  const std::string dir = ScratchDir("cluster_bad");
  const std::vector<std::string> args =
      TinyArgs(dir, {"workers.cluster_size=2", "workers.cluster_timeout_s=2", "workers.connect_timeout_s=5"});
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  RunningProcess bad_rank("diloco-worker", With(args, {"--coordinator", "127.0.0.1:1", "--id", "x", "--rank", "2",
                                                       "--cluster-store", store}));
  EXPECT_EQ(bad_rank.Wait(60), 2) << bad_rank.output();
  EXPECT_NE(bad_rank.output().find("--rank 2: must be in [0, workers.cluster_size = 2)"), std::string::npos)
      << bad_rank.output();
  RunningProcess lonely("diloco-worker", With(args, {"--coordinator", "127.0.0.1:1", "--id", "x", "--rank", "1",
                                                     "--cluster-store", store}));
  EXPECT_EQ(lonely.Wait(120), 5) << lonely.output();
  EXPECT_NE(lonely.output().find("cluster rendezvous at " + store + " (rank 1 of 2) failed"), std::string::npos)
      << lonely.output();
}

// A follower waits for the leader's next command through the cluster's store, not inside a collective: the leader
// may wait for a whole round (push, the round's close, pull), and a collective waiting that long would time out
// (Gloo throws; NCCL aborts the process). Here the cluster's round 1 is held open 3x workers.cluster_timeout_s
// (min_workers 2: it closes only once a second worker, started late, has pushed) and the run still completes.
TEST(Cluster, FollowersOutwaitARoundLongerThanTheCollectiveTimeout) {
  const std::string dir = ScratchDir("cluster_long_round");
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const double timeout_s = 5;
  const auto args = TinyArgs(dir, {"coordinator.listen=" + address, "outer.rounds=2", "coordinator.min_workers=2"});
  RunningProcess coordinator("diloco-coordinator", args);
  ASSERT_TRUE(coordinator.WaitForOutput("listening on", 120)) << coordinator.output();
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  auto rank = [&](int r) {
    return std::make_unique<RunningProcess>(
        "diloco-worker", With(args, {"--set", "workers.cluster_size=2", "--set",
                                     "workers.cluster_timeout_s=" + std::to_string(timeout_s), "--coordinator", address,
                                     "--id", "c", "--rank", std::to_string(r), "--cluster-store", store}));
  };
  auto leader = rank(0);
  auto follower = rank(1);
  ASSERT_TRUE(leader->WaitForOutput(": pushed ", 180)) << leader->output() << follower->output();
  std::this_thread::sleep_for(std::chrono::duration<double>(3 * timeout_s));
  ASSERT_TRUE(follower->Running()) << follower->output();
  RunningProcess plain("diloco-worker", With(args, {"--coordinator", address, "--id", "p"}));
  EXPECT_EQ(leader->Wait(240), 0) << leader->output();
  EXPECT_EQ(follower->Wait(60), 0) << follower->output();
  EXPECT_EQ(plain.Wait(120), 0) << plain.output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"], 2);
  for (const auto& w : summary["workers"]) {
    if (w["id"] == "c") EXPECT_EQ(w["rounds_contributed"], 2) << summary.dump();
  }
}

// A signal to one follower only (one pod evicted) stops the whole cluster at the same inner step: the leader says why
// and leaves with that reason, and every rank exits 0. Before, the leader said nothing and told the coordinator "run
// complete" in the middle of the run.
TEST(Cluster, ASignalToAFollowerStopsTheClusterAndTheLeaderSaysWhy) {
  const std::string dir = ScratchDir("cluster_follower_signal");
  const std::string address = "127.0.0.1:" + std::to_string(FreePort());
  const auto args =
      TinyArgs(dir, {"coordinator.listen=" + address, "coordinator.min_workers=1", "inner.steps=1000000"});
  RunningProcess coordinator("diloco-coordinator", args);
  ASSERT_TRUE(coordinator.WaitForOutput("listening on", 120)) << coordinator.output();
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  auto rank = [&](int r) {
    return std::make_unique<RunningProcess>(
        "diloco-worker", With(args, {"--set", "workers.cluster_size=2", "--coordinator", address, "--id", "c", "--rank",
                                     std::to_string(r), "--cluster-store", store}));
  };
  auto leader = rank(0);
  auto follower = rank(1);
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker c", 120)) << coordinator.output() << leader->output();
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the cluster trains round 1
  follower->Signal(SIGTERM);
  EXPECT_EQ(follower->Wait(60), 0) << follower->output();
  EXPECT_EQ(leader->Wait(60), 0) << leader->output();
  EXPECT_NE(leader->output().find("another rank of this cluster stopped (a signal to it)"), std::string::npos)
      << leader->output();
  ASSERT_TRUE(coordinator.WaitForOutput("left: worker c (a rank of its cluster stopped)", 30)) << coordinator.output();
  coordinator.Signal(SIGTERM);
  coordinator.Wait(60);
}

// A leader killed while its follower waits for a command (here: while the leader still tries to reach a coordinator
// that is not there, longer than workers.cluster_timeout_s) ends the follower at once, with exit 5
// (kWorkerClusterFailed) and one line: the store it polls was the leader's.
TEST(Cluster, KilledLeaderEndsTheWaitingFollowerWithExit5) {
  const std::string dir = ScratchDir("cluster_dead_leader");
  const auto args =
      TinyArgs(dir, {"workers.cluster_size=2", "workers.cluster_timeout_s=3", "workers.connect_timeout_s=120"});
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  auto rank = [&](int r) {
    return std::make_unique<RunningProcess>(
        "diloco-worker", With(args, {"--coordinator", "127.0.0.1:1", "--id", "c", "--rank", std::to_string(r),
                                     "--cluster-store", store}));
  };
  auto leader = rank(0);
  auto follower = rank(1);
  ASSERT_TRUE(follower->WaitForOutput("cluster of 2 ranks ready", 120)) << follower->output() << leader->output();
  std::this_thread::sleep_for(std::chrono::seconds(8));  // past the collective timeout: the follower still waits
  ASSERT_TRUE(follower->Running()) << follower->output();
  leader->Signal(SIGKILL);
  EXPECT_EQ(follower->Wait(30), 5) << follower->output();
  EXPECT_NE(follower->output().find("worker cluster failed (rank 1 of 2)"), std::string::npos) << follower->output();
}

// The data-parallel baseline (diloco-launch --mode ddp). With one rank it is plain training, and so is DiLoCo with
// one worker and FedAvg's outer step (sgd, lr 1, momentum 0: theta_{t+1} = the worker's parameters): the two must
// give the same validation loss at every round (same theta_0, data, AdamW state and schedule; only float rounding
// of theta - (theta - local) differs). With two ranks their parameters stay identical after every step, tokens
// count both ranks and the bytes are those of a ring all-reduce of fp32 gradients.
TEST(DataParallel, OneRankMatchesFedAvgWithOneWorkerAndTwoRanksStayIdentical) {
  const std::string fedavg_dir = ScratchDir("ddp_fedavg");
  std::vector<std::string> fedavg = TinyArgs(fedavg_dir, {"workers.count=1", "coordinator.min_workers=1",
                                                          "outer.optimizer=sgd", "outer.lr=1", "outer.momentum=0"});
  fedavg.erase(fedavg.begin());
  RunningProcess diloco("diloco-launch", fedavg);
  ASSERT_EQ(diloco.Wait(240), 0) << diloco.output();

  const std::string one_dir = ScratchDir("ddp_one");
  std::vector<std::string> one = TinyArgs(one_dir, {"workers.count=1"});
  one.erase(one.begin());
  RunningProcess ddp_one("diloco-launch", With(one, {"--mode", "ddp"}));
  ASSERT_EQ(ddp_one.Wait(240), 0) << ddp_one.output();
  const nlohmann::json a = ReadJson(fedavg_dir + "/summary.json");
  const nlohmann::json b = ReadJson(one_dir + "/summary.json");
  EXPECT_EQ(b["mode"], "ddp");
  ASSERT_EQ(a["evals"].size(), 4u);
  ASSERT_EQ(b["evals"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(b["evals"][i]["round"], a["evals"][i]["round"]);
    EXPECT_NEAR(b["evals"][i]["val_loss"].get<double>(), a["evals"][i]["val_loss"].get<double>(), 1e-4) << i;
  }
  EXPECT_LT(b["evals"][3]["val_loss"].get<double>(), b["evals"][0]["val_loss"].get<double>() - 0.2);
  EXPECT_EQ(b["bytes_sent"], 0);

  const std::string two_dir = ScratchDir("ddp_two");
  std::vector<std::string> two = TinyArgs(two_dir, {"workers.check_replicas=true"});
  two.erase(two.begin());
  RunningProcess ddp_two("diloco-launch", With(two, {"--mode", "ddp"}));
  ASSERT_EQ(ddp_two.Wait(240), 0) << ddp_two.output();
  EXPECT_NE(ddp_two.output().find("[rank-1] "), std::string::npos);
  EXPECT_NE(ddp_two.output().find("replica check: parameters identical on all 2 ranks after each of 30 inner steps"),
            std::string::npos)
      << ddp_two.output();
  const nlohmann::json c = ReadJson(two_dir + "/summary.json");
  const int64_t params = c["params"].get<int64_t>();
  EXPECT_EQ(params, a["params"].get<int64_t>());
  EXPECT_EQ(c["tokens"], 2 * 3 * 10 * 8 * 32);                         // ranks x rounds x H x batch x seq_len
  EXPECT_EQ(c["bytes_sent"].get<int64_t>(), 30 * 2 * 1 * 4 * params);  // steps x 2 (k - 1) x 4 bytes x params
  EXPECT_EQ(c["evals"].back()["bytes_communicated"], c["bytes_sent"]);
  // Twice the batch per step: a lower loss than one rank at the same step.
  EXPECT_LT(c["evals"].back()["val_loss"].get<double>(), b["evals"].back()["val_loss"].get<double>());
}

// In --mode ddp rank 0 evaluates alone (eval_every, here at round 0 and after round 1 of 2). The other ranks used to
// wait for it inside the next step's all-reduce, whose timeout is workers.cluster_timeout_s: an evaluation longer
// than that (a large model on the CPU: minutes) ended the run ("data-parallel run failed"). They now wait for it
// through the cluster's store. Here 30000 evaluation batches of the tiny model take several times the 3 s timeout.
TEST(DataParallel, AnEvaluationLongerThanTheCollectiveTimeoutDoesNotEndTheRun) {
  const std::string dir = ScratchDir("ddp_long_eval");
  std::vector<std::string> args = TinyArgs(dir, {"workers.cluster_timeout_s=3", "coordinator.eval_batches=30000",
                                                 "outer.rounds=2", "coordinator.eval_every=1"});
  args.erase(args.begin());
  RunningProcess ddp("diloco-launch", With(args, {"--mode", "ddp"}));
  ASSERT_EQ(ddp.Wait(240), 0) << ddp.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  ASSERT_EQ(summary["evals"].size(), 3u);
  EXPECT_EQ(summary["round"], 2);
  EXPECT_EQ(summary["phase"], "complete");
}

}  // namespace
}  // namespace diloco::testing
