// ThetaSpill: the exact bytes of some float32 CPU tensors, written to a file and read back into the same tensors on
// request. The synchronous theta store (theta_store.h) spills theta and the momentum of the tensors it is about to
// step in place before a step whose result the evaluation must vet, so that a refused step is undone bit for bit
// without a second copy of the model in memory (issue 32 item 4; docs/operations.md "Non-finite rounds").
// The file is created in `dir` and unlinked at once: it never shows in the directory, and the kernel frees its
// blocks when the spill is destroyed (or the process dies). Written without fsync: it only has to outlive the
// evaluation, not a crash (a restarted coordinator resumes from its last checkpoint).
// Owns the file descriptor; holds the tensors' handles. Not thread-safe (the round thread's); nothing may write the
// tensors between Write and Restore other than the step it undoes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace diloco {

class ThetaSpill {
 public:
  // Writes `tensors` (contiguous float32 on the CPU) to a new unlinked file in `dir` (created if missing).
  static absl::StatusOr<std::unique_ptr<ThetaSpill>> Write(const std::string& dir, std::vector<at::Tensor> tensors);
  ~ThetaSpill();
  ThetaSpill(const ThetaSpill&) = delete;
  ThetaSpill& operator=(const ThetaSpill&) = delete;

  // Reads the bytes written back into the tensors.
  absl::Status Restore();
  int64_t bytes() const { return bytes_; }

 private:
  ThetaSpill(int fd, std::vector<at::Tensor> tensors) : fd_(fd), tensors_(std::move(tensors)) {}

  const int fd_;
  const std::vector<at::Tensor> tensors_;
  int64_t bytes_ = 0;  // written so far
};

}  // namespace diloco
