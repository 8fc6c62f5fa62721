// TcpPusher: a worker's end of comm.transport tcp (framing in proto/push_frames.h): one TCP connection to the
// coordinator's push port, opened on first use with the hello (the token), kept across rounds, and reopened on the
// next push after any error. A push writes the header frame, then each chunk's metadata and its payload (fp32 straight
// from the pseudo-gradient tensor, other codecs from the codec's buffer), then the end frame, and reads the answer.
// Errors: the coordinator's refusal comes back with its own code (as over gRPC); a broken or refused connection is
// UNAVAILABLE (the worker retries the push). Thread-safety: Push may be called from any thread; one push at a time.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/diloco.pb.h"
#include "proto/tensor_chunks.h"

namespace diloco {

class TcpPusher {
 public:
  TcpPusher(std::string host, std::string token, double timeout_s);
  ~TcpPusher();
  TcpPusher(const TcpPusher&) = delete;
  TcpPusher& operator=(const TcpPusher&) = delete;

  // Pushes to `port` (the one the last Join named; a new port closes the old connection). Returns the payload
  // bytes sent. `answered` (if given) says whether the status is the coordinator's answer (its UNAVAILABLE "retry"
  // included) rather than a failed connection.
  absl::StatusOr<int64_t> Push(int port, const PushHeader& header, TensorChunker& chunker, bool* answered = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status Connect(int port) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Close() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string host_;
  const std::string token_;
  const double timeout_s_;
  absl::Mutex mu_;  // held for a whole push: one at a time
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  int port_ ABSL_GUARDED_BY(mu_) = 0;  // the port fd_ is connected to
};

}  // namespace diloco
