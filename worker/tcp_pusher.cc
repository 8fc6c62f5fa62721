#include "worker/tcp_pusher.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/push_frames.h"

namespace diloco {

TcpPusher::TcpPusher(std::string host, std::string token, double timeout_s)
    : host_(std::move(host)), token_(std::move(token)), timeout_s_(timeout_s) {}

TcpPusher::~TcpPusher() {
  absl::MutexLock lock(&mu_);
  Close();
}

void TcpPusher::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status TcpPusher::Connect(int port) {
  std::string host = host_;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // A coordinator that stops answering mid-push is given up on after the RPC timeout, as over gRPC.
    timeval tv{static_cast<time_t>(timeout_s_),
               static_cast<suseconds_t>((timeout_s_ - static_cast<int64_t>(timeout_s_)) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    const int on = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      fd_ = fd;
    } else {
      error = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (fd_ < 0) return absl::UnavailableError(absl::StrCat("cannot connect: ", error));
  port_ = port;
  absl::Status s = WriteHello(fd_, token_);
  if (!s.ok()) Close();
  return s;
}

absl::StatusOr<int64_t> TcpPusher::Push(int port, const PushHeader& header, TensorChunker& chunker, bool* answered) {
  absl::MutexLock lock(&mu_);
  if (answered != nullptr) *answered = false;
  const std::string where = absl::StrCat("push over tcp to ", host_, ":", port, ": ");
  auto unavailable = [&](const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Close();
    return absl::UnavailableError(absl::StrCat(where, s.message()));
  };
  if (fd_ >= 0 && port_ != port) Close();
  if (fd_ < 0) {
    if (absl::Status s = Connect(port); !s.ok()) return unavailable(s);
  }
  PushMessage message;
  *message.mutable_header() = header;
  if (absl::Status s = WritePushFrame(fd_, message, nullptr, 0); !s.ok()) return unavailable(s);
  std::string encoded;
  std::string_view raw;
  while (chunker.Next(message.mutable_chunk(), &raw)) {
    // The metadata goes in the frame, the bytes after it: fp32 straight from the tensor's memory, encoded codecs
    // from the buffer the codec wrote (moved out of the message, and back for the next chunk's encoding).
    encoded.swap(*message.mutable_chunk()->mutable_data());
    const std::string_view payload = raw.empty() ? std::string_view(encoded) : raw;
    absl::Status s = WritePushFrame(fd_, message, payload.data(), payload.size());
    encoded.swap(*message.mutable_chunk()->mutable_data());
    if (!s.ok()) return unavailable(s);
  }
  if (absl::Status s = WriteEndOfPush(fd_); !s.ok()) return unavailable(s);
  absl::StatusOr<PushReply> answer;
  if (absl::Status s = ReadPushResult(fd_, &answer); !s.ok()) return unavailable(s);
  if (answered != nullptr) *answered = true;
  if (!answer.ok()) {
    if (answer.status().code() == absl::StatusCode::kUnauthenticated) Close();  // refused at the hello: closed
    return answer.status();
  }
  return chunker.bytes_emitted();
}

}  // namespace diloco
