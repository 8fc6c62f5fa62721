#include "coordinator/service.h"

#include <spdlog/spdlog.h>

#include <exception>
#include <memory>
#include <thread>

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

// Receives one pseudo-gradient: a header, then chunks of the round's fragment (the whole model without fragments)
// in parameter order, each folded as it arrives.
class PushReactor : public grpc::ServerReadReactor<PushMessage> {
 public:
  PushReactor(CoordinatorCore* core, PushReply* reply) : core_(core), reply_(reply) { StartRead(&message_); }

  void OnReadDone(bool ok) override {
    absl::Status status;
    try {
      if (!ok) {  // the client closed its side: the push must be complete
        if (!ticket_) {
          status = absl::InvalidArgumentError("push stream ended before its header");
        } else if (!reader_->Done()) {
          status = absl::InvalidArgumentError("push stream ended early, at " + reader_->Position());
        } else {
          status = core_->CommitPush(*ticket_);
          reply_->set_round(ticket_->round);
          reply_->set_bytes(ticket_->bytes);
        }
        Fail(status, "incomplete push");
        Finish(ToGrpc(status));
        return;
      }
      status = Consume();
    } catch (const std::exception& e) {
      status = absl::InternalError(e.what());
    }
    if (!status.ok()) {
      Fail(status, std::string(status.message()));
      Finish(ToGrpc(status));
      return;
    }
    StartRead(&message_);
  }

  void OnDone() override {
    if (ticket_) core_->AbortPush(*ticket_, "stream ended");  // no-op once committed or failed
    delete this;
  }

 private:
  absl::Status Consume() {
    if (!ticket_) {
      if (!message_.has_header()) return absl::InvalidArgumentError("push stream must start with a header");
      auto ticket = core_->BeginPush(message_.header());
      if (!ticket.ok()) return ticket.status();
      ticket_ = std::make_unique<PushTicket>(std::move(*ticket));
      members_ = &core_->fragment_members(ticket_->fragment);
      reader_ = std::make_unique<ChunkStreamReader>(core_->fragment_specs(ticket_->fragment));
      return absl::OkStatus();
    }
    if (!message_.has_chunk()) return absl::InvalidArgumentError("a push header may appear only once");
    auto view = reader_->Next(message_.chunk());
    if (!view.ok()) return view.status();
    return core_->FoldChunk(*ticket_, (*members_)[reader_->tensor_index()], reader_->chunk_offset(), *view,
                            static_cast<int64_t>(message_.chunk().data().size()));
  }

  void Fail(const absl::Status& status, const std::string& why) {
    if (status.ok() || !ticket_) return;
    spdlog::warn("push from {} refused: {}", ticket_->worker_id, std::string(status.message()));
    core_->AbortPush(*ticket_, why);
  }

  CoordinatorCore* core_;
  PushReply* reply_;
  std::unique_ptr<ChunkStreamReader> reader_;   // made from the header: the fragment's specs
  const std::vector<size_t>* members_ = nullptr;  // reader index -> position in the model's parameters
  PushMessage message_;
  std::unique_ptr<PushTicket> ticket_;
};

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::Join(grpc::CallbackServerContext* ctx, const JoinRequest* request,
                                                   JoinReply* reply) {
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
  return Unary(ctx, [&] { return coordinator_->Leave(*request); });
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                        const HeartbeatRequest* request, HeartbeatReply* reply) {
  return Unary(ctx, [&]() -> absl::Status {
    auto r = coordinator_->Heartbeat(*request);
    if (!r.ok()) return r.status();
    *reply = std::move(*r);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::GetStatus(grpc::CallbackServerContext* ctx, const StatusRequest*,
                                                        StatusReply* reply) {
  return Unary(ctx, [&] {
    *reply = coordinator_->Status();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Drain(grpc::CallbackServerContext* ctx, const DrainRequest* request,
                                                    DrainReply*) {
  return Unary(ctx, [&] { return coordinator_->Drain(request->worker_id()); });
}

grpc::ServerUnaryReactor* CoordinatorService::Checkpoint(grpc::CallbackServerContext* ctx, const CheckpointRequest*,
                                                         CheckpointReply* reply) {
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
  return new PushReactor(coordinator_, reply);
}

}  // namespace diloco
