#include "scripts/launch/children.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <iostream>
#include <mutex>

namespace diloco::launch {
namespace {

std::mutex g_print;  // one line at a time on stdout, from the pumps and Say

// Copies the child's output lines to stdout behind "[name] " until the pipe closes; records each line in `log`.
void Pump(const std::string& name, int fd, std::shared_ptr<ChildLog> log) {
  std::string pending;
  char buf[4096];
  ssize_t n;
  const auto emit = [&](const std::string& line) {
    log->Record(line);
    std::lock_guard<std::mutex> lock(g_print);
    std::cout << "[" << name << "] " << line << "\n" << std::flush;
  };
  while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n < 0) continue;
    pending.append(buf, n);
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      emit(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty()) emit(pending);
}

const auto kStart = std::chrono::steady_clock::now();

}  // namespace

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now() - kStart).count(); }

void Say(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_print);
  std::cout << "[launch] " << line << std::endl;
}

void ChildLog::Record(const std::string& line) {
  std::string message = ErrorMessageOf(line);
  if (message.empty()) return;
  absl::MutexLock lock(&mu_);
  last_error_ = std::move(message);
}

std::string ChildLog::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

Children::~Children() {
  if (reaped_) return;
  if (AnyRunning()) StopAll();
  Reap();
}

absl::Status Children::Start(const std::string& name, const std::vector<std::string>& argv) {
  Subprocess::Options options;
  options.capture_output = true;
  options.own_process_group = true;
  auto p = Subprocess::Start(argv, options);
  if (!p.ok()) return absl::AbortedError("cannot start " + name + ": " + std::string(p.status().message()));
  children_.push_back({name, std::move(*p), {}, std::make_shared<ChildLog>()});
  Child& c = children_.back();
  c.pump = std::thread(Pump, c.name, c.process.output_fd(), c.log);
  return absl::OkStatus();
}

void Children::Poll(double now) {
  for (Child& c : children_) {
    if (c.exited_at < 0 && c.process.Poll(&c.exit_code)) c.exited_at = now;
  }
}

ChildView Children::View(size_t i) const {
  const Child& c = children_[i];
  ChildView view;
  view.name = c.name;
  view.running = c.exited_at < 0;
  if (!view.running) {
    view.exit_code = c.exit_code;
    view.exited_at = c.exited_at;
  }
  view.error_line = c.log->last_error();
  return view;
}

bool Children::AnyRunning() {
  for (Child& c : children_) {
    if (!c.process.Poll(nullptr)) return true;
  }
  return false;
}

void Children::StopAll() {
  for (size_t i = children_.size(); i-- > 0;) {
    Child& c = children_[i];
    if (c.process.Poll(nullptr)) continue;
    c.stopped_by_us = true;
    c.process.Signal(SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (Child& c : children_) {
    while (!c.process.Poll(nullptr) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!c.process.Poll(nullptr)) {
      Say(c.name + " did not stop in 10 s; killing it");
      c.process.Signal(SIGKILL);
    }
  }
}

int Children::Reap() {
  reaped_ = true;
  int worst = 0;
  for (Child& c : children_) {
    const int code = c.process.Wait();
    if (c.pump.joinable()) c.pump.join();
    // A child that StopAll's SIGTERM ended (130, or 143 if it had no handler) is not news; any other failure is.
    const bool stopped = c.stopped_by_us && (code == 130 || code == 128 + SIGTERM);
    if (code != 0 && !stopped) Say(c.name + " exited with code " + std::to_string(code));
    if (code != 0) worst = code;
  }
  return worst == 0 ? 0 : 1;
}

}  // namespace diloco::launch
