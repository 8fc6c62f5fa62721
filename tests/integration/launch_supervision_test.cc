// diloco-launch supervises its run (scripts/launch/supervision.h), with the real binaries: a worker that exits with a
// configuration error at start-up, or every worker killed while rounds are left, ends the launch with one error line
// and a non-zero exit, and no coordinator is left running.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

// The live processes whose parent is `parent` and whose name (/proc/PID/comm) is `name`.
std::vector<pid_t> ChildrenNamed(pid_t parent, const std::string& name) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');  // "PID (COMM) STATE PPID ...": COMM may hold spaces
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    const size_t open = line.find('(');
    if (ppid == parent && state != "Z" && line.substr(open + 1, close - open - 1) == name) found.push_back(pid);
  }
  closedir(proc);
  return found;
}

// Lines of `text` that contain `part`.
std::vector<std::string> LinesWith(const std::string& text, const std::string& part) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find(part) != std::string::npos) lines.push_back(line);
  }
  return lines;
}

// The coordinator of the run in `dir` no longer answers (the launcher stopped and reaped it).
void ExpectCoordinatorGone(const std::string& dir) {
  const std::string addr = ReadFile(dir + "/coordinator.addr");
  ASSERT_FALSE(addr.empty()) << "the coordinator never listened";
  RunningProcess ctl("diloco-ctl", {"status", "--addr", addr.substr(0, addr.find('\n')), "--timeout", "2"});
  EXPECT_NE(ctl.Wait(30), 0) << "the coordinator still answers after the launcher ended:\n" << ctl.output();
}

// The launcher's arguments for config/tiny.yaml with a long run (rounds stay left) in `dir`.
std::vector<std::string> LongRun(const std::string& dir) {
  std::vector<std::string> args = TinyArgs(dir, {"outer.rounds=1000"});
  args.erase(args.begin());  // the launcher takes the config as a positional argument
  return args;
}

// workers.device cuda:1000 passes the launcher's config check (the syntax is right) and fails in worker-1 when it
// chooses its device at start-up, on either LibTorch build: the CPU build has no CUDA, and no machine has 1001 GPUs.
// worker-0 trains on; the launch still ends, with worker-1's line.
TEST(LaunchSupervision, AWorkersConfigErrorEndsTheLaunch) {
  const std::string dir = ScratchDir("launch_worker_config_error");
  RunningProcess launch("diloco-launch", With(LongRun(dir), {"--worker-set", "1:workers.device=cuda:1000"}));
  ASSERT_EQ(launch.Wait(180), 2) << launch.output();
  const std::string out = launch.output();
  const std::vector<std::string> fatal = LinesWith(out, "diloco-launch: error: ");
  ASSERT_EQ(fatal.size(), 1u) << out;
  EXPECT_EQ(fatal[0].rfind("diloco-launch: error: worker-1: workers.device: 'cuda:1000' requested but ", 0), 0u) << out;
  EXPECT_NE(out.find("[launch] worker-1 exited with a configuration error: stopping workers and coordinator"),
            std::string::npos)
      << out;
  ExpectCoordinatorGone(dir);
}

// A worker the coordinator refuses at Join (here its model.d_model differs) under min_workers 2: no round can close
// without it and nothing restarts it, so the launch ends with its refusal line and exit 2. Before, it waited forever.
TEST(LaunchSupervision, ARefusedWorkerWithoutWhichNoRoundClosesEndsTheLaunch) {
  const std::string dir = ScratchDir("launch_worker_refused");
  RunningProcess launch("diloco-launch", With(LongRun(dir), {"--worker-set", "1:model.d_model=64"}));
  ASSERT_EQ(launch.Wait(180), 2) << launch.output();
  const std::string out = launch.output();
  const std::vector<std::string> fatal = LinesWith(out, "diloco-launch: error: ");
  ASSERT_EQ(fatal.size(), 1u) << out;
  EXPECT_NE(fatal[0].find("diloco-launch: error: worker-1: coordinator 127.0.0.1:"), std::string::npos) << out;
  EXPECT_NE(fatal[0].find("refused worker worker-1: model config differs"), std::string::npos) << out;
  EXPECT_NE(fatal[0].find("(1 worker(s) still running, fewer than coordinator.min_workers 2: no round could close)"),
            std::string::npos)
      << out;
  ExpectCoordinatorGone(dir);
}

// kill -9 of every worker (the launcher's diloco-worker children) after a round: the run has rounds left and nobody
// to train them, so the launch ends with exit 3 and a line that says so.
TEST(LaunchSupervision, EveryWorkerKilledEndsTheLaunch) {
  const std::string dir = ScratchDir("launch_workers_killed");
  RunningProcess launch("diloco-launch", LongRun(dir));
  ASSERT_TRUE(launch.WaitForOutput("round 1/1000 closed", 180)) << launch.output();
  const std::vector<pid_t> workers = ChildrenNamed(launch.pid(), "diloco-worker");
  ASSERT_EQ(workers.size(), 2u) << launch.output();
  for (pid_t pid : workers) ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(launch.Wait(120), 3) << launch.output();
  const std::string out = launch.output();
  const std::vector<std::string> fatal = LinesWith(out, "diloco-launch: error: ");
  ASSERT_EQ(fatal.size(), 1u) << out;
  EXPECT_EQ(fatal[0],
            "diloco-launch: error: every worker has exited (worker-0: code 137 (signal 9), worker-1: code 137 (signal "
            "9)) and the run has rounds left; the coordinator was stopped")
      << out;
  ExpectCoordinatorGone(dir);
}

}  // namespace
}  // namespace diloco::testing
