#include "proto/push_frames.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/peer_text.h"

namespace diloco {
namespace {

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLE(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

absl::StatusOr<uint32_t> ReadU32(int fd, const char* what) {
  unsigned char b[4];
  absl::Status s = ReadAll(fd, b, 4, what);
  if (!s.ok()) return s;
  return static_cast<uint32_t>(GetLE(b, 4));
}

absl::StatusOr<uint64_t> ReadU64(int fd, const char* what) {
  unsigned char b[8];
  absl::Status s = ReadAll(fd, b, 8, what);
  if (!s.ok()) return s;
  return GetLE(b, 8);
}

}  // namespace

absl::Status WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::UnavailableError(absl::StrCat("send failed: ", std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t n, const char* what) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && got == 0) return absl::NotFoundError(absl::StrCat("connection closed before ", what));
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // SO_RCVTIMEO ran out
      return absl::UnavailableError(absl::StrCat("timed out reading ", what, " (", got, " of ", n, " bytes)"));
    }
    if (r <= 0) {
      return absl::UnavailableError(absl::StrCat("connection lost reading ", what, " (", got, " of ", n, " bytes",
                                                 r < 0 ? absl::StrCat(": ", std::strerror(errno)) : "", ")"));
    }
    got += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::Status WriteHello(int fd, const std::string& token) {
  std::string out;
  PutU32(&out, kPushFramesMagic);
  PutU32(&out, kPushFramesVersion);
  PutU32(&out, static_cast<uint32_t>(token.size()));
  out += token;
  return WriteAll(fd, out.data(), out.size());
}

absl::StatusOr<std::string> ReadHello(int fd) {
  auto magic = ReadU32(fd, "the hello");
  if (!magic.ok()) return magic.status();
  if (*magic != kPushFramesMagic) {
    return absl::InvalidArgumentError(absl::StrCat("not a push connection (magic 0x", absl::Hex(*magic), ")"));
  }
  auto version = ReadU32(fd, "the hello");
  if (!version.ok()) return version.status();
  if (*version != kPushFramesVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("push frames version ", *version, ", this coordinator speaks ", kPushFramesVersion));
  }
  auto length = ReadU32(fd, "the hello");
  if (!length.ok()) return length.status();
  if (*length > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat("token of ", *length, " bytes (at most ", kMaxTokenBytes, ")"));
  }
  std::string token(*length, '\0');
  absl::Status s = ReadAll(fd, token.data(), token.size(), "the token");
  if (!s.ok()) return s;
  return token;
}

absl::Status WritePushFrame(int fd, const PushMessage& message, const void* payload, size_t payload_bytes) {
  std::string head;
  PutU32(&head, static_cast<uint32_t>(message.ByteSizeLong()));
  if (!message.AppendToString(&head)) return absl::InternalError("push frame: cannot serialize the message");
  PutU64(&head, payload_bytes);
  absl::Status s = WriteAll(fd, head.data(), head.size());
  if (!s.ok() || payload_bytes == 0) return s;
  return WriteAll(fd, payload, payload_bytes);
}

absl::Status WriteEndOfPush(int fd) {
  std::string out;
  PutU32(&out, 0);
  return WriteAll(fd, out.data(), out.size());
}

absl::StatusOr<bool> ReadPushFrame(int fd, PushMessage* message, uint64_t max_payload_bytes, std::string* buffer) {
  auto length = ReadU32(fd, "a push frame");
  if (!length.ok()) return length.status();
  if (*length == 0) return false;
  if (*length > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("push frame: message of ", *length, " bytes (at most ", kMaxMessageBytes, ")"));
  }
  std::string bytes(*length, '\0');
  absl::Status s = ReadAll(fd, bytes.data(), bytes.size(), "a push message");
  if (!s.ok()) return s;
  if (!message->ParseFromString(bytes)) return absl::InvalidArgumentError("push frame: malformed PushMessage");
  if (message->has_chunk() && !message->chunk().data().empty()) {
    return absl::InvalidArgumentError("push frame: a chunk's data must travel as the frame's payload");
  }
  auto payload = ReadU64(fd, "a payload length");
  if (!payload.ok()) return payload.status();
  if (*payload > max_payload_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("push frame: payload of ", *payload, " bytes (at most ", max_payload_bytes, ")"));
  }
  if (*payload > 0) {
    if (!message->has_chunk()) return absl::InvalidArgumentError("push frame: a payload after a non-chunk message");
    if (buffer->size() != *payload) buffer->resize(*payload);
    s = ReadAll(fd, buffer->data(), buffer->size(), "a chunk's payload");
    if (!s.ok()) return s;
    buffer->swap(*message->mutable_chunk()->mutable_data());
  }
  return true;
}

absl::Status WritePushResult(int fd, const absl::Status& status, const PushReply& reply) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(status.code()));
  const std::string text = Truncated(status.message(), kMaxRefusalBytes);
  PutU32(&out, static_cast<uint32_t>(text.size()));
  out += text;
  const std::string body = status.ok() ? reply.SerializeAsString() : std::string();
  PutU32(&out, static_cast<uint32_t>(body.size()));
  out += body;
  return WriteAll(fd, out.data(), out.size());
}

absl::Status ReadPushResult(int fd, absl::StatusOr<PushReply>* answer) {
  auto code = ReadU32(fd, "the push result");
  if (!code.ok()) return code.status();
  auto length = ReadU32(fd, "the push result");
  if (!length.ok()) return length.status();
  if (*length > kMaxMessageBytes) return absl::DataLossError("push result: oversized status message");
  std::string text(*length, '\0');
  absl::Status s = ReadAll(fd, text.data(), text.size(), "the push result");
  if (!s.ok()) return s;
  auto reply_length = ReadU32(fd, "the push result");
  if (!reply_length.ok()) return reply_length.status();
  if (*reply_length > kMaxMessageBytes) return absl::DataLossError("push result: oversized reply");
  std::string body(*reply_length, '\0');
  s = ReadAll(fd, body.data(), body.size(), "the push result");
  if (!s.ok()) return s;
  if (*code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(absl::StrCat("push result: unknown status code ", *code));
  }
  if (*code != 0) {
    *answer = absl::Status(static_cast<absl::StatusCode>(*code), text);
    return absl::OkStatus();
  }
  PushReply reply;
  if (!reply.ParseFromString(body)) return absl::DataLossError("push result: malformed PushReply");
  *answer = std::move(reply);
  return absl::OkStatus();
}

}  // namespace diloco
