#include "config/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace diloco {

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv, Options options) {
  if (argv.empty()) return absl::InvalidArgumentError("Subprocess::Start: empty argv");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(argv[0], ": not an executable file (", std::strerror(errno), ")"));
  }
  int fds[2] = {-1, -1};
  if (options.capture_output && pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    if (options.own_process_group) setpgid(0, 0);
    if (options.capture_output) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
    }
    execv(args[0], args.data());
    const char* msg = "exec failed\n";
    (void)!write(STDERR_FILENO, msg, strlen(msg));
    _exit(127);
  }
  Subprocess p;
  p.pid_ = pid;
  if (options.capture_output) {
    close(fds[1]);
    p.output_fd_ = fds[0];
  }
  return p;
}

Subprocess::Subprocess(Subprocess&& o) noexcept { *this = std::move(o); }

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    if (output_fd_ >= 0) close(output_fd_);
    pid_ = o.pid_;
    output_fd_ = o.output_fd_;
    exited_ = o.exited_;
    exit_code_ = o.exit_code_;
    o.pid_ = -1;
    o.output_fd_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (output_fd_ >= 0) close(output_fd_);
}

namespace {
int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}
}  // namespace

std::string Subprocess::ReadOutputToEnd() const {
  std::string out;
  char buf[4096];
  for (ssize_t n; output_fd_ >= 0 && (n = read(output_fd_, buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

int Subprocess::Wait() {
  if (exited_ || pid_ < 0) return exit_code_;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  exited_ = true;
  exit_code_ = DecodeStatus(status);
  return exit_code_;
}

bool Subprocess::Poll(int* code) {
  if (!exited_ && pid_ > 0) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      exit_code_ = DecodeStatus(status);
    }
  }
  if (exited_ && code != nullptr) *code = exit_code_;
  return exited_;
}

void Subprocess::Signal(int sig) const {
  if (pid_ > 0 && !exited_) kill(pid_, sig);
}

absl::StatusOr<std::string> RunForOutput(const std::vector<std::string>& argv) {
  Subprocess::Options options;
  options.capture_output = true;
  auto child = Subprocess::Start(argv, options);
  if (!child.ok()) return child.status();
  const std::string out = child->ReadOutputToEnd();
  if (const int code = child->Wait(); code != 0) {
    const std::string name = argv.empty() ? "" : argv[0].substr(argv[0].rfind('/') + 1);
    return absl::InternalError(
        absl::StrCat(name, argv.size() > 1 ? " " + argv[1] : "", " exited with code ", code, ": ", out));
  }
  return out;
}

std::string SelfDir() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, n);
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string SiblingExecutable(const std::string& name) { return SelfDir() + "/" + name; }

}  // namespace diloco
