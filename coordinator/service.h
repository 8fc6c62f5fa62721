// CoordinatorService: the gRPC face of a Coordinator (callback API). Reactors only move bytes: a push stream's
// messages go to the service's IngestQueue (ingest_queue.h), whose own threads hand them to a PushSession
// (push_session.h) that validates each one (header, chunk offsets and sizes, codec, NaN/Inf) before the Coordinator
// folds it into the round accumulator; so no gRPC thread decodes, checks or folds a chunk, or waits on the core's
// mutex behind a fold, and a Heartbeat or GetStatus is not stuck behind a push. The outer step runs on the
// coordinator's round thread, never here.
// The operator's Checkpoint RPC blocks on the disk for seconds: it runs on the service's own checkpoint executor
// (serial_executor.h), a joined thread, never on a gRPC thread nor a detached one.
// Exceptions never escape a reactor: every handler turns them into INTERNAL.
// Ownership: owns the IngestQueue (its threads stop, after running what is queued, when the service is destroyed:
// destroy it after shutting the server down; the TCP push listener posts to it too) and the checkpoint executor.
// Shutdown order: StopCheckpoints() (a checkpoint being written finishes and is answered), then the server's
// Shutdown, then the service, then the core. Thread-safety: gRPC calls the handlers from its own threads; all state
// lives in the (thread-safe) Coordinator, IngestQueue and SerialExecutor.
#pragma once

#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "coordinator/ingest_queue.h"
#include "coordinator/pull_payload.h"
#include "coordinator/serial_executor.h"
#include "proto/diloco.grpc.pb.h"

namespace diloco {

// PullParameters is served as a raw method (ByteBuffer messages) so that its messages can point into theta and be
// shared between pulls (pull_payload.h); clients see the same PullMessage stream.
class CoordinatorService final
    : public diloco::Coordinator::WithRawCallbackMethod_PullParameters<diloco::Coordinator::CallbackService> {
 public:
  // Pulls are streamed in chunks of about chunk_bytes, encoded with pull_codec (CODEC_RAW: lossless). With a
  // non-empty `token` (security.token_file) every call must carry it (coordinator/auth.h) or gets UNAUTHENTICATED.
  CoordinatorService(CoordinatorCore* coordinator, int64_t chunk_bytes, Codec pull_codec, std::string token = {})
      : coordinator_(coordinator),
        auth_(std::move(token)),
        pulls_(chunk_bytes, pull_codec),
        ingest_(IngestQueue::Options{coordinator->ingest_threads()}) {}

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const JoinRequest* request,
                                 JoinReply* reply) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const LeaveRequest* request,
                                  LeaveReply* reply) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const HeartbeatRequest* request,
                                      HeartbeatReply* reply) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx, const StatusRequest* request,
                                      StatusReply* reply) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* ctx, const DrainRequest* request,
                                  DrainReply* reply) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx, const CheckpointRequest* request,
                                       CheckpointReply* reply) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* PullParameters(grpc::CallbackServerContext* ctx,
                                                             const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<PushMessage>* PushPseudoGradient(grpc::CallbackServerContext* ctx, PushReply* reply) override;

  // Waits for the checkpoint being written (it completes and its caller gets the reply), answers the ones still
  // waiting, and any later Checkpoint call, with UNAVAILABLE, and joins the executor's thread. Call it before the
  // server's Shutdown (which waits for every call to be answered) and before the core is destroyed.
  void StopCheckpoints() { checkpoints_.Stop(); }

  // The ingest queue, for the TCP push listener (which must be stopped before the service is destroyed).
  IngestQueue* ingest() { return &ingest_; }

 private:
  CoordinatorCore* coordinator_;
  TokenAuthenticator auth_;
  PullPayloadCache pulls_;      // the newest snapshot's pull messages, shared by its pulls
  IngestQueue ingest_;          // its items use coordinator_, which the creator keeps alive longer than the service
  SerialExecutor checkpoints_;  // last member: stopped (joined) first when the service is destroyed
};

}  // namespace diloco
