// Peer text: the rules for strings that come from the network. A worker id is 1..128 characters of [A-Za-z0-9._:-]
// (enforced by the coordinator at every request and by the worker at start-up); anything a peer sends that is
// echoed back in a refusal or written to a log is cut to a bound first, with a note of how much was cut
// (refusals at most kMaxRefusalBytes, log lines at most kMaxLogLineBytes). Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace diloco {

inline constexpr size_t kMaxWorkerIdLength = 128;
inline constexpr size_t kMaxRefusalBytes = 1024;
inline constexpr size_t kMaxLogLineBytes = 2048;
// What a peer-given name (worker id, tensor name) may take inside one message or log line.
inline constexpr size_t kMaxEchoedNameBytes = 160;

// OK, or INVALID_ARGUMENT "worker id ...: <rule>" (the id itself truncated in the message).
absl::Status ValidateWorkerId(absl::string_view id);

// `text` if it fits in `max` bytes, else its first bytes and " ... (N bytes cut)", `max` bytes at most in all.
std::string Truncated(absl::string_view text, size_t max = kMaxEchoedNameBytes);

// The same status with its message cut to kMaxRefusalBytes (a last guard where a refusal leaves the process).
absl::Status WithBoundedMessage(const absl::Status& status);

}  // namespace diloco
