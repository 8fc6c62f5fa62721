// An operator checkpoint outlived by a SIGTERM (issue 27): the Checkpoint RPC runs on the service's checkpoint
// executor (coordinator/service.h), which the coordinator joins before it destroys the core. So a SIGTERM that lands
// while a large checkpoint is being written stops the coordinator only once the file is complete: the process exits
// with its stopped code (130, as after any SIGTERM), the operator's `diloco-ctl checkpoint` gets its reply, no
// "<path>.tmp" is left behind and the file loads and verifies (magic, sizes, checksum). scripts/check-asan runs this
// test against an AddressSanitizer build, where a use after free of the core or the reactor would be reported.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <regex>
#include <string>
#include <thread>

#include "proto/checkpoint.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

// About 197M parameters (12 x d_model^2 per layer): an fp32 theta of ~790 MB, whose write takes seconds (longer than
// the 2 s the coordinator once gave gRPC calls at shutdown). No evaluation: only theta_0 is built.
const std::vector<std::string> kLargeModel = {"model.d_model=1280", "model.n_head=10", "model.n_layer=10",
                                              "coordinator.eval_every=0"};
constexpr int kExitStopped = 130;  // the coordinator's exit code after SIGINT/SIGTERM

// Polls until `path` exists or the process ends; false when it never appeared.
bool WaitForFile(RunningProcess& process, const std::string& path, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline && process.Running()) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::filesystem::exists(path);
}

// The "checkpoint: PATH (round R, M MB in S s, ...)" line's seconds, or -1.
double WriteSeconds(const std::string& log) {
  std::smatch m;
  static const std::regex kLine(R"(checkpoint: \S+ \(round \d+, \d+ MB in ([0-9.]+) s)");
  return std::regex_search(log, m, kLine) ? std::stod(m[1]) : -1;
}

TEST(CheckpointShutdownTest, SigtermWhileAnOperatorCheckpointIsWrittenLeavesItComplete) {
  const std::string dir = ScratchDir("checkpoint_shutdown");
  const std::string port_file = dir + "/port";
  RunningProcess coordinator("diloco-coordinator", With(TinyArgs(dir, kLargeModel), {"--port-file", port_file}));
  const std::string address = WaitForAddress(coordinator, port_file);
  ASSERT_FALSE(address.empty()) << coordinator.output();

  const std::string path = CheckpointPath(dir + "/checkpoints", 0);
  RunningProcess ctl("diloco-ctl", {"checkpoint", "--addr", address, "--timeout", "120"});
  // The write has begun once its temporary file exists: signal then, while the file is being written.
  ASSERT_TRUE(WaitForFile(coordinator, path + ".tmp", 120)) << coordinator.output();
  const bool signalled_mid_write = !std::filesystem::exists(path);
  coordinator.Signal(SIGTERM);

  EXPECT_EQ(coordinator.Wait(180), kExitStopped) << coordinator.output();
  EXPECT_EQ(ctl.Wait(60), 0) << ctl.output();
  EXPECT_NE(ctl.output().find("checkpoint of round 0: " + path), std::string::npos) << ctl.output();
  EXPECT_TRUE(signalled_mid_write) << "the checkpoint was written before the signal: make the model larger";
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto loaded = LoadCheckpoint(path);  // magic, version, sizes and the checksum
  ASSERT_TRUE(loaded.ok()) << loaded.status() << "\n" << coordinator.output();
  EXPECT_EQ(loaded->round, 0);
  int64_t elements = 0;
  for (const auto& [name, t] : loaded->params) elements += t.numel();
  EXPECT_GT(elements, 190'000'000);
  std::cout << "[measure] checkpoint write (" << elements << " parameters): " << WriteSeconds(coordinator.output())
            << " s" << std::endl;
}

}  // namespace
}  // namespace diloco::testing
