// Heterogeneous workers end to end (real coordinator and worker processes on 127.0.0.1): per-worker settings from
// the launcher (--worker-set), DyLU (inner.adaptive_steps) and asynchronous rounds with Delayed Nesterov.
// Worker 1 runs with workers.slowdown 4 (each inner step takes 4x its compute time). Speeds and wall times are
// measured by scripts/bench/hetero, not here; these tests check what the modes do.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

std::vector<std::string> LaunchArgs(const std::string& dir, std::vector<std::string> extra, int rounds = 4) {
  extra.insert(extra.end(), {"coordinator.min_workers=2", "outer.rounds=" + std::to_string(rounds), "inner.steps=20"});
  std::vector<std::string> args = TinyArgs(dir, extra);
  args.erase(args.begin());  // the launcher takes the config as a positional argument
  args.insert(args.end(), {"--worker-set", "1:workers.slowdown=4"});
  return args;
}

const nlohmann::json& WorkerNamed(const nlohmann::json& summary, const std::string& id) {
  for (const auto& w : summary["workers"]) {
    if (w["id"] == id) return w;
  }
  static const nlohmann::json none;
  ADD_FAILURE() << "no " << id << " in " << summary.dump();
  return none;
}

// With DyLU the coordinator measures both workers after round 1 and gives the slow one (about 4x slower) a
// fraction of H = 20 inner steps; the fast one keeps 20. The run completes and its loss falls. The slow worker's own
// config says inner.adaptive_steps false: it trains the H it is given all the same (it read fewer tokens). Before, a
// worker trained the coordinator's H only when its own config said adaptive_steps too.
TEST(Hetero, AdaptiveStepsGiveTheSlowWorkerFewerInnerSteps) {
  const std::string dir = ScratchDir("hetero_dylu");
  RunningProcess launch("diloco-launch", With(LaunchArgs(dir, {"inner.adaptive_steps=true"}),
                                              {"--worker-set", "1:inner.adaptive_steps=false"}));
  ASSERT_EQ(launch.Wait(240), 0) << launch.output();
  EXPECT_NE(launch.output().find("DyLU: worker worker-1 trains"), std::string::npos) << launch.output();
  const nlohmann::json s = ReadJson(dir + "/summary.json");
  EXPECT_EQ(WorkerNamed(s, "worker-0")["inner_steps"], 20);
  EXPECT_LE(WorkerNamed(s, "worker-1")["inner_steps"].get<int64_t>(), 12);  // ~ 20 / 4; a wide margin for noise
  EXPECT_LT(WorkerNamed(s, "worker-1")["tokens"].get<int64_t>(), WorkerNamed(s, "worker-0")["tokens"].get<int64_t>());
  EXPECT_LT(s["evals"].back()["val_loss"].get<double>(), s["evals"].front()["val_loss"].get<double>() - 0.2);
}

// Asynchronous rounds: 16 versions (outer.rounds x workers.count); every push the workers made is applied (pushes
// that commit together are averaged into one version, so there can be more pushes than versions); the fast worker
// pushes more often than the slow one, no push waits for another worker, and the loss falls.
// Why 16 versions: a round here takes ~30 ms, so the slow worker's push lands 4-7 versions after the one it was
// computed against (more when a push refused during a step waits out its 0.1-0.2 s retry backoff), and such a stale
// push can raise the validation loss by 0.3-0.9 at the version it lands (measured). After 8 versions the loss is
// ~3.8-4.3 and one landing last once left it at 4.76 (CI, stop 47); after 16 it is ~3.5-3.7 (this test's run repeated
// 10 times beside four busy loops), far enough below the 4.65 asserted that a late stale push cannot reach it.
TEST(Hetero, AsyncRoundsApplyEveryPushAndTheFastWorkerPushesMoreOften) {
  const std::string dir = ScratchDir("hetero_async");
  RunningProcess launch("diloco-launch", LaunchArgs(dir, {"outer.mode=async", "outer.delay_n=2"}, /*rounds=*/8));
  ASSERT_EQ(launch.Wait(240), 0) << launch.output();
  EXPECT_NE(launch.output().find("asynchronous rounds: Delayed Nesterov, momentum every 2 pushes"), std::string::npos)
      << launch.output();
  const nlohmann::json s = ReadJson(dir + "/summary.json");
  EXPECT_EQ(s["round"], 16);
  EXPECT_EQ(s["rounds_total"], 16);
  const int64_t fast = WorkerNamed(s, "worker-0")["rounds_contributed"].get<int64_t>();
  const int64_t slow = WorkerNamed(s, "worker-1")["rounds_contributed"].get<int64_t>();
  int64_t applied = 0;
  int64_t closes = 0;
  const std::string out = launch.output();
  const std::regex close_line(R"(round \d+/16 closed \(async: (\d+) push\(es\) arrived\))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), close_line); it != std::sregex_iterator(); ++it) {
    applied += std::stoll((*it)[1].str());
    ++closes;
  }
  EXPECT_EQ(closes, 16) << out;
  EXPECT_GE(fast + slow, 16);
  EXPECT_EQ(fast + slow, applied) << out;
  EXPECT_GT(fast, slow);
  EXPECT_LT(s["evals"].back()["val_loss"].get<double>(), s["evals"].front()["val_loss"].get<double>() - 0.2);
}

// A --worker-set (or test-only --worker-arg) for a worker that does not exist, or a bad key, is one clear line and
// exit 2.
TEST(Hetero, BadWorkerSetIsOneClearLine) {
  const std::string dir = ScratchDir("hetero_bad");
  std::vector<std::string> args = TinyArgs(dir, {});
  args.erase(args.begin());
  RunningProcess out_of_range("diloco-launch", With(args, {"--worker-set", "5:workers.slowdown=2"}));
  EXPECT_EQ(out_of_range.Wait(60), 2);
  EXPECT_NE(out_of_range.output().find("--worker-set 5:workers.slowdown=2: expected I:section.key=value with I in "
                                       "[0, 2)"),
            std::string::npos)
      << out_of_range.output();
  RunningProcess bad_value("diloco-launch", With(args, {"--worker-set", "1:workers.slowdown=0.5"}));
  EXPECT_EQ(bad_value.Wait(60), 2);
  EXPECT_NE(bad_value.output().find("error: worker 1: "), std::string::npos) << bad_value.output();
  EXPECT_NE(bad_value.output().find("workers.slowdown: must be >= 1, got 0.5"), std::string::npos)
      << bad_value.output();
  RunningProcess bad_arg("diloco-launch", With(args, {"--worker-arg", "2:--attack=stale"}));
  EXPECT_EQ(bad_arg.Wait(60), 2);
  EXPECT_NE(bad_arg.output().find("--worker-arg 2:--attack=stale: expected I:ARG with I in [0, 2)"), std::string::npos)
      << bad_arg.output();
}

// workers.precision bf16 (autocast of the inner forward pass; on CPU here, on CUDA the same code): the run trains to
// within 2% of the fp32 run's validation loss on the same seed and steps, and differs from it (autocast took effect).
TEST(Hetero, Bf16AutocastTrainsWithinTwoPercentOfFp32) {
  auto run = [](const std::string& name, const std::string& precision) {
    const std::string dir = ScratchDir(name);
    std::vector<std::string> args = TinyArgs(dir, {"workers.precision=" + precision});
    args.erase(args.begin());
    RunningProcess launch("diloco-launch", args);
    EXPECT_EQ(launch.Wait(240), 0) << launch.output();
    return ReadJson(dir + "/summary.json")["evals"].back()["val_loss"].get<double>();
  };
  const double fp32 = run("precision_fp32", "fp32");
  const double bf16 = run("precision_bf16", "bf16");
  EXPECT_NEAR(bf16, fp32, 0.02 * fp32);
  EXPECT_NE(bf16, fp32);
}

// Memory settings per worker (docs/models-and-data.md "Bigger batches on a small device"): worker 0 accumulates
// micro-batches of 2 with
// activation checkpointing, worker 1 micro-batches of 4 (inner.batch_size 8). Each step is still the whole batch's,
// so the run ends at the plain run's validation loss, to the fp32 rounding that AdamW and the rounds carry along
// (measured: 4.3489057 against 4.3489059, 5e-8 relative; the bound is 1e-4).
TEST(Hetero, MicroBatchesAndCheckpointingTrainToThePlainLoss) {
  auto run = [](const std::string& name, const std::vector<std::string>& worker_sets) {
    const std::string dir = ScratchDir(name);
    std::vector<std::string> args = TinyArgs(dir, {});
    args.erase(args.begin());
    for (const std::string& ws : worker_sets) args.insert(args.end(), {"--worker-set", ws});
    RunningProcess launch("diloco-launch", args);
    EXPECT_EQ(launch.Wait(240), 0) << launch.output();
    return ReadJson(dir + "/summary.json")["evals"].back()["val_loss"].get<double>();
  };
  const double plain = run("memory_plain", {});
  const double accumulated =
      run("memory_accumulated",
          {"0:inner.micro_batch_size=2", "0:model.activation_checkpointing=true", "1:inner.micro_batch_size=4"});
  EXPECT_NEAR(accumulated, plain, 1e-4 * plain);
}

}  // namespace
}  // namespace diloco::testing
