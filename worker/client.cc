#include "worker/client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/message_limit.h"
#include "proto/grpc_status.h"
#include "proto/sparse_update.h"
#include "proto/tensor_chunks.h"
#include "worker/round_result.h"
#include "worker/tcp_pusher.h"

namespace diloco {

StreamWatch::StreamWatch(grpc::ClientContext* ctx, double stall_s)
    : ctx_(ctx), stall_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(stall_s))) {
  last_progress_ = Clock::now().time_since_epoch().count();
  watcher_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!done_) {
      const Clock::time_point last{Clock::duration(last_progress_.load())};
      if (Clock::now() - last >= stall_) {
        expired_ = true;
        ctx_->TryCancel();
        return;
      }
      cv_.wait_until(lock, last + stall_);
    }
  });
}

StreamWatch::~StreamWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  watcher_.join();
}

void StreamWatch::Progress() { last_progress_ = Clock::now().time_since_epoch().count(); }

absl::Status StreamWatch::Finish(const grpc::Status& call, const std::string& what) const {
  if (!call.ok() && expired_) {  // (a call that ended well before the watch fired stays OK)
    return absl::DeadlineExceededError(absl::StrCat(what, " made no progress for workers.rpc_timeout_s (",
                                                    std::chrono::duration<double>(stall_).count(), " s)"));
  }
  return FromGrpc(call);
}

CoordinatorClient::CoordinatorClient(const std::string& address, std::string worker_id, std::string fingerprint,
                                     double rpc_timeout_s, int64_t chunk_bytes, Codec push_codec,
                                     TransportSecurity security)
    : worker_id_(std::move(worker_id)),
      fingerprint_(std::move(fingerprint)),
      rpc_timeout_s_(rpc_timeout_s),
      chunk_bytes_(chunk_bytes),
      push_codec_(push_codec),
      security_(std::move(security)),
      tcp_pusher_(std::make_unique<TcpPusher>(address.substr(0, address.rfind(':')), security_.token, rpc_timeout_s)) {
  last_answer_ = std::chrono::steady_clock::now().time_since_epoch().count();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(static_cast<int>(MaxMessageBytes(chunk_bytes)));
  ApplyChannelArguments(security_, &args);
  channel_ = grpc::CreateCustomChannel(address, MakeChannelCredentials(security_), args);
  stub_ = diloco::Coordinator::NewStub(channel_);
}

CoordinatorClient::~CoordinatorClient() = default;

absl::Status CoordinatorClient::Noted(absl::Status status) {
  if (!IsTransient(status)) last_answer_ = std::chrono::steady_clock::now().time_since_epoch().count();
  return status;
}

double CoordinatorClient::seconds_since_answer() const {
  const std::chrono::steady_clock::time_point last{std::chrono::steady_clock::duration(last_answer_.load())};
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count();
}

RequestMeta CoordinatorClient::Meta(int64_t round) const {
  RequestMeta meta;
  meta.set_worker_id(worker_id_);
  meta.set_round(round);
  meta.set_fingerprint(fingerprint_);
  absl::MutexLock lock(&pulled_mu_);
  if (round == pulled_round_) meta.set_theta_id(pulled_theta_id_);
  return meta;
}

absl::StatusOr<PullResult> CoordinatorClient::RememberPulled(absl::StatusOr<PullResult> pulled) {
  if (pulled.ok()) {
    absl::MutexLock lock(&pulled_mu_);
    pulled_round_ = pulled->round;
    pulled_theta_id_ = pulled->theta_id;
  }
  return pulled;
}

void CoordinatorClient::Prepare(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(rpc_timeout_s_ * 1000)));
  AttachToken(security_, ctx);
}

void CoordinatorClient::PrepareStream(grpc::ClientContext* ctx) const { AttachToken(security_, ctx); }

absl::StatusOr<JoinReply> CoordinatorClient::Join(const ModelSpec& model, int32_t threads, const std::string& device,
                                                  int32_t shard_hint, int32_t fragments, int32_t cluster_size,
                                                  int32_t reader_hint, int32_t push_parts, const DataSpec& data) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  JoinRequest request;
  *request.mutable_meta() = Meta(0);
  *request.mutable_model() = model;
  request.set_threads(threads);
  request.set_device(device);
  if (shard_hint >= 0) request.set_shard_hint(shard_hint);
  if (reader_hint >= 0) request.set_shard_reader_hint(reader_hint);
  request.set_fragments(fragments);
  request.set_cluster_size(cluster_size);
  request.set_push_parts(push_parts);
  *request.mutable_data() = data;
  request.set_push_codec(push_codec_);
  request.set_chunk_bytes(std::max<int64_t>(chunk_bytes_, 1));
  JoinReply reply;
  grpc::Status s = stub_->Join(&ctx, request, &reply);
  if (absl::Status status = Noted(FromGrpc(s)); !status.ok()) return status;
  push_port_ = reply.push_port();
  known_push_port_ = reply.push_port();
  return reply;
}

absl::Status CoordinatorClient::Leave(const std::string& reason) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  LeaveRequest request;
  *request.mutable_meta() = Meta(0);
  request.set_reason(reason);
  LeaveReply reply;
  return Noted(FromGrpc(stub_->Leave(&ctx, request, &reply)));
}

HeartbeatView HeartbeatViewOf(const HeartbeatReply& reply) {
  HeartbeatView view{reply.round(), reply.pushed(), reply.run_complete(), reply.quarantined_until_round()};
  if (reply.has_last_applied_base()) view.last_applied_base = reply.last_applied_base();
  view.phase = reply.phase();
  return view;
}

absl::StatusOr<HeartbeatReply> CoordinatorClient::Heartbeat(int64_t round, int64_t wait_ms) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  if (wait_ms > 0) ctx.set_deadline(ctx.deadline() + std::chrono::milliseconds(wait_ms));
  HeartbeatRequest request;
  *request.mutable_meta() = Meta(round);
  request.set_wait_ms(wait_ms);
  HeartbeatReply reply;
  grpc::Status s = stub_->Heartbeat(&ctx, request, &reply);
  if (absl::Status status = Noted(FromGrpc(s)); !status.ok()) return status;
  // A coordinator restarted with this worker restored as a member (no Join) listens on a new TCP push port, or on
  // the same one (comm.tcp_port) after a push to the dead process fell back to gRPC: TCP again at once for a new
  // port, after kTcpRetryHeartbeats heartbeats for the same one (a port that keeps failing costs one try per so many).
  if (const int port = reply.push_port(); port > 0 && known_push_port_ > 0) {
    const bool moved = port != known_push_port_.exchange(port);
    const bool retry = push_port_ == 0 && ++heartbeats_on_grpc_ >= kTcpRetryHeartbeats;
    if (moved || retry) {
      push_port_ = port;
      heartbeats_on_grpc_ = 0;
      spdlog::info("{}: pushes over tcp to port {}", moved ? "the coordinator listens on a new push port" : "tcp again",
                   port);
    }
  }
  return reply;
}

absl::StatusOr<PullResult> CoordinatorClient::Pull(ChunkAssembler& assembler, int fragment) {
  return Pull(assembler, fragment, -1, nullptr);
}

absl::StatusOr<PullResult> CoordinatorClient::Pull(ChunkAssembler& assembler, int fragment, int64_t have_round,
                                                   UpdateApplier* sparse, bool* touched) {
  grpc::ClientContext ctx;
  PrepareStream(&ctx);
  PullRequest request;
  *request.mutable_meta() = Meta(0);
  if (fragment >= 0) request.set_fragment(fragment);
  if (have_round >= 0 && sparse != nullptr) request.set_have_round(have_round);
  StreamWatch watch(&ctx, rpc_timeout_s_);
  std::unique_ptr<grpc::ClientReader<PullMessage>> reader = stub_->PullParameters(&ctx, request);
  PullMessage message;
  PullResult result;
  bool have_header = false;
  uint64_t theta_hash = 0;
  absl::Status error;
  while (reader->Read(&message)) {
    watch.Progress();
    if (message.has_header()) {
      have_header = true;
      result.round = message.header().round();
      result.run_complete = message.header().run_complete();
      result.inner_steps = message.header().inner_steps();
      result.sparse = message.header().sparse();
      theta_hash = message.header().theta_hash();
      result.theta_id = message.header().theta_id();
      if (result.sparse && !request.has_have_round()) error = absl::InvalidArgumentError("unasked sparse update");
    } else if (error.ok()) {
      if (touched != nullptr) *touched = true;
      result.bytes += static_cast<int64_t>(message.chunk().data().size());
      error = result.sparse ? sparse->Accept(message.chunk()) : assembler.Accept(message.chunk());
    }
  }
  const absl::Status call = Noted(watch.Finish(reader->Finish(), "pull"));
  if (result.sparse) return RememberPulled(FinishSparsePull(call, error, have_header, theta_hash, *sparse, result));
  if (!call.ok()) return call;
  if (!error.ok()) return absl::DataLossError(absl::StrCat("pull: ", error.message()));
  if (!have_header || !assembler.Done()) return absl::DataLossError("pull: stream ended before all parameters came");
  return RememberPulled(result);
}

absl::StatusOr<PullResult> CoordinatorClient::FinishSparsePull(const absl::Status& call, const absl::Status& error,
                                                               bool have_header, uint64_t theta_hash,
                                                               const UpdateApplier& sparse, PullResult result) {
  std::string why;
  if (!call.ok()) {
    why = std::string(call.message());
  } else if (!error.ok()) {
    why = std::string(error.message());
  } else if (!have_header || !sparse.Done()) {
    why = "the stream ended before the whole update came";
  } else if (const uint64_t h = ThetaHash(sparse.theta()); h != theta_hash) {
    why = absl::StrFormat("theta's hash %016x after the update is not the coordinator's %016x", h, theta_hash);
  }
  if (!why.empty()) {  // the tensors may hold part of the update: only a whole pull repairs them
    return absl::UnavailableError(
        absl::StrCat("sparse pull of round ", result.round, " failed (", why, "); pulling all of theta"));
  }
  result.changed = sparse.changed();
  result.theta_hash = theta_hash;
  return result;
}

TensorChunker CoordinatorClient::MakeChunker(const RoundResult& result) const {
  if (!result.encoded.empty()) return TensorChunker(result.encoded);
  return TensorChunker(result.pseudo_gradient, chunk_bytes_, push_codec_, topk_);
}

absl::StatusOr<int64_t> CoordinatorClient::Push(int64_t round, const RoundResult& result) {
  PushMessage message;
  PushHeader* header = message.mutable_header();
  *header->mutable_meta() = Meta(round);
  FillPushHeader(result.report, header);
  if (const int port = push_port_; port > 0) {
    TensorChunker chunker = MakeChunker(result);
    bool answered = false;
    absl::StatusOr<int64_t> pushed = tcp_pusher_->Push(port, *header, chunker, &answered);
    if (answered) (void)Noted(pushed.status());  // only the clock: the status is returned below
    // The coordinator's own answer, its UNAVAILABLE included (clip's "waiting for the round's other push headers",
    // a push still streaming): the caller retries over TCP as over gRPC.
    if (pushed.ok() || answered || !absl::IsUnavailable(pushed.status())) return pushed;
    // The TCP port failed (coordinator restarted on another port, the port unreachable, the connection cut, or the
    // coordinator closed it over a frame it refused): this attempt goes over gRPC, whose answer is the coordinator's
    // own (NOT_FOUND after a restart, RESOURCE_EXHAUSTED for an oversized chunk, ...). TCP again after the next Join.
    spdlog::warn("{}; pushing over gRPC until the next join", std::string(pushed.status().message()));
    push_port_ = 0;
  }
  TensorChunker chunker = MakeChunker(result);
  return StreamPush(message, chunker);
}

absl::StatusOr<int64_t> CoordinatorClient::PushPart(const PushHeader& header, TensorChunker& chunker) {
  PushMessage message;
  *message.mutable_header() = header;
  *message.mutable_header()->mutable_meta() = Meta(header.meta().round());
  return StreamPush(message, chunker);
}

absl::StatusOr<int64_t> CoordinatorClient::StreamPush(PushMessage& message, TensorChunker& chunker) {
  grpc::ClientContext ctx;
  PrepareStream(&ctx);
  PushReply reply;
  StreamWatch watch(&ctx, rpc_timeout_s_);
  std::unique_ptr<grpc::ClientWriter<PushMessage>> writer = stub_->PushPseudoGradient(&ctx, &reply);
  bool ok = writer->Write(message);
  while (ok && chunker.Next(message.mutable_chunk())) {
    watch.Progress();
    ok = writer->Write(message);
  }
  watch.Progress();
  if (ok) writer->WritesDone();
  if (absl::Status s = Noted(watch.Finish(writer->Finish(), "push")); !s.ok()) return s;
  return chunker.bytes_emitted();
}

absl::StatusOr<PullResult> CoordinatorClient::PullPart(int fragment, int64_t begin, int64_t end,
                                                       const std::function<absl::Status(const TensorChunk&)>& accept) {
  grpc::ClientContext ctx;
  PrepareStream(&ctx);
  PullRequest request;
  *request.mutable_meta() = Meta(0);
  if (fragment >= 0) request.set_fragment(fragment);
  request.mutable_range()->set_begin(begin);
  request.mutable_range()->set_end(end);
  StreamWatch watch(&ctx, rpc_timeout_s_);
  std::unique_ptr<grpc::ClientReader<PullMessage>> reader = stub_->PullParameters(&ctx, request);
  PullMessage message;
  PullResult result;
  bool have_header = false;
  absl::Status error;
  while (reader->Read(&message)) {
    watch.Progress();
    if (message.has_header()) {
      have_header = true;
      result.round = message.header().round();
      result.run_complete = message.header().run_complete();
      result.inner_steps = message.header().inner_steps();
      result.theta_id = message.header().theta_id();
    } else if (error.ok()) {
      result.bytes += static_cast<int64_t>(message.chunk().data().size());
      error = accept(message.chunk());
    }
  }
  if (absl::Status s = Noted(watch.Finish(reader->Finish(), "pull of a part")); !s.ok()) return s;
  if (!error.ok()) return absl::DataLossError(absl::StrCat("pull of a part: ", error.message()));
  if (!have_header) return absl::DataLossError("pull of a part: stream ended before its header");
  return RememberPulled(result);
}

}  // namespace diloco
