// Sparse pulls end to end (proto/PROTOCOL.md "Sparse pulls"): a real diloco-coordinator and real diloco-worker
// processes train with comm.codec topk and SparseLoCo's outer step (SGD, momentum 0, lr 1). Worker w0 runs every
// round and, after its first whole pull, pulls only each round's update: the test asserts each of those pulls is at
// most 1/50 of theta's fp32 bytes, that w0's theta hash after each one is the coordinator's (the worker checks it and
// prints it), and that its last one equals XXH64 of the theta in the coordinator's final checkpoint (computed here,
// independently of the worker). Worker w1 joins mid-run: its first pull is whole (it held no theta), later ones
// sparse. In a second run w0 has comm.sparse_pulls false (the others true): it pulls whole every round.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "proto/checkpoint.h"
#include "proto/sparse_update.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

constexpr int kRounds = 7;  // w1 joins after round 2; a loaded machine may let w0 close a round or two more first

std::vector<std::string> SparseArgs(const std::string& dir, bool sparse) {
  return TinyArgs(dir, {"comm.codec=topk", "outer.optimizer=sgd", "outer.momentum=0", "outer.lr=1",
                        "outer.rounds=" + std::to_string(kRounds), "coordinator.min_workers=1", "model.d_model=128",
                        "coordinator.lease_s=120", std::string("comm.sparse_pulls=") + (sparse ? "true" : "false")});
}

struct SparsePull {
  int64_t round = 0;
  int64_t bytes = 0;
  std::string hash;
};

std::vector<SparsePull> SparsePulls(const std::string& log) {
  static const std::regex line(
      R"(round (\d+): sparse pull, \d+ changed values in (\d+) bytes; theta hash ([0-9a-f]{16}))");
  std::vector<SparsePull> out;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it) {
    out.push_back({std::stoll((*it)[1]), std::stoll((*it)[2]), (*it)[3]});
  }
  return out;
}

struct RunOutput {
  std::string w0, w1;
  nlohmann::json summary;
  std::string checkpoints;
};

// `w0_sets`: --set overrides of w0 alone.
RunOutput TrainWithAJoiner(const std::string& name, bool sparse, const std::vector<std::string>& w0_sets = {}) {
  const std::string dir = ScratchDir(name);
  const std::vector<std::string> args = SparseArgs(dir, sparse);
  RunningProcess coordinator("diloco-coordinator", With(args, {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  EXPECT_FALSE(address.empty()) << coordinator.output();
  if (address.empty()) return {};
  std::vector<std::string> w0_args = With(args, {"--coordinator", address, "--id", "w0"});
  for (const std::string& set : w0_sets) w0_args = With(w0_args, {"--set", set});
  RunningProcess w0("diloco-worker", w0_args);
  // w1 joins once round 2 has closed: it holds no theta, so it pulls all of it. w0 is held (SIGSTOP; the long lease
  // keeps it a member) until w1 has joined: on a loaded machine w1's start could outlast w0's remaining rounds.
  EXPECT_TRUE(coordinator.WaitForOutput("round 2/", 240)) << coordinator.output();
  w0.Signal(SIGSTOP);
  RunningProcess w1("diloco-worker", With(args, {"--coordinator", address, "--id", "w1"}));
  EXPECT_TRUE(w1.WaitForOutput(" joined ", 240)) << w1.output();
  w0.Signal(SIGCONT);
  EXPECT_EQ(w0.Wait(300), 0) << w0.output();
  EXPECT_EQ(w1.Wait(300), 0) << w1.output();
  EXPECT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  return {w0.output(), w1.output(), ReadJson(dir + "/summary.json"), dir + "/checkpoints"};
}

TEST(SparsePull, AWorkerPullsOnlyTheUpdateAndEndsBitIdenticalToTheCoordinator) {
  const RunOutput run = TrainWithAJoiner("sparse_pull", true);
  ASSERT_TRUE(run.summary.is_object());
  ASSERT_EQ(run.summary["round"].get<int64_t>(), kRounds);
  const int64_t fp32_bytes = 4 * run.summary["params"].get<int64_t>();

  const std::vector<SparsePull> w0 = SparsePulls(run.w0);
  ASSERT_EQ(w0.size(), static_cast<size_t>(kRounds)) << run.w0;  // every exchange pull after the first whole one
  for (size_t i = 0; i < w0.size(); ++i) {
    EXPECT_EQ(w0[i].round, static_cast<int64_t>(i) + 1);
    EXPECT_LE(w0[i].bytes * 50, fp32_bytes)
        << "round " << w0[i].round << ": " << w0[i].bytes << " bytes of " << fp32_bytes;
    std::printf("[sparse pull] round %lld: %lld bytes, 1/%.1f of fp32 (%lld bytes)\n",
                static_cast<long long>(w0[i].round), static_cast<long long>(w0[i].bytes),
                static_cast<double>(fp32_bytes) / static_cast<double>(w0[i].bytes), static_cast<long long>(fp32_bytes));
  }
  // The final theta, from the coordinator's own checkpoint, hashed here.
  std::vector<std::string> skipped;
  auto last = LoadNewestCheckpoint(run.checkpoints, &skipped);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(last->data.round, kRounds);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(ThetaHash(last->data.params)));
  EXPECT_EQ(w0.back().hash, std::string(hex));

  // The joiner: one whole pull (its bytes_pulled holds theta's fp32 bytes at least), then only sparse ones.
  const std::vector<SparsePull> w1 = SparsePulls(run.w1);
  ASSERT_FALSE(w1.empty()) << run.w1;
  EXPECT_GE(w1.front().round, 3);
  int64_t w1_pulled = -1;
  for (const auto& w : run.summary["workers"]) {
    if (w["id"] == "w1") w1_pulled = w["bytes_pulled"].get<int64_t>();
  }
  EXPECT_GE(w1_pulled, fp32_bytes);
  EXPECT_LT(w1_pulled, 2 * fp32_bytes);
}

// comm.sparse_pulls false on a worker (here w0 alone; the coordinator and w1 have them on): its every pull is whole.
// Before, a worker asked for sparse pulls whatever its own setting said.
TEST(SparsePull, SwitchedOffOnAWorkerEveryPullOfItsIsWhole) {
  const RunOutput run = TrainWithAJoiner("sparse_pull_off", true, {"comm.sparse_pulls=false"});
  ASSERT_TRUE(run.summary.is_object());
  EXPECT_TRUE(SparsePulls(run.w0).empty());
  EXPECT_FALSE(SparsePulls(run.w1).empty()) << run.w1;
  const int64_t fp32_bytes = 4 * run.summary["params"].get<int64_t>();
  for (const auto& w : run.summary["workers"]) {
    if (w["id"] == "w0") EXPECT_GE(w["bytes_pulled"].get<int64_t>(), (kRounds + 1) * fp32_bytes);
  }
}

}  // namespace
}  // namespace diloco::testing
