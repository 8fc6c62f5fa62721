// Subprocess: starts a program (fork + execv), optionally capturing its stdout and stderr through one pipe, and
// waits for or signals it. Used by the launcher, the token-cache preparation and the tests. One object per child;
// not thread-safe (one thread may read output_fd() while another waits).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace diloco {

class Subprocess {
 public:
  struct Options {
    bool capture_output = false;     // stdout + stderr into output_fd(); otherwise inherited
    bool own_process_group = false;  // setpgid(0, 0) in the child, so a terminal's Ctrl-C does not reach it
  };

  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv, Options options);
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv) { return Start(argv, Options{}); }

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();  // closes the pipe; does not kill or reap the child

  pid_t pid() const { return pid_; }
  int output_fd() const { return output_fd_; }
  // With capture_output: reads output_fd() until the child closes it (it exited) and returns everything read.
  std::string ReadOutputToEnd() const;

  // Blocks until the child exits: its exit code, or 128 + signal number if a signal ended it.
  int Wait();
  // Non-blocking: true and *code set once the child has exited.
  bool Poll(int* code);
  void Signal(int sig) const;

 private:
  Subprocess() = default;
  pid_t pid_ = -1;
  int output_fd_ = -1;
  bool exited_ = false;
  int exit_code_ = 0;
};

// Runs argv to its end and returns what it printed (stdout and stderr together); a start failure or an exit code other
// than 0 is an error whose message has the program's name, the code and what it printed.
absl::StatusOr<std::string> RunForOutput(const std::vector<std::string>& argv);

// Directory holding the running executable (from /proc/self/exe).
std::string SelfDir();

// Path of a sibling executable of this one, e.g. SiblingExecutable("diloco-tokenize").
std::string SiblingExecutable(const std::string& name);

}  // namespace diloco
