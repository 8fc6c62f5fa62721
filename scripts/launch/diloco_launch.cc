// diloco-launch: runs a whole DiLoCo run on one machine from one YAML file, as torchrun does for DDP.
// Tokenizes data.text into the token cache (once; cached), starts diloco-coordinator, waits until it listens,
// starts workers.count diloco-worker processes, prefixes every line they print with the process name, and exits 0
// once the coordinator has finished outer.rounds rounds and every worker has exited 0. A second launch with the same
// run.output_dir resumes from the coordinator's newest checkpoint; --fresh starts over. Ctrl-C (SIGINT) or SIGTERM
// stops the workers, then the coordinator, cleanly (SIGTERM, then SIGKILL after 10 s).
// --mode ddp runs the data-parallel baseline instead (worker/data_parallel.h): workers.count x cluster_size ranks
// of diloco-worker --mode ddp meeting at a c10d store, no coordinator; it ends when every rank has exited.
// --check-config only loads and validates the config (the strict loader) and exits: 0 if valid, 2 if not.
// A thin front end: it uses config/ only and starts the other binaries; it never links coordinator/ or worker/.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"

namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }
std::mutex g_print;

void Say(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_print);
  std::cout << "[launch] " << line << std::endl;
}

// A child process whose output lines are copied to stdout behind "[name] ".
struct Child {
  std::string name;
  diloco::Subprocess process;
  std::thread pump;
};

void Pump(const std::string& name, int fd) {
  std::string pending;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n < 0) continue;
    pending.append(buf, n);
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::lock_guard<std::mutex> lock(g_print);
      std::cout << "[" << name << "] " << pending.substr(0, nl) << "\n" << std::flush;
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty()) {
    std::lock_guard<std::mutex> lock(g_print);
    std::cout << "[" << name << "] " << pending << std::endl;
  }
}

bool StartChild(std::vector<Child>& children, const std::string& name, const std::vector<std::string>& argv) {
  diloco::Subprocess::Options options;
  options.capture_output = true;
  options.own_process_group = true;
  auto p = diloco::Subprocess::Start(argv, options);
  if (!p.ok()) {
    Say("error: cannot start " + name + ": " + std::string(p.status().message()));
    return false;
  }
  children.push_back({name, std::move(*p), {}});
  Child& c = children.back();
  c.pump = std::thread(Pump, c.name, c.process.output_fd());
  return true;
}

void StopAll(std::vector<Child>& children) {
  // Workers first (they Leave), then the coordinator (children[0]).
  for (size_t i = children.size(); i-- > 0;) children[i].process.Signal(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (Child& c : children) {
    while (!c.process.Poll(nullptr) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!c.process.Poll(nullptr)) {
      Say(c.name + " did not stop in 10 s; killing it");
      c.process.Signal(SIGKILL);
    }
  }
}

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

// Collects every child's exit code (each has exited or been stopped) and reports the failures; returns the
// launcher's exit code: 130 after a signal, 1 if any child failed, else 0.
int Reap(std::vector<Child>& children) {
  int worst = 0;
  for (Child& c : children) {
    const int code = c.process.Wait();
    if (c.pump.joinable()) c.pump.join();
    if (code != 0) {
      Say(c.name + " exited with code " + std::to_string(code));
      worst = code;
    }
  }
  if (g_signal != 0) return 130;
  return worst == 0 ? 0 : 1;
}

// Waits for every child to exit (or a signal, which stops them all); returns the launcher's exit code.
int WaitForAll(std::vector<Child>& children) {
  bool running = true;
  while (running && g_signal == 0) {
    running = false;
    for (Child& c : children) running = running || !c.process.Poll(nullptr);
    if (running) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (g_signal != 0) {
    Say("signal " + std::to_string(g_signal.load()) + ": stopping every rank");
    StopAll(children);
  }
  return Reap(children);
}

// --mode ddp: ranks 0..n-1 of the data-parallel baseline; rank 0 hosts the c10d store and writes the summary.
// A rank that fails makes the others' next collective fail, so they all end.
int RunDataParallel(const diloco::Config& config, const std::vector<std::string>& common,
                    std::vector<Child>& children) {
  const int64_t ranks = config.workers.count * config.workers.cluster_size;
  const std::string store = "127.0.0.1:" + std::to_string(FreeLocalPort());
  for (int64_t r = 0; r < ranks; ++r) {
    std::vector<std::string> argv = {diloco::SiblingExecutable("diloco-worker"), "--mode", "ddp"};
    argv.insert(argv.end(), common.begin(), common.end());
    argv.insert(argv.end(), {"--rank", std::to_string(r), "--cluster-store", store});
    if (!StartChild(children, "rank-" + std::to_string(r), argv)) {
      g_signal = SIGTERM;
      break;
    }
  }
  const int code = WaitForAll(children);
  if (code == 0) PrintSummary(config.run.output_dir + "/summary.json");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Launch a DiLoCo coordinator and its workers on this machine from one YAML file"};
  std::string config_path;
  std::vector<std::string> overrides;
  app.add_option("config", config_path, "run config (YAML)")->required();
  bool fresh = false;
  app.add_option("--set", overrides, "override a config key: section.key=value (repeatable)");
  app.add_flag("--fresh", fresh, "start from theta_0 even if run.output_dir holds checkpoints of this run");
  std::string mode = "diloco";
  app.add_option("--mode", mode, "diloco (default) or ddp: the fully synchronous data-parallel baseline")
      ->check(CLI::IsMember({"diloco", "ddp"}));
  std::vector<std::string> worker_sets;
  app.add_option("--worker-set", worker_sets,
                 "override a config key for one worker: I:section.key=value (repeatable), e.g. 1:inner.batch_size=32 "
                 "or 1:workers.slowdown=2");
  bool check_config = false;
  app.add_flag("--check-config", check_config, "only load and validate the config (strict loader), then exit 0");
  CLI11_PARSE(app, argc, argv);

  auto config = diloco::LoadConfig(config_path, overrides);
  if (!config.ok()) {
    std::cerr << "diloco-launch: error: " << config.status().message() << "\n";
    return 2;
  }
  // Per-worker overrides: worker index -> extra --set values; each worker's resulting config is checked here.
  std::map<int64_t, std::vector<std::string>> per_worker;
  for (const std::string& ws : worker_sets) {
    const size_t colon = ws.find(':');
    int64_t index = -1;
    try {
      index = colon == std::string::npos ? -1 : std::stoll(ws.substr(0, colon));
    } catch (const std::exception&) {
    }
    if (index < 0 || index >= config->workers.count) {
      std::cerr << "diloco-launch: error: --worker-set " << ws << ": expected I:section.key=value with I in [0, "
                << config->workers.count << ")\n";
      return 2;
    }
    per_worker[index].push_back(ws.substr(colon + 1));
  }
  for (const auto& [index, sets] : per_worker) {
    std::vector<std::string> all = overrides;
    all.insert(all.end(), sets.begin(), sets.end());
    if (auto c = diloco::LoadConfig(config_path, all); !c.ok()) {
      std::cerr << "diloco-launch: error: worker " << index << ": " << c.status().message() << "\n";
      return 2;
    }
  }
  if (check_config) {
    std::cout << "config OK: " << config_path << "\n";
    return 0;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const bool ddp = mode == "ddp";
  if (ddp) {
    Say("run '" + config->run.name +
        "' (data parallel): " + std::to_string(config->workers.count * config->workers.cluster_size) + " ranks, " +
        std::to_string(config->outer.rounds * config->inner.steps) + " steps; output in " + config->run.output_dir);
  } else {
    Say("run '" + config->run.name + "': " + std::to_string(config->workers.count) + " workers, " +
        std::to_string(config->outer.rounds) + " rounds of " + std::to_string(config->inner.steps) +
        " inner steps; output in " + config->run.output_dir);
  }
  auto cache = diloco::EnsureTokenized(*config, diloco::SiblingExecutable("diloco-tokenize"));
  if (!cache.ok()) {
    std::cerr << "diloco-launch: error: " << cache.status().message() << "\n";
    return 2;
  }
  Say("token cache: " + cache->dir);

  std::vector<std::string> common = {"--config", config_path};
  for (const std::string& o : overrides) common.insert(common.end(), {"--set", o});
  const std::string port_file = config->run.output_dir + "/coordinator.addr";
  std::filesystem::create_directories(config->run.output_dir);
  std::filesystem::remove(port_file);

  std::vector<Child> children;
  children.reserve(1 + config->workers.count * config->workers.cluster_size);
  if (ddp) return RunDataParallel(*config, common, children);
  std::vector<std::string> coordinator_argv = {diloco::SiblingExecutable("diloco-coordinator")};
  coordinator_argv.insert(coordinator_argv.end(), common.begin(), common.end());
  coordinator_argv.insert(coordinator_argv.end(), {"--port-file", port_file});
  if (fresh) coordinator_argv.push_back("--fresh");
  if (!StartChild(children, "coordinator", coordinator_argv)) return 1;

  std::string address;
  while (address.empty() && g_signal == 0 && !children[0].process.Poll(nullptr)) {
    std::ifstream in(port_file);
    if (in) std::getline(in, address);
    if (address.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!address.empty()) {
    Say("coordinator listening on " + address);
    for (int64_t i = 0; i < config->workers.count; ++i) {
      const std::string id = "worker-" + std::to_string(i);
      // A worker cluster (workers.cluster_size ranks) meets at a c10d store that its rank 0 hosts on a free port.
      const int64_t ranks = config->workers.cluster_size;
      const std::string store = ranks > 1 ? "127.0.0.1:" + std::to_string(FreeLocalPort()) : "";
      for (int64_t r = 0; r < ranks; ++r) {
        std::vector<std::string> worker_argv = {diloco::SiblingExecutable("diloco-worker")};
        worker_argv.insert(worker_argv.end(), common.begin(), common.end());
        worker_argv.insert(worker_argv.end(), {"--coordinator", address, "--id", id});
        for (const std::string& s : per_worker[i]) worker_argv.insert(worker_argv.end(), {"--set", s});
        if (ranks > 1) worker_argv.insert(worker_argv.end(), {"--rank", std::to_string(r), "--cluster-store", store});
        if (!StartChild(children, ranks > 1 ? id + "." + std::to_string(r) : id, worker_argv)) g_signal = SIGTERM;
      }
    }
  }

  // Wait for the coordinator; then give the workers time to see the end of the run and exit.
  int coordinator_code = -1;
  while (g_signal == 0 && !children[0].process.Poll(&coordinator_code)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (g_signal != 0) {
    Say("signal " + std::to_string(g_signal.load()) + ": stopping workers and coordinator");
    StopAll(children);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (Child& c : children) {
      while (!c.process.Poll(nullptr) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    StopAll(children);  // no-op for the ones that exited
  }
  const int code = Reap(children);
  if (code == 0) PrintSummary(config->run.output_dir + "/summary.json");
  return code;
}
