#include "coordinator/tcp_push_listener.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <future>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "coordinator/push_session.h"
#include "proto/peer_text.h"
#include "proto/push_frames.h"
#include "proto/transport_security.h"

namespace diloco {
namespace {

std::string PeerName(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return absl::StrCat(host, ":", port);
}

// A peer that vanishes without closing (power loss, cable) is noticed within ~25 s instead of never.
void SetKeepalive(int fd) {
  int on = 1, idle = 10, interval = 5, count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

// One received frame on its way through the ingest queue: the message and the buffer its payload was read into.
struct Frame {
  PushMessage message;
  std::string buffer;
};

// A connection's cleared frames, kept to read into (their payload capacity reused). The connection thread takes,
// the ingest items give back; up to kMaxSpares are kept (the lane holds at most a few frames at once).
class FramePool {
 public:
  std::shared_ptr<Frame> Take() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (spares_.empty()) return std::make_shared<Frame>();
    std::shared_ptr<Frame> frame = std::move(spares_.back());
    spares_.pop_back();
    return frame;
  }
  void Give(std::shared_ptr<Frame> frame) ABSL_LOCKS_EXCLUDED(mu_) {
    if (frame->message.has_chunk()) frame->buffer.swap(*frame->message.mutable_chunk()->mutable_data());
    absl::MutexLock lock(&mu_);
    if (spares_.size() < kMaxSpares) spares_.push_back(std::move(frame));
  }

 private:
  static constexpr size_t kMaxSpares = 4;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Frame>> spares_ ABSL_GUARDED_BY(mu_);
};

// One push's session and the first exception its items hit. Touched only by the push's ingest items, which run one
// at a time (one lane per connection), so it needs no lock.
struct PushState {
  explicit PushState(CoordinatorCore* core) : session(core) {}
  PushSession session;
  absl::Status failure;  // an exception from the session (e.g. bad_alloc): the push fails with INTERNAL

  void Consume(const PushMessage& message) {
    if (!failure.ok() || !session.refusal().ok()) return;  // after a refusal: read on to the push's end
    try {
      (void)session.OnMessage(message);
    } catch (const std::exception& e) {
      failure = absl::InternalError(absl::StrCat("push failed on the coordinator: ", e.what()));
      session.OnBroken(e.what());
    }
  }

  absl::StatusOr<PushReply> End() {
    if (!failure.ok()) return failure;
    if (!session.refusal().ok()) return session.refusal();
    try {
      return session.OnEnd();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("push failed on the coordinator: ", e.what()));
    }
  }
};

}  // namespace

TcpPushListener::TcpPushListener(CoordinatorCore* core, IngestQueue* ingest, std::string token,
                                 uint64_t max_payload_bytes, double stall_s)
    : core_(core),
      ingest_(ingest),
      token_(std::move(token)),
      max_payload_bytes_(max_payload_bytes),
      stall_s_(stall_s) {}

TcpPushListener::~TcpPushListener() { Stop(); }

absl::StatusOr<int> TcpPushListener::Start(const std::string& host_in, int port) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.transport tcp: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      listen_fd_ = fd;
    } else {
      error = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("comm.transport tcp: cannot listen on ", host, ":", port, ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return bound_port;
}

void TcpPushListener::Stop() {
  if (stopping_.exchange(true)) return;
  if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  std::vector<Connection> servers;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : connections_) shutdown(fd, SHUT_RDWR);  // wakes their recv()/poll(); each closes its own socket
    servers.swap(servers_);
  }
  for (Connection& c : servers) c.thread.join();
}

void TcpPushListener::JoinFinished() {
  for (auto it = servers_.begin(); it != servers_.end();) {
    if (*it->done) {
      it->thread.join();
      it = servers_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpPushListener::AcceptLoop() {
  while (!stopping_) {
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (!stopping_) spdlog::error("tcp push listener: accept failed: {}", std::strerror(errno));
      return;
    }
    SetKeepalive(fd);
    timeval tv{static_cast<time_t>(stall_s_),
               static_cast<suseconds_t>((stall_s_ - static_cast<int64_t>(stall_s_)) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(fd);
      return;
    }
    JoinFinished();
    Admit(fd, PeerName(peer));
  }
}

bool TcpPushListener::Admit(int fd, const std::string& name) {
  if (servers_.size() >= kMaxConnections) {
    spdlog::warn("tcp push connection from {} refused: {} connections open already", name, servers_.size());
    close(fd);
    return false;
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  try {
    connections_.push_back(fd);
    servers_.push_back({std::thread([this, fd, name, done] {
                          Serve(fd, name);
                          *done = true;
                        }),
                        done});
  } catch (const std::system_error& e) {  // no thread to be had: refuse this one, keep serving the others
    connections_.pop_back();
    spdlog::warn("tcp push connection from {} refused: {}", name, e.what());
    close(fd);
    return false;
  }
  return true;
}

void TcpPushListener::Forget(int fd) {
  absl::MutexLock lock(&mu_);
  connections_.erase(std::remove(connections_.begin(), connections_.end(), fd), connections_.end());
  close(fd);
}

void TcpPushListener::Serve(int fd, const std::string& peer) {
  auto token = ReadHello(fd);
  if (!token.ok()) {
    if (!stopping_)
      spdlog::warn("tcp push connection from {} refused: {}", peer,
                   Truncated(token.status().message(), kMaxRefusalBytes));
    Forget(fd);
    return;
  }
  if (!token_.empty() && !ConstantTimeEquals(*token, token_)) {
    const absl::Status refused = absl::UnauthenticatedError(token->empty() ? "missing token (security.token_file)"
                                                                           : "wrong token (security.token_file)");
    spdlog::warn("tcp push connection from {} refused: {}", peer, Truncated(refused.message(), kMaxRefusalBytes));
    (void)WritePushResult(fd, refused, PushReply());
    Forget(fd);
    return;
  }
  const std::shared_ptr<IngestQueue::Lane> lane = ingest_->NewLane();
  while (!stopping_) {
    // Between pushes the worker trains, for as long as it takes: wait without the stall limit.
    pollfd waiting{fd, POLLIN, 0};
    if (poll(&waiting, 1, -1) < 0 && errno != EINTR) break;
    if (!ServePush(fd, peer, lane)) break;
  }
  Forget(fd);
}

bool TcpPushListener::ServePush(int fd, const std::string& peer, const std::shared_ptr<IngestQueue::Lane>& lane) {
  auto push = std::make_shared<PushState>(core_);
  auto frames = std::make_shared<FramePool>();
  bool first = true;
  absl::StatusOr<bool> more = true;
  for (;;) {
    std::shared_ptr<Frame> frame = frames->Take();
    more = ReadPushFrame(fd, &frame->message, max_payload_bytes_, &frame->buffer);
    if (!more.ok() || !*more) break;
    first = false;
    const int64_t bytes = frame->message.has_chunk() ? static_cast<int64_t>(frame->message.chunk().data().size()) : 0;
    lane->Post(bytes, [push, frames, frame]() mutable {
      push->Consume(frame->message);
      frames->Give(std::move(frame));
    });
    lane->WaitForRoom();  // back-pressure: the queue's bound holds for this connection too
  }
  if (!more.ok()) {
    // A close between pushes is how a worker says goodbye; anything else breaks the push off.
    if (!(first && absl::IsNotFound(more.status())) && !stopping_) {
      spdlog::warn("tcp push connection from {} closed: {}", peer,
                   Truncated(more.status().message(), kMaxRefusalBytes));
    }
    lane->Post(0, [push, why = std::string(more.status().message())] { push->session.OnBroken(why); });
    return false;
  }
  auto result = std::make_shared<std::promise<absl::StatusOr<PushReply>>>();
  std::future<absl::StatusOr<PushReply>> answer = result->get_future();
  lane->Post(0, [push, result] { result->set_value(push->End()); });
  const absl::StatusOr<PushReply> done = answer.get();  // after every frame of the push has been consumed
  return WritePushResult(fd, done.status(), done.ok() ? *done : PushReply()).ok();
}

}  // namespace diloco
