#include "coordinator/service.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <memory>
#include <thread>

#include "coordinator/push_session.h"
#include "proto/grpc_status.h"
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
std::vector<std::pair<std::string, at::Tensor>> FragmentOf(const CoordinatorCore& core, const ParamSnapshot& snapshot,
                                                           int fragment) {
  if (fragment < 0) return snapshot.params;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i : core.fragment_members(fragment)) out.push_back(snapshot.params[i]);
  return out;
}

// Streams one snapshot of theta (or one fragment of it): a header, then the chunks.
class PullReactor : public grpc::ServerWriteReactor<PullMessage> {
 public:
  PullReactor(CoordinatorCore* core, std::string worker_id, std::shared_ptr<const ParamSnapshot> snapshot,
              int fragment, int64_t chunk_bytes, Codec codec)
      : core_(core),
        worker_id_(std::move(worker_id)),
        snapshot_(std::move(snapshot)),
        tensors_(FragmentOf(*core, *snapshot_, fragment)),
        chunker_(tensors_, chunk_bytes, codec) {
    PullHeader* h = message_.mutable_header();
    h->set_round(snapshot_->round);
    h->set_run_complete(snapshot_->complete);
    h->set_num_tensors(static_cast<int64_t>(tensors_.size()));
    int64_t n = 0;
    for (const auto& [name, t] : tensors_) n += t.numel();
    h->set_num_elements(n);
    h->set_fragment(fragment);
    h->set_inner_steps(core_->InnerStepsFor(worker_id_));
    StartWrite(&message_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "pull stream broken"));
      return;
    }
    try {
      if (chunker_.Next(message_.mutable_chunk())) {
        StartWrite(&message_);
        return;
      }
      core_->CountBytesSent(worker_id_, chunker_.bytes_emitted());
      Finish(grpc::Status::OK);
    } catch (const std::exception& e) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, e.what()));
    }
  }

  void OnDone() override { delete this; }

 private:
  CoordinatorCore* core_;
  std::string worker_id_;
  std::shared_ptr<const ParamSnapshot> snapshot_;
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
  TensorChunker chunker_;
  PullMessage message_;
};

// Receives one pseudo-gradient stream and hands each message to a PushSession (push_session.h), which validates it
// and folds its chunks as they arrive; this reactor only moves bytes.
class PushReactor : public grpc::ServerReadReactor<PushMessage> {
 public:
  PushReactor(CoordinatorCore* core, PushReply* reply) : session_(core), reply_(reply) { StartRead(&message_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side: the push must be complete
      absl::StatusOr<PushReply> done = session_.OnEnd();
      if (done.ok()) *reply_ = std::move(*done);
      Finish(ToGrpc(done.status()));
      return;
    }
    absl::Status status = session_.OnMessage(message_);
    if (!status.ok()) {
      Finish(ToGrpc(status));
      return;
    }
    StartRead(&message_);
  }

  void OnDone() override {
    session_.OnBroken("stream ended");  // no-op once committed or refused
    delete this;
  }

 private:
  PushSession session_;
  PushReply* reply_;
  PushMessage message_;
};

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::Join(grpc::CallbackServerContext* ctx, const JoinRequest* request,
                                                   JoinReply* reply) {
  if (auto* refused = RefuseUnary(auth_, ctx, "Join", request->meta().worker_id())) return refused;
  return Unary(ctx, [&]() -> absl::Status {
    auto r = coordinator_->Join(*request);
    if (!r.ok()) {
      spdlog::warn("join refused for '{}': {}", request->meta().worker_id(), std::string(r.status().message()));
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
  return Unary(ctx, [&]() -> absl::Status {
    auto r = coordinator_->Heartbeat(*request);
    if (!r.ok()) return r.status();
    *reply = std::move(*r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::GetStatus(grpc::CallbackServerContext* ctx, const StatusRequest*,
                                                        StatusReply* reply) {
  if (auto* refused = RefuseUnary(auth_, ctx, "GetStatus")) return refused;
  return Unary(ctx, [&] {
    *reply = coordinator_->Status();
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
  // Writing a checkpoint blocks on the disk: do it on a thread of its own, never on a gRPC thread.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  std::thread([this, reactor, reply] {
    grpc::Status status;
    try {
      auto written = coordinator_->CheckpointNow();
      if (written.ok()) {
        reply->set_path(written->path);
        reply->set_round(written->round);
      }
      status = ToGrpc(written.status());
    } catch (const std::exception& e) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
    reactor->Finish(status);
  }).detach();
  return reactor;
}

grpc::ServerWriteReactor<PullMessage>* CoordinatorService::PullParameters(grpc::CallbackServerContext* ctx,
                                                                          const PullRequest* request) {
  if (auto* refused = RefuseStream<grpc::ServerWriteReactor<PullMessage>>(auth_, ctx, "PullParameters")) {
    return refused;
  }
  auto snapshot = coordinator_->BeginPull(*request);
  if (!snapshot.ok()) {
    // A reactor that finishes at once with the error.
    class Refuse : public grpc::ServerWriteReactor<PullMessage> {
     public:
      explicit Refuse(const absl::Status& s) { Finish(ToGrpc(s)); }
      void OnDone() override { delete this; }
    };
    return new Refuse(snapshot.status());
  }
  return new PullReactor(coordinator_, request->meta().worker_id(), std::move(*snapshot),
                         request->has_fragment() ? request->fragment() : -1, chunk_bytes_, pull_codec_);
}

grpc::ServerReadReactor<PushMessage>* CoordinatorService::PushPseudoGradient(grpc::CallbackServerContext* ctx,
                                                                             PushReply* reply) {
  if (auto* refused = RefuseStream<grpc::ServerReadReactor<PushMessage>>(auth_, ctx, "PushPseudoGradient")) {
    return refused;
  }
  return new PushReactor(coordinator_, reply);
}

}  // namespace diloco
