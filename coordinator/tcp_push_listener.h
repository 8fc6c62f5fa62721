// TcpPushListener: the coordinator's end of comm.transport tcp (framing in proto/push_frames.h). It listens on a TCP
// port beside the gRPC server (whose Join reply tells workers the port), checks each connection's hello against
// security.token, and drives one PushSession per push exactly as the gRPC PushPseudoGradient stream does, so
// validation, refusals, accounting and the round's handling of a broken push are the same on both transports; only
// the bytes move differently (a chunk's payload is received straight into a reused buffer, no protobuf copy).
// A connection thread only moves bytes, as a gRPC reactor does: each frame it reads goes, as an item, to the
// connection's lane of the service's IngestQueue (ingest_queue.h), whose threads hand it to the PushSession
// (decoding, the NaN/Inf check, the fold); the thread reads the next frame once the lane has room (the queue's
// byte bound holds for both transports) and waits for the push's result to write the answer.
// A refused push is read to its end, then answered with the refusal; a connection that breaks the framing, or breaks
// off mid-push, is closed with one log line (the half-received push is aborted, as a broken gRPC stream is).
// Time limits: a connection must send its hello, and a push once begun each of its frames, within `stall_s`
// seconds, or it is closed (and the push aborted); between pushes a connection may idle as long as it likes.
// Threads: one accepting, one per connection (each worker keeps one; at most kMaxConnections at once, finished
// ones are joined as new ones come). Stop() (or the destructor) shuts every socket and joins them. Start and Stop
// from one thread; the connection threads use the IngestQueue and the CoordinatorCore, which are thread-safe and
// must outlive the listener.
// Unlike gRPC, which answers a refused push at once, the worker learns of a refusal (a late push) only after sending
// all of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/coordinator.h"
#include "coordinator/ingest_queue.h"

namespace diloco {

class TcpPushListener {
 public:
  // `token`: security.token ("" = none); `max_payload_bytes`: the largest chunk payload accepted (comm.chunk_bytes
  // plus slack, as the gRPC server's message limit).
  static constexpr size_t kMaxConnections = 1024;

  TcpPushListener(CoordinatorCore* core, IngestQueue* ingest, std::string token, uint64_t max_payload_bytes,
                  double stall_s = 60);
  ~TcpPushListener();
  TcpPushListener(const TcpPushListener&) = delete;
  TcpPushListener& operator=(const TcpPushListener&) = delete;

  // Listens on host:port (port 0: any free one) and starts accepting; returns the bound port.
  absl::StatusOr<int> Start(const std::string& host, int port);
  void Stop();

 private:
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts a thread serving fd; false (fd closed) when no more may open.
  bool Admit(int fd, const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Serve(int fd, const std::string& peer);
  // Reads one push's frames into the ingest lane; false when the connection must close.
  bool ServePush(int fd, const std::string& peer, const std::shared_ptr<IngestQueue::Lane>& lane);
  void Forget(int fd) ABSL_LOCKS_EXCLUDED(mu_);
  void JoinFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  CoordinatorCore* core_;
  IngestQueue* ingest_;
  const std::string token_;
  const uint64_t max_payload_bytes_;
  const double stall_s_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> connections_ ABSL_GUARDED_BY(mu_);     // open connection sockets
  std::vector<Connection> servers_ ABSL_GUARDED_BY(mu_);  // one per accepted connection
};

}  // namespace diloco
