// diloco-launch: runs a whole DiLoCo run on one machine from one YAML file, as torchrun does for DDP.
// Tokenizes data.text into the token cache (once; cached), starts diloco-coordinator, waits until it listens,
// starts workers.count diloco-worker processes, prefixes every line they print with the process name, and exits 0
// once the coordinator has finished outer.rounds rounds and every worker has exited 0. A second launch with the same
// run.output_dir resumes from the coordinator's newest checkpoint; --fresh starts over. Ctrl-C (SIGINT) or SIGTERM
// stops the workers, then the coordinator, cleanly (SIGTERM, then SIGKILL after 10 s).
// It supervises the run (scripts/launch/supervision.h): a worker that exits with a configuration error, or every
// worker gone while the run has rounds left, ends the launch (the coordinator is stopped) with one error line; a
// worker that leaves or fails while others go on does not (elastic membership).
// Exit codes: 0 the run is complete and every process exited 0; 1 a process failed or could not start; 2 a
// configuration error, found by the launcher (config, --worker-set, token data) or by a worker at its start (the
// first such worker's error line is printed, prefixed with its name); 3 every worker exited while the run had rounds
// left; 130 SIGINT or SIGTERM. main() prints the one fatal line ("diloco-launch: error: ...") and picks the code.
// --mode ddp runs the data-parallel baseline instead (worker/data_parallel.h): workers.count x cluster_size ranks
// of diloco-worker --mode ddp meeting at a c10d store, no coordinator; it ends when every rank has exited.
// --check-config only loads and validates the config (the strict loader; missing input files warned) and exits: 0 if
// valid, 2 if not. A thin front end: it uses config/ only and starts the other binaries; it never links coordinator/ or
// worker/.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "config/cli_flags.h"
#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "scripts/launch/children.h"
#include "scripts/launch/supervision.h"

namespace {

using diloco::launch::Children;
using diloco::launch::Say;

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

struct Flags {
  std::string config_path;
  std::vector<std::string> overrides;
  bool fresh = false;
  std::string mode = "diloco";
  std::vector<std::string> worker_sets;
  std::vector<std::string> worker_args;  // test-only: I:ARG appended to worker I's command line
  bool check_config = false;
};

// Worker index -> what its command line adds: "--set" + each --worker-set override, then each --worker-arg.
using PerWorker = std::map<int64_t, std::vector<std::string>>;

void PrintSummary(const std::string& path) {
  std::ifstream in(path);
  if (!in) return;
  nlohmann::json s = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (s.is_discarded() || s["evals"].empty()) return;
  const auto& evals = s["evals"];
  char line[256];
  snprintf(line, sizeof(line), "done: %lld rounds; val_loss %.4f (round %lld) -> %.4f (round %lld); summary in %s",
           static_cast<long long>(s["round"].get<int64_t>()), evals.front()["val_loss"].get<double>(),
           static_cast<long long>(evals.front()["round"].get<int64_t>()), evals.back()["val_loss"].get<double>(),
           static_cast<long long>(evals.back()["round"].get<int64_t>()), path.c_str());
  Say(line);
}

// A TCP port free on 127.0.0.1 right now (the kernel picks it; it may be taken again before use, rarely).
int FreeLocalPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

// "I:REST" with 0 <= I < workers: (I, REST), or InvalidArgument naming `flag`.
absl::StatusOr<std::pair<int64_t, std::string>> SplitWorkerIndex(const std::string& flag, const std::string& text,
                                                                 int64_t workers) {
  const size_t colon = text.find(':');
  int64_t index = -1;
  try {
    index = colon == std::string::npos ? -1 : std::stoll(text.substr(0, colon));
  } catch (const std::exception&) {
  }
  if (index < 0 || index >= workers) {
    return absl::InvalidArgumentError(flag + " " + text +
                                      ": expected I:" + (flag == "--worker-set" ? "section.key=value" : "ARG") +
                                      " with I in [0, " + std::to_string(workers) + ")");
  }
  return std::make_pair(index, text.substr(colon + 1));
}

// --worker-set I:section.key=value: the overrides of each worker, whose resulting config is checked here; then
// --worker-arg I:ARG (test-only, e.g. 7:--attack=scale:-1000), passed through as they are.
absl::StatusOr<PerWorker> ParseWorkerSets(const Flags& flags, const diloco::Config& config) {
  std::map<int64_t, std::vector<std::string>> sets;
  for (const std::string& ws : flags.worker_sets) {
    auto split = SplitWorkerIndex("--worker-set", ws, config.workers.count);
    if (!split.ok()) return split.status();
    sets[split->first].push_back(split->second);
  }
  PerWorker per_worker;
  for (const auto& [index, own] : sets) {
    std::vector<std::string> all = flags.overrides;
    all.insert(all.end(), own.begin(), own.end());
    if (auto c = diloco::LoadConfig(flags.config_path, all); !c.ok()) {
      return absl::InvalidArgumentError("worker " + std::to_string(index) + ": " + std::string(c.status().message()));
    }
    for (const std::string& s : own) per_worker[index].insert(per_worker[index].end(), {"--set", s});
  }
  for (const std::string& wa : flags.worker_args) {
    auto split = SplitWorkerIndex("--worker-arg", wa, config.workers.count);
    if (!split.ok()) return split.status();
    per_worker[split->first].push_back(split->second);
  }
  return per_worker;
}

// Watches the children until the supervision decision ends the launch (supervision.h); returns the exit code of a run
// that ended by itself (0, or 1 if a process failed), else the status of the decision that stopped it.
absl::StatusOr<int> Supervise(Children& children, const diloco::SupervisionOptions& options) {
  int failures_said = 0;
  while (true) {
    const double now = diloco::launch::Now();
    children.Poll(now);
    diloco::SupervisionView view;
    view.signal = g_signal;
    view.coordinator = children.View(0);
    for (size_t i = 1; i < children.size(); ++i) view.workers.push_back(children.View(i));
    const diloco::SupervisionDecision decision = diloco::DecideSupervision(view, now, options);
    if (decision.action == diloco::SupervisionAction::kWait) {
      // A worker that failed while others go on is news; one that left with code 0 is not.
      const int failures = static_cast<int>(std::count_if(
          view.workers.begin(), view.workers.end(), [](const auto& w) { return !w.running && w.exit_code != 0; }));
      if (failures > failures_said) Say(decision.reason);
      failures_said = failures;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (decision.action == diloco::SupervisionAction::kStop || children.AnyRunning()) Say(decision.reason);
    children.StopAll();
    const int code = children.Reap();
    if (!decision.status.ok()) return decision.status;
    return code;
  }
}

// --mode ddp: ranks 0..n-1 of the data-parallel baseline; rank 0 hosts the c10d store and writes the summary.
// A rank that fails makes the others' next collective fail, so they all end.
absl::StatusOr<int> RunDataParallel(const diloco::Config& config, const std::vector<std::string>& common,
                                    Children& children) {
  const int64_t ranks = config.workers.count * config.workers.cluster_size;
  const std::string store = "127.0.0.1:" + std::to_string(FreeLocalPort());
  absl::Status started;
  for (int64_t r = 0; r < ranks && started.ok(); ++r) {
    std::vector<std::string> argv = {diloco::SiblingExecutable("diloco-worker"), "--mode", "ddp"};
    argv.insert(argv.end(), common.begin(), common.end());
    argv.insert(argv.end(), {"--rank", std::to_string(r), "--cluster-store", store});
    started = children.Start("rank-" + std::to_string(r), argv);
  }
  while (started.ok() && g_signal == 0 && children.AnyRunning()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (g_signal != 0) Say("signal " + std::to_string(g_signal.load()) + ": stopping every rank");
  children.StopAll();
  const int code = children.Reap();
  if (!started.ok()) return started;
  if (g_signal != 0) return absl::CancelledError("signal " + std::to_string(g_signal.load()));
  if (code == 0) PrintSummary(config.run.output_dir + "/summary.json");
  return code;
}

// Waits until the coordinator (children[0]) has written its address; "" if it exited first or a signal came.
std::string WaitForAddress(Children& children, const std::string& port_file) {
  std::string address;
  while (address.empty() && g_signal == 0 && !children[0].process.Poll(nullptr)) {
    std::ifstream in(port_file);
    if (in) std::getline(in, address);
    if (address.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return address;
}

// Starts workers.count workers (each a cluster of workers.cluster_size ranks) against the coordinator at `address`;
// process number p (worker i's rank r: p = i x cluster_size + r) gets --local-rank p, so that workers.device cuda
// spreads the workers over the machine's GPUs (worker/lm/device_choice.h).
absl::Status StartWorkers(const diloco::Config& config, const std::vector<std::string>& common,
                          const PerWorker& per_worker, const std::string& address, bool fresh, Children& children) {
  for (int64_t i = 0; i < config.workers.count; ++i) {
    const std::string id = "worker-" + std::to_string(i);
    // A worker cluster (workers.cluster_size ranks) meets at a c10d store that its rank 0 hosts on a free port.
    const int64_t ranks = config.workers.cluster_size;
    const std::string store = ranks > 1 ? "127.0.0.1:" + std::to_string(FreeLocalPort()) : "";
    const auto sets = per_worker.find(i);
    for (int64_t r = 0; r < ranks; ++r) {
      std::vector<std::string> argv = {diloco::SiblingExecutable("diloco-worker")};
      argv.insert(argv.end(), common.begin(), common.end());
      argv.insert(argv.end(), {"--coordinator", address, "--id", id});
      if (fresh) argv.push_back("--fresh");  // the run starts over: no worker resumes the last run's moments
      if (sets != per_worker.end()) argv.insert(argv.end(), sets->second.begin(), sets->second.end());
      if (ranks > 1) argv.insert(argv.end(), {"--rank", std::to_string(r), "--cluster-store", store});
      // Its index among the processes on this machine: workers.device cuda gives it cuda:(index mod GPUs).
      argv.insert(argv.end(), {"--local-rank", std::to_string(i * ranks + r)});
      absl::Status s = children.Start(ranks > 1 ? id + "." + std::to_string(r) : id, argv);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// The coordinator, then the workers once it listens, then supervision until the run ends.
absl::StatusOr<int> RunDiloco(const Flags& flags, const diloco::Config& config, const std::vector<std::string>& common,
                              const PerWorker& per_worker, const std::string& port_file, Children& children) {
  std::vector<std::string> argv = {diloco::SiblingExecutable("diloco-coordinator")};
  argv.insert(argv.end(), common.begin(), common.end());
  argv.insert(argv.end(), {"--port-file", port_file});
  if (flags.fresh) argv.push_back("--fresh");
  if (absl::Status s = children.Start("coordinator", argv); !s.ok()) return s;
  const std::string address = WaitForAddress(children, port_file);
  if (!address.empty()) {
    Say("coordinator listening on " + address);
    if (absl::Status s = StartWorkers(config, common, per_worker, address, flags.fresh, children); !s.ok()) {
      children.StopAll();
      children.Reap();
      return s;
    }
  }
  diloco::SupervisionOptions options;
  // A completing coordinator waits up to max(15 s, 3 heartbeats) for the workers to leave, then writes its summary.
  options.completion_grace_s = std::max(30.0, 3 * config.coordinator.heartbeat_interval_s + 15);
  options.min_workers = static_cast<int>(config.coordinator.min_workers);
  absl::StatusOr<int> end = Supervise(children, options);
  if (end.ok() && *end == 0) PrintSummary(config.run.output_dir + "/summary.json");
  return end;
}

void SayRun(const diloco::Config& config, bool ddp) {
  if (ddp) {
    Say("run '" + config.run.name +
        "' (data parallel): " + std::to_string(config.workers.count * config.workers.cluster_size) + " ranks, " +
        std::to_string(config.outer.rounds * config.inner.steps) + " steps; output in " + config.run.output_dir);
  } else {
    Say("run '" + config.run.name + "': " + std::to_string(config.workers.count) + " workers, " +
        std::to_string(config.outer.rounds) + " rounds of " + std::to_string(config.inner.steps) +
        " inner steps; output in " + config.run.output_dir);
  }
}

// The whole launch: the exit code of a run that ended by itself, or why it could not start or was stopped.
absl::StatusOr<int> Launch(const Flags& flags) {
  auto config = diloco::LoadConfig(flags.config_path, flags.overrides);
  if (!config.ok()) return config.status();
  auto per_worker = ParseWorkerSets(flags, *config);
  if (!per_worker.ok()) return per_worker.status();
  if (flags.mode != "ddp" && config->coordinator.min_workers > config->workers.count) {
    return absl::InvalidArgumentError(absl::StrCat(
        flags.config_path, ": coordinator.min_workers (", config->coordinator.min_workers,
        ") is more than workers.count (", config->workers.count,
        "), the workers this launch starts: no round could close; lower min_workers or raise workers.count"));
  }
  if (absl::Status s = diloco::CheckTokenizerChoice(*config); !s.ok()) return s;
  if (flags.check_config) {
    std::cout << "config OK: " << flags.config_path << "\n";
    // The input files too (data.text, data.files, data.val_files, data.tokenizer): a warning, not an error, since a
    // config is often checked where its files are not (an image's build stage checks the runtime paths).
    if (auto inputs = diloco::LocateTokenCache(*config); !inputs.ok()) {
      std::cerr << "diloco-launch: warning: " << inputs.status().message() << " (here; a launch here would stop there)"
                << std::endl;
    }
    return 0;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const bool ddp = flags.mode == "ddp";
  SayRun(*config, ddp);
  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) return absl::FailedPreconditionError(cache.status().message());  // exit 2, as a config error
  Say("token cache: " + cache->dir);

  std::vector<std::string> common = {"--config", flags.config_path};
  for (const std::string& o : flags.overrides) common.insert(common.end(), {"--set", o});
  const std::string port_file = config->run.output_dir + "/coordinator.addr";
  std::filesystem::create_directories(config->run.output_dir);
  std::filesystem::remove(port_file);
  Children children;
  if (ddp) return RunDataParallel(*config, common, children);
  return RunDiloco(flags, *config, common, *per_worker, port_file, children);
}

// The one place diloco-launch ends with an error: prints its one line (none after a signal, which was announced) and
// returns the exit code (supervision.h ExitCodeOf).
int Finish(const absl::StatusOr<int>& end) {
  if (end.ok()) return *end;
  if (end.status().code() != absl::StatusCode::kCancelled) {
    std::cerr << "diloco-launch: error: " << end.status().message() << std::endl;
  }
  return diloco::ExitCodeOf(end.status());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Launch a DiLoCo coordinator and its workers on this machine from one YAML file"};
  Flags flags;
  app.add_option("config", flags.config_path, "run config (YAML)")->required();
  app.add_option("--set", flags.overrides, "override a config key: section.key=value (repeatable)");
  app.add_flag("--fresh", flags.fresh,
               "start from theta_0 even if run.output_dir holds checkpoints of this run; the workers start cold too "
               "(their saved moments and data positions are not resumed)");
  app.add_option("--mode", flags.mode, "diloco (default) or ddp: the fully synchronous data-parallel baseline")
      ->check(CLI::IsMember({"diloco", "ddp"}));
  app.add_option("--worker-set", flags.worker_sets,
                 "override a config key for one worker: I:section.key=value (repeatable), e.g. 1:inner.batch_size=32 "
                 "or 1:workers.slowdown=2");
  app.add_option("--worker-arg", flags.worker_args,
                 "TEST-ONLY: append ARG to one worker's command line: I:ARG (repeatable), e.g. "
                 "7:--attack=scale:-1000 (scripts/experiments/attacks)");
  app.add_flag("--check-config", flags.check_config,
               "only load and validate the config (strict loader, --worker-sets; a missing input file is a warning), "
               "then exit 0 if valid, 2 if not");
  if (const int code = diloco::ParseFlags(app, argc, argv); code >= 0) return code;
  return Finish(Launch(flags));
}
