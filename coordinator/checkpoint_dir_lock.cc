#include "coordinator/checkpoint_dir_lock.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace diloco {

absl::StatusOr<std::unique_ptr<CheckpointDirLock>> CheckpointDirLock::Acquire(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / ".coordinator.lock").string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    spdlog::warn(
        "coordinator.checkpoint_dir: cannot make the lock file {} ({}); a second coordinator on {} would not "
        "be detected",
        path, std::strerror(errno), dir);
    return std::unique_ptr<CheckpointDirLock>();
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char owner[32] = {};
    const ssize_t n = pread(fd, owner, sizeof owner - 1, 0);
    close(fd);
    if (error != EWOULDBLOCK) {
      spdlog::warn("coordinator.checkpoint_dir: cannot lock {} ({}); a second coordinator on {} would not be detected",
                   path, std::strerror(error), dir);
      return std::unique_ptr<CheckpointDirLock>();
    }
    const std::string pid(absl::StripAsciiWhitespace(std::string(owner, n > 0 ? static_cast<size_t>(n) : 0)));
    return absl::FailedPreconditionError(
        absl::StrCat("coordinator.checkpoint_dir: ", dir, " is in use by another coordinator (pid ",
                     pid.empty() ? "unknown" : pid, ", lock ", path,
                     "); two would overwrite each other's checkpoints: stop that one, or give this run another "
                     "run.output_dir or coordinator.checkpoint_dir"));
  }
  const std::string mine = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size())) {
    spdlog::warn("coordinator.checkpoint_dir: cannot write this process's pid into {} ({})", path,
                 std::strerror(errno));
  }
  return std::unique_ptr<CheckpointDirLock>(new CheckpointDirLock(fd));
}

CheckpointDirLock::~CheckpointDirLock() { close(fd_); }

}  // namespace diloco
