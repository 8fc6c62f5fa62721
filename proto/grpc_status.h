// absl::Status <-> grpc::Status at the service and client edges (the codes are numerically identical).
// Header-only; thread-safe.
#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "proto/peer_text.h"

namespace diloco {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // A refusal may quote peer input: never more than kMaxRefusalBytes (proto/peer_text.h) leave the process.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), Truncated(s.message(), kMaxRefusalBytes));
}

// A status a call can get without the coordinator answering it (no connection, a deadline, a cancel, a transport
// error): the worker retries these (worker/protocol_decision.h), and they do not show the coordinator is alive.
inline bool IsTransient(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kUnknown;
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace diloco
