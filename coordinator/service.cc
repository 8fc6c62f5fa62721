#include "coordinator/service.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/pull_payload.h"
#include "coordinator/push_session.h"
#include "proto/grpc_status.h"
#include "proto/peer_text.h"
#include "proto/tensor_chunks.h"

namespace diloco {
namespace {

// Runs `body` and finishes a unary reactor with its status; exceptions become INTERNAL.
template <typename Body>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Body body) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status status;
  try {
    status = ToGrpc(body());
  } catch (const std::exception& e) {
    status = grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
  reactor->Finish(status);
  return reactor;
}

// The tensors of one fragment of a snapshot (all of them for fragment -1).
NamedTensors FragmentOf(const CoordinatorCore& core, const ParamSnapshot& snapshot, int fragment) {
  if (fragment < 0) return snapshot.params;
  NamedTensors out;
  for (size_t i : core.fragment_members(fragment)) out.push_back(snapshot.params[i]);
  return out;
}

// Streams one snapshot of theta (or one fragment of it): a header, then the messages of the snapshot's shared
// PullPayload (pull_payload.h), which no pull copies or encodes again. Synchronous rounds step theta in place: a raw
// message points into theta, so it is written with write-through and, once written, the pull checks that theta
// still holds its round; a pull that finds theta moved on ends with UNAVAILABLE (the worker retries and gets the new
// round; a pull of the old one would have been stale anyway).
class PullReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  PullReactor(CoordinatorCore* core, std::string worker_id, std::shared_ptr<PullPayload> payload,
              const PullHeader& header)
      : core_(core), worker_id_(std::move(worker_id)), payload_(std::move(payload)) {
    PullMessage message;
    *message.mutable_header() = header;
    grpc::Slice slice(message.SerializeAsString());
    message_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&message_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "pull stream broken"));
      return;
    }
    try {
      if (!payload_->Current()) {  // the message just written may have been read from a theta being overwritten
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("the global parameters moved on from round ", payload_->round(),
                                         " while this pull streamed; pull again")));
        return;
      }
      int64_t bytes = 0;
      bool raw = false;
      absl::StatusOr<bool> more = payload_->Message(next_, &message_, &bytes, &raw);
      if (!more.ok()) {
        Finish(ToGrpc(more.status()));
        return;
      }
      if (*more) {
        bytes_sent_ += bytes;
        grpc::WriteOptions options;
        if (raw) options.set_write_through();  // done = the socket has the bytes
        ++next_;
        StartWrite(&message_, options);
        return;
      }
      core_->CountBytesSent(worker_id_, bytes_sent_);
      Finish(grpc::Status::OK);
    } catch (const std::exception& e) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, e.what()));
    }
  }

  void OnDone() override { delete this; }

 private:
  CoordinatorCore* core_;
  std::string worker_id_;
  std::shared_ptr<PullPayload> payload_;
  grpc::ByteBuffer message_;  // the write in flight
  size_t next_ = 0;           // the payload's next message
  int64_t bytes_sent_ = 0;
};

// A server-streaming reactor that finishes at once with `status`.
class RefusedPull : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedPull(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Receives one pseudo-gradient stream and only moves bytes: each message goes, as an item, to the stream's lane of
// the ingest queue (ingest_queue.h), whose threads hand it to a PushSession (push_session.h) that validates it and
// folds its chunks; the push's result (the first refusal, or the reply once the client closed its side) finishes the
// stream from there, with the same status as if it ran here.
// Back-pressure: the next read is issued only while the lane has room; else the lane's next item issues it.
// Lifetime: OnDone posts the reactor's deletion behind the stream's last item.
// Thread-safety: mu_ orders the reads and Finish, which come from gRPC threads and the ingest threads; session_ and
// reply_ are touched only by the lane's items, which run one at a time.
class PushReactor : public grpc::ServerReadReactor<PushMessage> {
 public:
  PushReactor(CoordinatorCore* core, IngestQueue* ingest, PushReply* reply)
      : session_(core), lane_(ingest->NewLane()), reply_(reply) {
    StartRead(&message_);
  }

  // Posts outside mu_: an item may run on this very thread (IngestQueue::Post's fallback once the queue stopped),
  // and the item takes mu_. The room check and paused_ are decided under mu_, where Consume reads them too.
  void OnReadDone(bool ok) override {
    std::shared_ptr<PushMessage> message;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;  // refused while this message was on its way
      if (ok) {
        message = TakeSpare();
        message->Swap(&message_);  // no copy of the payload
      }
    }
    if (!ok) {  // the client closed its side (or the stream broke): the push must be complete
      lane_->Post(0, [this] { End(); });
      return;
    }
    const int64_t bytes = message->has_chunk() ? static_cast<int64_t>(message->chunk().data().size()) : 0;
    lane_->Post(bytes, [this, message] { Consume(message); });
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (lane_->HasRoom()) {
      StartRead(&message_);
    } else {
      paused_ = true;
    }
  }

  void OnDone() override {
    lane_->Post(0, [this] {
      session_.OnBroken("stream ended");  // no-op once committed or refused
      delete this;
    });
  }

 private:
  // Cleared messages kept to read into (their payload capacity reused): up to this many chunk buffers per stream
  // outside the ingest queue's byte bound (ingest_queue.h), so at most kMaxSpares x comm.chunk_bytes per stream.
  static constexpr size_t kMaxSpares = 4;

  // Ingest thread: one message of the stream.
  void Consume(const std::shared_ptr<PushMessage>& message) {
    absl::Status status;
    try {
      status = session_.OnMessage(*message);
    } catch (const std::exception& e) {  // e.g. bad_alloc: the stream must still end
      status = absl::InternalError(absl::StrCat("push failed on the coordinator: ", e.what()));
    }
    message->Clear();  // keeps the payload's capacity for a later message
    absl::MutexLock lock(&mu_);
    if (spares_.size() < kMaxSpares) spares_.push_back(message);
    if (!status.ok()) {
      FinishLocked(ToGrpc(status));
    } else if (paused_ && !finished_ && lane_->HasRoom()) {
      paused_ = false;
      StartRead(&message_);
    }
  }

  // Ingest thread: the client closed its side; the push commits if it is complete.
  void End() {
    absl::StatusOr<PushReply> done = absl::InternalError("push failed on the coordinator");
    try {
      done = session_.OnEnd();
    } catch (const std::exception& e) {  // e.g. bad_alloc: the stream must still end
      done = absl::InternalError(absl::StrCat("push failed on the coordinator: ", e.what()));
    }
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (done.ok()) *reply_ = std::move(*done);
    FinishLocked(ToGrpc(done.status()));
  }

  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(std::move(status));
  }

  std::shared_ptr<PushMessage> TakeSpare() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (spares_.empty()) return std::make_shared<PushMessage>();
    std::shared_ptr<PushMessage> message = std::move(spares_.back());
    spares_.pop_back();
    return message;
  }

  PushSession session_;
  std::shared_ptr<IngestQueue::Lane> lane_;
  PushReply* reply_;
  PushMessage message_;  // the read in flight
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;                             // Finish called
  bool paused_ ABSL_GUARDED_BY(mu_) = false;                               // a read is due once the lane has room
  std::vector<std::shared_ptr<PushMessage>> spares_ ABSL_GUARDED_BY(mu_);  // cleared messages to read into
};

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::Join(grpc::CallbackServerContext* ctx, const JoinRequest* request,
                                                   JoinReply* reply) {
  if (auto* refused = RefuseUnary(auth_, ctx, "Join", request->meta().worker_id())) return refused;
  return Unary(ctx, [&]() -> absl::Status {
    auto r = coordinator_->Join(*request);
    if (!r.ok()) {
      spdlog::warn("join refused for '{}': {}", Truncated(request->meta().worker_id()),
                   Truncated(r.status().message(), kMaxRefusalBytes));
      return r.status();
    }
    *reply = std::move(*r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Leave(grpc::CallbackServerContext* ctx, const LeaveRequest* request,
                                                    LeaveReply*) {
  if (auto* refused = RefuseUnary(auth_, ctx, "Leave", request->meta().worker_id())) return refused;
  return Unary(ctx, [&] { return coordinator_->Leave(*request); });
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const HeartbeatRequest* request, HeartbeatReply* reply) {
  if (auto* refused = RefuseUnary(auth_, ctx, "Heartbeat", request->meta().worker_id())) return refused;
  // Answered at once, or held by the core (wait_ms) and answered from its round thread: Finish may come from any
  // thread, and the request and reply live until it does.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  try {
    coordinator_->Heartbeat(*request, [reactor, reply](absl::StatusOr<HeartbeatReply> r) {
      if (r.ok()) *reply = std::move(*r);
      reactor->Finish(r.ok() ? grpc::Status::OK : ToGrpc(r.status()));
    });
  } catch (const std::exception& e) {  // before the answer: the core throws nothing after calling it
    reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, e.what()));
  }
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetStatus(grpc::CallbackServerContext* ctx, const StatusRequest* request,
                                                        StatusReply* reply) {
  if (auto* refused = RefuseUnary(auth_, ctx, "GetStatus")) return refused;
  return Unary(ctx, [&] {
    *reply = coordinator_->Status();
    coordinator_->NoteWatcher(ctx->peer(), request->watch_interval_ms(), reply->phase() == "complete");
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Drain(grpc::CallbackServerContext* ctx, const DrainRequest* request,
                                                    DrainReply*) {
  if (auto* refused = RefuseUnary(auth_, ctx, "Drain")) return refused;
  return Unary(ctx, [&] { return coordinator_->Drain(request->worker_id()); });
}

grpc::ServerUnaryReactor* CoordinatorService::Checkpoint(grpc::CallbackServerContext* ctx, const CheckpointRequest*,
                                                         CheckpointReply* reply) {
  if (auto* refused = RefuseUnary(auth_, ctx, "Checkpoint")) return refused;
  // Writing a checkpoint blocks on the disk: it runs on the checkpoint executor, never on a gRPC thread.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  checkpoints_.Post([core = coordinator_, reactor, reply](bool run) {
    if (!run) {
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down"));
      return;
    }
    grpc::Status status;
    try {
      auto written = core->CheckpointNow();
      if (written.ok()) {
        reply->set_path(written->path);
        reply->set_round(written->round);
      }
      status = ToGrpc(written.status());
    } catch (const std::exception& e) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
    reactor->Finish(status);
  });
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CoordinatorService::PullParameters(grpc::CallbackServerContext* ctx,
                                                                               const grpc::ByteBuffer* raw_request) {
  if (auto* refused = RefuseStream<grpc::ServerWriteReactor<grpc::ByteBuffer>>(auth_, ctx, "PullParameters")) {
    return refused;
  }
  PullRequest request;
  grpc::ByteBuffer request_bytes(*raw_request);  // shares the slices; Deserialize consumes its argument
  if (!grpc::SerializationTraits<PullRequest>::Deserialize(&request_bytes, &request).ok()) {
    return new RefusedPull(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "PullParameters: malformed PullRequest"));
  }
  auto snapshot = coordinator_->BeginPull(request);
  if (!snapshot.ok()) return new RefusedPull(ToGrpc(snapshot.status()));
  const int fragment = request.has_fragment() ? request.fragment() : -1;
  NamedTensors tensors = FragmentOf(*coordinator_, **snapshot, fragment);
  PullHeader header;
  header.set_round((*snapshot)->round);
  header.set_run_complete((*snapshot)->complete);
  header.set_theta_id((*snapshot)->id);
  std::optional<FlatRange> range;
  if (request.has_range()) range = FlatRange{request.range().begin(), request.range().end()};  // checked by BeginPull
  int64_t elements = 0;
  int64_t touched = 0;  // tensors with elements in the range (all of them without one)
  for (const auto& [name, t] : tensors) {
    const FlatRange own{elements, elements + t.numel()};
    if (!range || (own.begin < range->end && range->begin < own.end)) ++touched;
    elements += t.numel();
  }
  header.set_num_tensors(touched);
  header.set_num_elements(range ? range->size() : elements);
  header.set_fragment(fragment);
  header.set_inner_steps(coordinator_->InnerStepsFor(request.meta().worker_id()));
  if (range) *header.mutable_range() = request.range();
  // Sparse pulls (sparse_pull.h): a worker holding the previous round's theta gets only the round's update.
  if (auto update = coordinator_->SparseUpdateFor(request, (*snapshot)->round); update != nullptr) {
    header.set_sparse(true);
    header.set_theta_hash(update->theta_hash);
    return new PullReactor(coordinator_, request.meta().worker_id(), std::make_shared<PullPayload>(*snapshot, update),
                           header);
  }
  return new PullReactor(coordinator_, request.meta().worker_id(),
                         pulls_.Get(*snapshot, fragment, std::move(tensors), range), header);
}

grpc::ServerReadReactor<PushMessage>* CoordinatorService::PushPseudoGradient(grpc::CallbackServerContext* ctx,
                                                                             PushReply* reply) {
  if (auto* refused = RefuseStream<grpc::ServerReadReactor<PushMessage>>(auth_, ctx, "PushPseudoGradient")) {
    return refused;
  }
  return new PushReactor(coordinator_, &ingest_, reply);
}

}  // namespace diloco
