#include "config/text_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

// write(2) until all of `text` is out (a short write is not an error by itself).
bool WriteAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

absl::Status WriteTextFileAtomically(const std::string& path, const std::string& text) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  const bool written = WriteAll(fd, text) && fsync(fd) == 0;
  const int write_errno = errno;
  if (close(fd) != 0 || !written) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(
        absl::StrCat("cannot write ", tmp, ": ", std::strerror(written ? errno : write_errno)));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  // The rename itself survives a crash once the directory is synced.
  const int dir = open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    fsync(dir);
    close(dir);
  }
  return absl::OkStatus();
}

}  // namespace diloco
