// PushSession (push_session.h): validates one push stream message by message and drives the CoordinatorCore.
#include "coordinator/push_session.h"

#include <spdlog/spdlog.h>

#include <exception>

#include "absl/strings/str_cat.h"
#include "proto/peer_text.h"

namespace diloco {

PushSession::~PushSession() { OnBroken("stream ended"); }

absl::Status PushSession::OnMessage(const PushMessage& message) {
  if (!refusal_.ok()) return refusal_;
  if (ended_) return Refuse(absl::InvalidArgumentError("push message after the end of the stream"));
  absl::Status status;
  try {
    status = Consume(message);
  } catch (const std::exception& e) {  // never let an exception reach a gRPC reactor
    status = absl::InternalError(e.what());
  }
  return status.ok() ? status : Refuse(std::move(status));
}

absl::Status PushSession::Consume(const PushMessage& message) {
  if (!ticket_) {
    if (!message.has_header()) return absl::InvalidArgumentError("push stream must start with a header");
    header_worker_id_ = message.header().meta().worker_id();
    auto ticket = core_->BeginPush(message.header());
    if (!ticket.ok()) return ticket.status();
    ticket_ = std::make_unique<PushTicket>(std::move(*ticket));
    members_ = &core_->fragment_members(ticket_->fragment);
    if (ticket_->parts > 1) {  // a part: only its range of the fragment's flat buffer (PROTOCOL.md)
      const ElementRange& range = message.header().range();
      reader_ = std::make_unique<ChunkStreamReader>(core_->fragment_specs(ticket_->fragment),
                                                    FlatRange{range.begin(), range.end()});
    } else {
      reader_ = std::make_unique<ChunkStreamReader>(core_->fragment_specs(ticket_->fragment));
    }
    return absl::OkStatus();
  }
  if (message.has_header()) return absl::InvalidArgumentError("a push header may appear only once");
  if (!message.has_chunk()) return absl::InvalidArgumentError("push message holds neither a header nor a chunk");
  const TensorChunk& chunk = message.chunk();
  if (chunk.codec() == CODEC_TOPK) {  // folded from its kept values (coordinator_sparse.cc)
    auto sparse = reader_->NextSparse(chunk);
    if (!sparse.ok()) return sparse.status();
    return core_->FoldSparseChunk(*ticket_, (*members_)[reader_->tensor_index()], reader_->chunk_offset(),
                                  chunk.count(), *sparse, static_cast<int64_t>(chunk.data().size()));
  }
  auto view = reader_->Next(chunk);
  if (!view.ok()) return view.status();
  return core_->FoldChunk(*ticket_, (*members_)[reader_->tensor_index()], reader_->chunk_offset(), *view,
                          static_cast<int64_t>(chunk.data().size()));
}

absl::StatusOr<PushReply> PushSession::OnEnd() {
  if (!refusal_.ok()) return refusal_;
  ended_ = true;
  absl::Status status;
  try {
    if (!ticket_) {
      status = absl::InvalidArgumentError("push stream ended before its header");
    } else if (!reader_->Done()) {
      status = absl::InvalidArgumentError("push stream ended early, at " + reader_->Position());
    } else {
      status = core_->CommitPush(*ticket_);
    }
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  }
  if (!status.ok()) return Refuse(std::move(status));
  PushReply reply;
  reply.set_round(ticket_->round);
  reply.set_bytes(ticket_->bytes);
  return reply;
}

void PushSession::OnBroken(const std::string& why) {
  if (ticket_) core_->AbortPush(*ticket_, why);  // a no-op once committed or refused
}

absl::Status PushSession::Refuse(absl::Status status) {
  refusal_ = status;
  const std::string& id = ticket_ ? ticket_->worker_id : header_worker_id_;
  status = WithBoundedMessage(status);
  spdlog::warn("push from '{}' refused: {}: {}", Truncated(id), absl::StatusCodeToString(status.code()),
               std::string(status.message()));
  if (ticket_) core_->AbortPush(*ticket_, std::string(status.message()));
  return status;
}

}  // namespace diloco
