// The push stream over a plain TCP connection (comm.transport: tcp), beside gRPC: the same PushMessage sequence as
// the PushPseudoGradient stream (a PushHeader, then the fragment's TensorChunks), framed so that a chunk's payload
// goes from the sender's buffer to the receiver's with one kernel copy each way and no protobuf copy in between.
//
// A connection starts with a hello: u32 magic "DLCP", u32 version, u32 token length, the token (security.token;
// empty without one). Then pushes, one after another on the same connection. Each message of a push is a frame:
//   u32 message length, the serialized PushMessage (a chunk's `data` left empty), u64 payload length, the payload
//   (the chunk's data; 0 bytes for the header)
// and a push ends with a frame whose message length is 0 (no payload length follows). The coordinator answers each
// push with a result frame: u32 absl status code, u32 message length, the message, u32 reply length, the serialized
// PushReply. Integers are little-endian. Limits (kMaxMessageBytes, the payload limit the caller gives) are checked
// before anything is allocated; a frame that breaks them ends the connection.
//
// Functions only (no state): each reads or writes whole frames on a blocking socket, retrying short reads and
// writes and EINTR. Thread-safety: one thread per socket at a time.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/diloco.pb.h"

namespace diloco {

inline constexpr uint32_t kPushFramesMagic = 0x50434c44;  // "DLCP" read as little-endian bytes
inline constexpr uint32_t kPushFramesVersion = 1;
inline constexpr uint32_t kMaxMessageBytes = 1 << 20;  // a header or a chunk's metadata; payloads have their own limit
inline constexpr uint32_t kMaxTokenBytes = 4096;

// Whole-buffer socket I/O. An orderly close before the first byte of a read is NotFound ("connection closed"),
// anything else that stops short is Unavailable, both saying what was being read.
absl::Status WriteAll(int fd, const void* data, size_t n);
absl::Status ReadAll(int fd, void* data, size_t n, const char* what);

absl::Status WriteHello(int fd, const std::string& token);
// The token the peer sent; InvalidArgument for a wrong magic, version or token length.
absl::StatusOr<std::string> ReadHello(int fd);

// One message of a push; `payload` is the chunk's data (the message's own data field must be empty).
absl::Status WritePushFrame(int fd, const PushMessage& message, const void* payload, size_t payload_bytes);
absl::Status WriteEndOfPush(int fd);
// Reads one frame into *message; a chunk's payload is read straight into *buffer, which is then swapped into the
// chunk's data. Swap it back once the message is used (buffer->swap(*message->mutable_chunk()->mutable_data())) and
// the next payload of the same size lands in the same memory. Returns false for the end-of-push frame.
absl::StatusOr<bool> ReadPushFrame(int fd, PushMessage* message, uint64_t max_payload_bytes, std::string* buffer);

absl::Status WritePushResult(int fd, const absl::Status& status, const PushReply& reply);
// Reads the coordinator's answer to a push. The status returned is the connection's (I/O or framing); when it is
// OK, *answer is the coordinator's: its PushReply, or the status it refused the push with.
absl::Status ReadPushResult(int fd, absl::StatusOr<PushReply>* answer);

}  // namespace diloco
