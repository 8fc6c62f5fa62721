// The coordinator's memory at a model size where the fixed overhead does not dominate (issue 18): its peak RSS
// (VmHWM) stays within the process's fixed overhead plus 3.5 copies of the fp32 parameters (theta, the outer momentum,
// the round accumulator, and half a copy for everything else), through evaluation, checkpoints and a resume.
// A real diloco-coordinator of a ~55M-parameter model (eval and checkpoint every round) is driven by diloco-bench-push
// (2 simulated workers pushing random fp32 pseudo-gradients, 3 rounds); VmHWM is read from /proc/PID/status every
// 20 ms until the process exits (the last reading counts). The fixed overhead is the VmHWM of the same coordinator
// command with config/tiny.yaml's model (~27k parameters), driven the same way in the same test. Then the big
// coordinator is restarted on its checkpoint for one more round, under the same bound.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

constexpr double kMaxCopies = 3.5;  // issue 18: theta, momentum, accumulator, and half a copy for the rest

// vocab 4096, seq 128, 8 layers, d_model 1024: 105,097,216 parameters (420 MB of fp32), checked against the params
// the bench reports. Large enough that the half copy left for everything else (210 MB) holds what does not grow with
// the model: gRPC's message buffers and what tcmalloc keeps of them, which varied by ~80 MB with the machine's load
// (at 54.7M parameters a loaded run measured 3.60 copies where quiet runs measured 3.1-3.3). inner.batch_size 1: the
// evaluation batch (the coordinator evaluates inner.batch_size sequences).
const std::vector<std::string> kBigModel = {"model.vocab_size=4096", "model.seq_len=128", "model.n_layer=8",
                                            "model.n_head=8", "model.d_model=1024"};

struct Driven {
  int64_t hwm_kb = -1;  // the coordinator's last VmHWM reading before it exited
  int64_t params = 0;   // as diloco-bench-push counted them
  int64_t rounds = 0;   // the coordinator's summary.json round at the end
};

// Starts diloco-coordinator with TinyArgs(dir, sets) (plus --fresh if asked), drives it with diloco-bench-push
// (2 workers, bench_rounds rounds) and samples the coordinator's VmHWM until it exits. Fails the test on any error.
Driven Drive(const std::string& dir, const std::vector<std::string>& sets, bool fresh, int bench_rounds) {
  Driven d;
  const std::string port_file = dir + "/addr";
  std::filesystem::remove(port_file);
  std::vector<std::string> args = With(TinyArgs(dir, sets), {"--port-file", port_file});
  if (fresh) args.push_back("--fresh");
  RunningProcess coordinator("diloco-coordinator", args);
  const pid_t pid = coordinator.pid();
  const std::string address = WaitForAddress(coordinator, port_file);
  EXPECT_FALSE(address.empty()) << coordinator.output();
  if (address.empty()) return d;
  RunningProcess bench("diloco-bench-push", With(TinyArgs(dir, sets), {"--coordinator", address, "--workers", "2",
                                                                       "--rounds", std::to_string(bench_rounds)}));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  while (coordinator.Running() && std::chrono::steady_clock::now() < deadline) {
    if (const int64_t kb = VmHwmKb(pid); kb > 0) d.hwm_kb = kb;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(coordinator.Wait(10), 0) << coordinator.output();
  EXPECT_EQ(bench.Wait(30), 0) << bench.output();
  std::istringstream lines(bench.output());
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] == '{') d.params = nlohmann::json::parse(line)["params"].get<int64_t>();
  }
  d.rounds = ReadJson(dir + "/summary.json")["round"].get<int64_t>();
  return d;
}

// Prints the measurement and checks hwm <= overhead + kMaxCopies x 4 bytes x params.
void ExpectWithinBound(const char* phase, const Driven& big, int64_t overhead_kb) {
  const double params_mb = 4.0 * static_cast<double>(big.params) / (1 << 20);
  const double hwm_mb = static_cast<double>(big.hwm_kb) / 1024, overhead_mb = static_cast<double>(overhead_kb) / 1024;
  const double bound_mb = overhead_mb + kMaxCopies * params_mb;
  const double copies = (hwm_mb - overhead_mb) / params_mb;
  std::printf(
      "%s: %lld params (%.1f MiB fp32): peak RSS %.1f MiB = overhead %.1f MiB + %.2f copies; bound %.1f MiB "
      "(%.1f copies)\n",
      phase, static_cast<long long>(big.params), params_mb, hwm_mb, overhead_mb, copies, bound_mb, kMaxCopies);
  EXPECT_LE(hwm_mb, bound_mb) << phase << ": the coordinator held " << copies << " copies of the model, more than "
                              << kMaxCopies;
}

// What every run here shares: 2 workers, an evaluation (of 1 batch) and a checkpoint (keep 1) after every round,
// `rounds` rounds in all, and `model` (empty: config/tiny.yaml's).
std::vector<std::string> Sets(int rounds, const std::vector<std::string>& model) {
  std::vector<std::string> sets = {"coordinator.min_workers=2",
                                   "workers.count=2",
                                   "coordinator.eval_every=1",
                                   "coordinator.eval_batches=1",
                                   "coordinator.checkpoint_every=1",
                                   "coordinator.keep_checkpoints=1",
                                   "inner.batch_size=1",
                                   "outer.rounds=" + std::to_string(rounds)};
  sets.insert(sets.end(), model.begin(), model.end());
  return sets;
}

TEST(CoordinatorMemory, PeakRssWithinThreeAndAHalfCopiesThroughEvalCheckpointAndResume) {
  const Driven tiny = Drive(ScratchDir("coordinator_memory/tiny"), Sets(3, {}), /*fresh=*/true, 3);
  ASSERT_GT(tiny.hwm_kb, 0);
  ASSERT_EQ(tiny.rounds, 3);
  std::printf("fixed overhead (tiny model, %lld params): peak RSS %.1f MiB\n", static_cast<long long>(tiny.params),
              static_cast<double>(tiny.hwm_kb) / 1024);

  const std::string dir = ScratchDir("coordinator_memory/big");
  const Driven big = Drive(dir, Sets(3, kBigModel), /*fresh=*/true, 3);
  ASSERT_EQ(big.params, 105097216);
  ASSERT_EQ(big.rounds, 3);
  ExpectWithinBound("3 rounds", big, tiny.hwm_kb);

  // Resume from the round-3 checkpoint (no --fresh) for one more round: the load must not need a copy more.
  const Driven resumed = Drive(dir, Sets(4, kBigModel), /*fresh=*/false, 1);
  ASSERT_EQ(resumed.rounds, 4);
  ExpectWithinBound("resumed, 1 round", resumed, tiny.hwm_kb);
  std::filesystem::remove_all(dir + "/checkpoints");  // 438 MB each
}

}  // namespace
}  // namespace diloco::testing
