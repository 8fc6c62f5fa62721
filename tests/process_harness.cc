#include "tests/process_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

namespace diloco::testing {

std::string BinDir() { return DILOCO_BIN_DIR; }
std::string SourceDir() { return DILOCO_SOURCE_DIR; }

RunningProcess::RunningProcess(const std::string& binary, const std::vector<std::string>& args) : name_(binary) {
  std::vector<std::string> argv = {BinDir() + "/" + binary};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess::Options options;
  options.capture_output = true;
  auto p = Subprocess::Start(argv, options);
  if (!p.ok()) throw std::runtime_error(std::string(p.status().message()));
  process_ = std::make_unique<Subprocess>(std::move(*p));
  const int fd = process_->output_fd();
  reader_ = std::thread([this, fd] {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
      if (n <= 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      output_.append(buf, n);
    }
    std::lock_guard<std::mutex> lock(mu_);
    drained_ = true;
    drained_cv_.notify_all();
  });
}

RunningProcess::~RunningProcess() {
  if (Running()) {
    process_->Signal(SIGKILL);
  }
  process_->Wait();
  if (reader_.joinable()) reader_.join();
  if (::testing::Test::HasFailure()) {
    std::cerr << "---- output of " << name_ << " ----\n" << output() << "---- end of " << name_ << " ----\n";
  }
}

int RunningProcess::Wait(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int code = 0;
  while (!process_->Poll(&code)) {
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::unique_lock<std::mutex> lock(mu_);  // its last lines may still be in the pipe
  drained_cv_.wait_for(lock, std::chrono::seconds(5), [this] { return drained_; });
  return code;
}

bool RunningProcess::Running() { return !process_->Poll(nullptr); }

void RunningProcess::Signal(int sig) { process_->Signal(sig); }

std::string RunningProcess::output() {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
}

bool RunningProcess::WaitForOutput(const std::string& text, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (output().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string ScratchDir(const std::string& name) {
  const std::string dir = BinDir() + "/test-scratch/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json ReadJson(const std::string& path) { return nlohmann::json::parse(ReadFile(path)); }

int Shell(const std::string& command) {
  auto child = Subprocess::Start({"/bin/sh", "-c", command});
  return child.ok() ? child->Wait() : -1;
}

std::pair<int, std::string> RunToEnd(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {BinDir() + "/" + binary};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess::Options options;
  options.capture_output = true;
  auto child = Subprocess::Start(argv, options);
  if (!child.ok()) return {-1, std::string(child.status().message())};
  const std::string out = child->ReadOutputToEnd();
  return {child->Wait(), out};
}

std::vector<std::string> TinyArgs(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> args = {"--config", SourceDir() + "/config/tiny.yaml",
                                   "--set",    "run.output_dir=" + dir,
                                   "--set",    "data.text=" + SourceDir() + "/tests/data/tinyshakespeare.txt",
                                   "--set",    "data.cache_dir=" + BinDir() + "/test-cache"};
  for (const std::string& e : extra) args.insert(args.end(), {"--set", e});
  return args;
}

std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::string WaitForAddress(RunningProcess& coordinator, const std::string& port_file) {
  for (int i = 0; i < 1200 && coordinator.Running(); ++i) {
    std::string text = ReadFile(port_file);
    if (!text.empty()) return text.substr(0, text.find('\n'));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

// VmHWM of a live process in kB; -1 once it has exited (a zombie's status has no VmHWM) or is gone.
int64_t VmHwmKb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

}  // namespace diloco::testing
