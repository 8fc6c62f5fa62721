// PushSession: the coordinator's side of one PushPseudoGradient stream, without gRPC, so that the service's reactor
// only moves bytes and the whole push path can be driven directly by unit tests and the fuzz target
// (tests/fuzz/push_fuzzer.cc).
//
// A stream is one PushHeader, then the chunks of the round's fragment (the whole model without fragments) in
// parameter order. Every message is validated before anything reaches the round accumulator: the header by
// CoordinatorCore::BeginPush (worker id and lease, fingerprint, round, fragment, header values), each chunk by
// ChunkStreamReader (name, dtype, shape, offset, count, byte count for its codec, codec parameters) and then by
// CoordinatorCore::FoldChunk (NaN/Inf). The first refusal ends the session: the push is aborted (if some chunks were
// already folded, the round's aggregation restarts, so a refused push never reaches the global model) and the same
// status is returned for anything that follows. The refusals and their messages are listed in docs/operations.md
// ("Errors a push can get").
//
// Ownership: borrows the CoordinatorCore, which must outlive it. Not thread-safe: one session per stream, called
// from one thread at a time (gRPC serializes a reactor's callbacks).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "proto/diloco.pb.h"
#include "proto/tensor_chunks.h"

namespace diloco {

class PushSession {
 public:
  explicit PushSession(CoordinatorCore* core) : core_(core) {}
  ~PushSession();  // a push neither committed nor refused is aborted ("stream ended")
  PushSession(const PushSession&) = delete;
  PushSession& operator=(const PushSession&) = delete;

  // The next message of the stream. A non-OK status refuses the push; the stream should end with that status.
  absl::Status OnMessage(const PushMessage& message);

  // The client closed its side of the stream: commits the push if it is complete (every chunk of the fragment
  // arrived), else refuses it as truncated. Returns the reply to send.
  absl::StatusOr<PushReply> OnEnd();

  // The stream broke off (connection lost, cancelled): aborts the push unless it already committed or was refused.
  void OnBroken(const std::string& why);

  // The first refusal, OK while the push is accepted so far.
  const absl::Status& refusal() const { return refusal_; }

 private:
  absl::Status Consume(const PushMessage& message);
  absl::Status Refuse(absl::Status status);  // records it, aborts the ticket, logs once; returns it

  CoordinatorCore* core_;
  std::unique_ptr<PushTicket> ticket_;
  std::unique_ptr<ChunkStreamReader> reader_;     // made from the header: the fragment's specs
  const std::vector<size_t>* members_ = nullptr;  // reader index -> position in the model's parameters
  std::string header_worker_id_;                  // for the log line of a refused header
  absl::Status refusal_;
  bool ended_ = false;
};

}  // namespace diloco
