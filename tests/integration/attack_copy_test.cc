// The test-only copy attack end to end (issue 32 item 5, worker/attack.h): a real diloco-coordinator on
// config/tiny.yaml and three real diloco-worker processes: w0 writes each pushed pseudo-gradient with --dump-delta,
// w1 is honest, and `copier` pushes w0's delta of the same round (--attack copy:PATH) with its own token count. The
// coordinator measures each push's norm from what it received: the copier's equals w0's in the last round (the same
// values, folded the same way) and differs from w1's, and every member's push counted in every round.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

constexpr int kRounds = 3;

TEST(AttackCopy, TheCopierPushesTheDumpersDeltaOfTheRound) {
  const std::string dir = ScratchDir("attack_copy");
  const std::vector<std::string> args =
      TinyArgs(dir, {"outer.rounds=" + std::to_string(kRounds), "workers.count=3", "coordinator.min_workers=3"});
  RunningProcess coordinator("diloco-coordinator", With(args, {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  const std::string dump = dir + "/w0.delta";
  RunningProcess copier("diloco-worker",
                        With(args, {"--coordinator", address, "--id", "copier", "--attack", "copy:" + dump}));
  RunningProcess w0("diloco-worker", With(args, {"--coordinator", address, "--id", "w0", "--dump-delta", dump}));
  RunningProcess w1("diloco-worker", With(args, {"--coordinator", address, "--id", "w1"}));
  EXPECT_EQ(w0.Wait(240), 0) << w0.output();
  EXPECT_EQ(w1.Wait(240), 0) << w1.output();
  EXPECT_EQ(copier.Wait(60), 0) << copier.output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  EXPECT_EQ(copier.output().find("holds no delta of this layout"), std::string::npos) << copier.output();
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  ASSERT_TRUE(summary.is_object()) << coordinator.output();
  EXPECT_EQ(summary["round"].get<int64_t>(), kRounds);
  double norm_w0 = 0, norm_w1 = 0, norm_copier = 0;
  for (const auto& w : summary["workers"]) {
    EXPECT_EQ(w["rounds_contributed"].get<int64_t>(), kRounds) << w.dump();
    const double norm = w["last_push_norm"].get<double>();
    if (w["id"] == "w0") norm_w0 = norm;
    if (w["id"] == "w1") norm_w1 = norm;
    if (w["id"] == "copier") norm_copier = norm;
  }
  EXPECT_GT(norm_w0, 0);
  EXPECT_DOUBLE_EQ(norm_copier, norm_w0) << summary.dump();
  EXPECT_NE(norm_w1, norm_w0) << summary.dump();
}

}  // namespace
}  // namespace diloco::testing
