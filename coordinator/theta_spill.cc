#include "coordinator/theta_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

constexpr int64_t kSlice = int64_t{64} << 20;  // bytes per write/read call

absl::Status Errno(const std::string& what) { return absl::InternalError(absl::StrCat(what, ": ", strerror(errno))); }

// Writes (or with `read`, reads) `bytes` at `offset` of the file, retrying short transfers and EINTR.
absl::Status Transfer(int fd, char* data, int64_t bytes, int64_t offset, bool read) {
  while (bytes > 0) {
    const size_t n = static_cast<size_t>(std::min(bytes, kSlice));
    const ssize_t done = read ? pread(fd, data, n, offset) : pwrite(fd, data, n, offset);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) return Errno(read ? "theta spill: read" : "theta spill: write");
    if (done == 0) return absl::InternalError("theta spill: the file ended early");
    data += done;
    offset += done;
    bytes -= done;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ThetaSpill>> ThetaSpill::Write(const std::string& dir, std::vector<at::Tensor> tensors) {
  for (const at::Tensor& t : tensors) {
    if (t.scalar_type() != at::kFloat || !t.device().is_cpu() || !t.is_contiguous()) {
      return absl::InvalidArgumentError("theta spill: tensors must be contiguous float32 on the CPU");
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string path = (std::filesystem::path(dir) / ".theta-spill-XXXXXX").string();
  const int fd = mkstemp(path.data());
  if (fd < 0) return Errno("theta spill: cannot create a file in " + dir + " (coordinator.checkpoint_dir)");
  unlink(path.c_str());
  std::unique_ptr<ThetaSpill> spill(new ThetaSpill(fd, std::move(tensors)));
  for (const at::Tensor& t : spill->tensors_) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(sizeof(float));
    if (absl::Status s = Transfer(fd, static_cast<char*>(t.data_ptr()), bytes, spill->bytes_, false); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(s.message(), " (", dir, ", coordinator.checkpoint_dir)"));
    }
    spill->bytes_ += bytes;
  }
  return spill;
}

ThetaSpill::~ThetaSpill() { close(fd_); }

absl::Status ThetaSpill::Restore() {
  int64_t offset = 0;
  for (const at::Tensor& t : tensors_) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(sizeof(float));
    if (absl::Status s = Transfer(fd_, static_cast<char*>(t.data_ptr()), bytes, offset, true); !s.ok()) return s;
    offset += bytes;
  }
  return absl::OkStatus();
}

}  // namespace diloco
