// workers.device, --device and coordinator.device at start-up (real processes): a device this build or machine lacks
// is one line naming the key, what was asked and what is available, and exit 2, before any data or network work;
// never a crash in the first step. On a machine with GPUs the same asks past its device count still fail this way.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

// The one error line of a process's output that contains `what`, or "".
std::string LineWith(const std::string& output, const std::string& what) {
  const size_t at = output.find(what);
  if (at == std::string::npos) return "";
  const size_t begin = output.rfind('\n', at) == std::string::npos ? 0 : output.rfind('\n', at) + 1;
  return output.substr(begin, output.find('\n', at) - begin);
}

TEST(Device, CudaTheMachineLacksIsOneLineAndExit2) {
  const std::string dir = ScratchDir("device_missing");
  const std::string far = "cuda:" + std::to_string(torch::cuda::device_count() + 7);  // past any machine's count
  struct Ask {
    std::vector<std::string> args;
    std::string line;
  };
  std::vector<Ask> asks = {
      {With(TinyArgs(dir, {"workers.device=" + far}), {"--coordinator", "127.0.0.1:1", "--id", "w0"}),
       "workers.device: '" + far + "' requested but "},
      {With(TinyArgs(dir), {"--coordinator", "127.0.0.1:1", "--id", "w0", "--device", far}),
       "--device: '" + far + "' requested but "},
  };
  if (!torch::cuda::is_available()) {
    asks.push_back({With(TinyArgs(dir, {"workers.device=cuda"}), {"--coordinator", "127.0.0.1:1", "--id", "w0"}),
                    "workers.device: 'cuda' (cuda:0 for local rank 0) requested but "});
  }
  for (const Ask& ask : asks) {
    RunningProcess worker("diloco-worker", ask.args);
    EXPECT_EQ(worker.Wait(60), 2) << worker.output();
    const std::string line = LineWith(worker.output(), ask.line);
    EXPECT_NE(line, "") << worker.output();
    EXPECT_NE(line.find("; available: cpu"), std::string::npos) << line;
    EXPECT_EQ(worker.output().find("inner steps"), std::string::npos) << "trained before refusing";
  }
  RunningProcess coordinator("diloco-coordinator", TinyArgs(dir, {"coordinator.device=" + far}));
  EXPECT_EQ(coordinator.Wait(60), 2) << coordinator.output();
  EXPECT_NE(LineWith(coordinator.output(), "coordinator.device: '" + far + "' requested but "), "")
      << coordinator.output();
}

// Which local rank workers.device cuda uses (worker/lm/device_choice.h), seen where this build has no GPU to give:
// --local-rank, else LOCAL_RANK, else --rank; and diloco-launch passes each worker its index on the machine (worker-1
// asks for cuda:1, not cuda:0 as every single worker did).
TEST(Device, LocalRankComesFromTheFlagTheEnvironmentOrTheLauncher) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is there: workers.device cuda succeeds";
  const std::string dir = ScratchDir("device_local_rank");
  const auto args = With(TinyArgs(dir, {"workers.device=cuda"}), {"--coordinator", "127.0.0.1:1", "--id", "w0"});
  auto refused_for = [](RunningProcess& worker, int local_rank) {
    EXPECT_EQ(worker.Wait(60), 2) << worker.output();
    const std::string r = std::to_string(local_rank);
    EXPECT_NE(worker.output().find("workers.device: 'cuda' (cuda:" + r + " for local rank " + r + ") requested"),
              std::string::npos)
        << worker.output();
  };
  RunningProcess flag("diloco-worker", With(args, {"--local-rank", "3"}));
  refused_for(flag, 3);
  setenv("LOCAL_RANK", "2", 1);
  RunningProcess env("diloco-worker", args);
  RunningProcess both("diloco-worker", With(args, {"--local-rank", "5"}));
  unsetenv("LOCAL_RANK");
  refused_for(env, 2);
  refused_for(both, 5);

  std::vector<std::string> launch_args = TinyArgs(ScratchDir("device_launch_local_rank"), {"outer.rounds=1000"});
  launch_args.erase(launch_args.begin());  // the launcher takes the config as a positional argument
  RunningProcess launch("diloco-launch", With(launch_args, {"--worker-set", "1:workers.device=cuda"}));
  EXPECT_EQ(launch.Wait(180), 2) << launch.output();
  EXPECT_NE(launch.output().find("worker-1: workers.device: 'cuda' (cuda:1 for local rank 1) requested"),
            std::string::npos)
      << launch.output();
}

TEST(Device, NotADeviceNameIsAConfigError) {
  const std::string dir = ScratchDir("device_name");
  RunningProcess worker("diloco-worker",
                        With(TinyArgs(dir, {"workers.device=gpu0"}), {"--coordinator", "127.0.0.1:1", "--id", "w0"}));
  EXPECT_EQ(worker.Wait(60), 2) << worker.output();
  EXPECT_NE(worker.output().find("workers.device: must be cpu, cuda or cuda:N, got 'gpu0'"), std::string::npos)
      << worker.output();
}

}  // namespace
}  // namespace diloco::testing
