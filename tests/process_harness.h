// Test harness for real processes: start a DiLoCo binary with its output captured, wait for it with a deadline,
// find a free loopback port, make a scratch directory. Used by the integration and fault tests only.
// Not thread-safe per object; each RunningProcess owns one reader thread.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config/subprocess.h"

namespace diloco::testing {

// Directory of the built binaries and of the source tree (compile definitions).
std::string BinDir();
std::string SourceDir();

class RunningProcess {
 public:
  // Starts BinDir()/binary with args; stdout+stderr are collected into output().
  RunningProcess(const std::string& binary, const std::vector<std::string>& args);
  ~RunningProcess();  // kills the process if it still runs

  // Waits up to timeout_s; returns the exit code, or -1 on timeout (the process keeps running). Once it has exited,
  // output() holds all it wrote (up to 5 s more for the reader to drain the pipe; a child still holding it is
  // not waited for longer).
  int Wait(double timeout_s);
  bool Running();
  void Signal(int sig);
  pid_t pid() const { return process_->pid(); }
  std::string output();
  // Polls output() until it contains `text` or timeout_s passes.
  bool WaitForOutput(const std::string& text, double timeout_s);

 private:
  std::unique_ptr<Subprocess> process_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable drained_cv_;
  bool drained_ = false;  // the reader met the pipe's end (under mu_)
  std::string output_;
  std::string name_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();
// VmHWM (peak RSS) of a live process in kB, from /proc/PID/status; -1 once it has exited or is gone.
int64_t VmHwmKb(pid_t pid);

// A fresh directory under the build tree, removed first if it exists.
std::string ScratchDir(const std::string& name);

std::string ReadFile(const std::string& path);
// Runs a shell command line (/bin/sh -c) to its end; its exit code, or -1 if it could not start.
int Shell(const std::string& command);
// Runs build/<binary> with args (no shell: arguments pass as they are) to its end: its exit code and its whole output
// (stdout + stderr); {-1, why} if it could not start.
std::pair<int, std::string> RunToEnd(const std::string& binary, const std::vector<std::string>& args);
nlohmann::json ReadJson(const std::string& path);

// Arguments for config/tiny.yaml with the run's files in `dir`, the token cache shared in the build tree, and
// `extra` as --set overrides.
std::vector<std::string> TinyArgs(const std::string& dir, std::vector<std::string> extra = {});
// args followed by more.
std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more);
// Waits for a coordinator's --port-file; returns HOST:PORT, or "" if the coordinator exited first.
std::string WaitForAddress(RunningProcess& coordinator, const std::string& port_file);

}  // namespace diloco::testing
