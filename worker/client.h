// CoordinatorClient: a worker's connection to the coordinator. One channel and stub reused for every call, keepalive
// on, a deadline on every RPC (workers.rpc_timeout_s; on a pull or push stream, without progress: StreamWatch). Pull
// streams theta into preallocated tensors; Push streams a pseudo-gradient as chunks after a header (or, when the
// coordinator's Join reply names a push port, comm.transport tcp, over a plain TCP connection: worker/tcp_pusher.h; a
// failed TCP push is sent again over gRPC). Errors come back as absl::Status with the gRPC code (UNAVAILABLE: retry;
// ABORTED: push again; FAILED_PRECONDITION: round closed or config refused; NOT_FOUND: not a member, Join again).
// Compiles without LibTorch: the tensors come in as a ChunkAssembler (pull) and a RoundResult (push), declared here and
// defined in proto/tensor_chunks.h and worker/round_result.h, which only client.cc includes.
// Thread-safe (gRPC stubs are; TcpPusher pushes one at a time); the heartbeat thread and the exchange share one client.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/diloco.grpc.pb.h"
#include "proto/topk_params.h"
#include "proto/transport_security.h"
#include "worker/protocol_decision.h"

namespace diloco {

class ChunkAssembler;  // proto/tensor_chunks.h
class TensorChunker;   // proto/tensor_chunks.h
class TcpPusher;       // worker/tcp_pusher.h
class UpdateApplier;   // proto/sparse_update.h
struct RoundResult;    // worker/round_result.h

struct PullResult {
  int64_t round = 0;
  bool run_complete = false;
  int64_t bytes = 0;
  int64_t inner_steps = 0;  // the H the coordinator assigns this worker (DyLU); 0 = inner.steps
  bool sparse = false;      // the pull was the round's sparse update (PROTOCOL.md "Sparse pulls")
  int64_t changed = 0;      // sparse: the positions it changed
  uint64_t theta_hash = 0;  // sparse: the coordinator's hash of theta_round, which the worker's copy now has
  uint64_t theta_id = 0;    // PullHeader.theta_id: which theta_round (echoed in the pushes computed against it)
};

// The deadline of a streaming call (a pull or a push): the call is cancelled once no message has been read or written
// for `stall_s` (workers.rpc_timeout_s), however long the whole stream takes. A fixed deadline on the whole call cut
// every pull of a large model over a slow link (8B parameters in fp32: 32 GB, 256 s at 1 Gb/s) and retried it
// forever. Progress() from the call's thread; a watcher thread of its own cancels. One per call.
class StreamWatch {
 public:
  StreamWatch(grpc::ClientContext* ctx, double stall_s);
  ~StreamWatch();
  void Progress();
  // The call's status, or DEADLINE_EXCEEDED naming `what` when the watch cancelled it.
  absl::Status Finish(const grpc::Status& call, const std::string& what) const;

 private:
  using Clock = std::chrono::steady_clock;
  grpc::ClientContext* ctx_;
  Clock::duration stall_;
  std::atomic<Clock::rep> last_progress_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::atomic<bool> expired_{false};
  std::thread watcher_;
};

// What a heartbeat reply says, as the worker's protocol decisions read it (worker/protocol_decision.h).
HeartbeatView HeartbeatViewOf(const HeartbeatReply& reply);

class CoordinatorClient {
 public:
  // Pushes are encoded with push_codec (proto/codec.h); pulls decode whatever codec the coordinator sends.
  // `fingerprint`: the model's (proto/tensor_spec.h), sent with every call.
  // `security`: TLS credentials of the channel and the token attached to every call (default: plaintext, none).
  CoordinatorClient(const std::string& address, std::string worker_id, std::string fingerprint, double rpc_timeout_s,
                    int64_t chunk_bytes, Codec push_codec, TransportSecurity security = {});
  ~CoordinatorClient();

  // shard_hint >= 0: the shard this worker had (after a coordinator restart), kept if it is free; likewise
  // reader_hint, its JoinReply.shard_reader. push_parts: the part streams of each push (JoinRequest.push_parts).
  // data: the worker's tokenizer digest and data.split (JoinRequest.data; empty: not said).
  absl::StatusOr<JoinReply> Join(const ModelSpec& model, int32_t threads, const std::string& device,
                                 int32_t shard_hint = -1, int32_t fragments = 1, int32_t cluster_size = 1,
                                 int32_t reader_hint = -1, int32_t push_parts = 1, const DataSpec& data = DataSpec());
  absl::Status Leave(const std::string& reason);
  // wait_ms > 0: the coordinator may hold the answer while it would say "round `round` open, push counted"
  // (HeartbeatRequest.wait_ms); the call's deadline is the usual rpc_timeout_s plus wait_ms.
  absl::StatusOr<HeartbeatReply> Heartbeat(int64_t round, int64_t wait_ms = 0);
  // Streams the current global parameters into `into` (made over InnerTrainer::MakeParameterBuffers' tensors); with
  // fragment >= 0, `into` holds just that fragment's tensors (Streaming DiLoCo) and only they are pulled.
  absl::StatusOr<PullResult> Pull(ChunkAssembler& into, int fragment = -1);
  // The same, saying that `sparse`'s tensors (the same as `into`'s) hold theta_{have_round} bit for bit: the
  // coordinator may answer with the round's sparse update, applied through `sparse` and checked against the header's
  // theta hash (PROTOCOL.md "Sparse pulls"). A sparse pull that fails (a bad chunk, a broken stream, a hash that
  // differs) may have changed some of the tensors: it returns UNAVAILABLE, and the caller pulls again without
  // have_round. `touched` (optional): set when a chunk came, so that the tensors may have changed (a pull refused
  // before any chunk, say while the run's last round is checkpointed, leaves them as they were).
  absl::StatusOr<PullResult> Pull(ChunkAssembler& into, int fragment, int64_t have_round, UpdateApplier* sparse,
                                  bool* touched = nullptr);
  // Sends the pseudo-gradient (of fragment result.report.fragment) computed against round `round`, after a header
  // with the round's report (FillPushHeader); returns the payload bytes sent.
  absl::StatusOr<int64_t> Push(int64_t round, const RoundResult& result);
  // comm.cluster_parts (worker/part_exchange.h), always over gRPC: PushPart streams `header` (its part, parts and
  // range set by the caller) and then the chunks of `chunker`; returns the payload bytes. PullPart pulls elements
  // [begin, end) of the flat buffer of `fragment` (-1: the whole model), handing each chunk to `accept` (the first
  // error it returns ends the pull as DATA_LOSS); the caller checks that every element came.
  absl::StatusOr<int64_t> PushPart(const PushHeader& header, TensorChunker& chunker);
  absl::StatusOr<PullResult> PullPart(int fragment, int64_t begin, int64_t end,
                                      const std::function<absl::Status(const TensorChunk&)>& accept);
  // push_codec topk: the block length and kept values per block (comm.topk_chunk, comm.topk_per_chunk).
  void set_topk(TopkParams topk) { topk_ = topk; }
  // Seconds since a call last got an answer from the coordinator (any status but IsTransient's, proto/grpc_status.h);
  // from construction before the first. The heartbeat thread's calls count:
  // a coordinator answering heartbeats is alive while a push waits on its UNAVAILABLE "retry".
  double seconds_since_answer() const;

 private:
  RequestMeta Meta(int64_t round) const ABSL_LOCKS_EXCLUDED(pulled_mu_);
  // A whole or sparse pull that succeeded: its round and theta id name the theta the next pushes are computed against.
  absl::StatusOr<PullResult> RememberPulled(absl::StatusOr<PullResult> pulled) ABSL_LOCKS_EXCLUDED(pulled_mu_);
  // The push's chunks: result.encoded replayed when error feedback encoded them, else encoded here.
  TensorChunker MakeChunker(const RoundResult& result) const;
  // One gRPC push stream: `message` (holding the header) first, then every chunk of `chunker`; the bytes sent.
  absl::StatusOr<int64_t> StreamPush(PushMessage& message, TensorChunker& chunker);
  // The end of a sparse pull: its result, or UNAVAILABLE naming what went wrong (the call's status, a refused
  // chunk, a short stream, a theta hash that differs).
  static absl::StatusOr<PullResult> FinishSparsePull(const absl::Status& call, const absl::Status& error,
                                                     bool have_header, uint64_t theta_hash, const UpdateApplier& sparse,
                                                     PullResult result);
  // Sets the call's deadline and attaches the token (security.token_file), if any.
  void Prepare(grpc::ClientContext* ctx) const;
  // A streaming call: the token only; its deadline is a StreamWatch's.
  void PrepareStream(grpc::ClientContext* ctx) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<diloco::Coordinator::Stub> stub_;
  std::string worker_id_;
  std::string fingerprint_;
  double rpc_timeout_s_;
  int64_t chunk_bytes_;
  Codec push_codec_;
  TopkParams topk_;
  TransportSecurity security_;
  // comm.transport tcp: the push port the last Join named (0: push over gRPC) and the connection to it.
  std::atomic<int> push_port_{0};
  std::atomic<int> known_push_port_{0};  // the port last named (Join or heartbeat), even while pushes go over gRPC
  static constexpr int kTcpRetryHeartbeats = 10;  // after a TCP push fell back to gRPC: heartbeats until TCP again
  std::atomic<int> heartbeats_on_grpc_{0};
  // The round and theta id of the last pull that succeeded, whole, sparse or a part (RequestMeta.theta_id of the
  // requests naming that round).
  mutable absl::Mutex pulled_mu_;
  int64_t pulled_round_ ABSL_GUARDED_BY(pulled_mu_) = -1;
  uint64_t pulled_theta_id_ ABSL_GUARDED_BY(pulled_mu_) = 0;
  std::unique_ptr<TcpPusher> tcp_pusher_;
  std::atomic<std::chrono::steady_clock::rep> last_answer_;  // steady_clock ticks (seconds_since_answer)
  // Notes `status` in last_answer_ when the coordinator gave it; returns it.
  absl::Status Noted(absl::Status status);
};

}  // namespace diloco
