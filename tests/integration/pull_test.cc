// Pulls against a real diloco-coordinator (config/tiny.yaml, a larger model, 127.0.0.1), through a raw gRPC client
// whose receive window is small, so that a pull can be held mid-stream: the coordinator serves raw (fp32) pull
// messages straight from theta's memory (coordinator/pull_payload.h), and synchronous rounds write the next theta
// over it. A pull held open across a round's outer step must not end OK (its later chunks would mix two rounds); it
// must end UNAVAILABLE, and a pull started after the step gets the new round, whole.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/config_loader.h"
#include "proto/diloco.grpc.pb.h"
#include "tests/process_harness.h"
#include "worker/client.h"

namespace diloco::testing {
namespace {

const std::vector<std::string> kOverrides = {
    "model.d_model=128",        "model.n_layer=2",       "workers.count=1", "coordinator.min_workers=1",
    "coordinator.eval_every=0", "comm.chunk_bytes=4096", "outer.rounds=3"};

// A stub on a channel of its own whose stream windows stay small (no BDP growth): the coordinator can send only a
// few chunks ahead of what this client has read.
std::unique_ptr<Coordinator::Stub> SlowReaderStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8192);
  args.SetInt("diloco.test.channel", 1);
  return Coordinator::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

void Deadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
}

RequestMeta Meta(int64_t round, const std::string& fingerprint) {
  RequestMeta meta;
  meta.set_worker_id("w0");
  meta.set_round(round);
  meta.set_fingerprint(fingerprint);
  return meta;
}

TEST(Pulls, APullHeldAcrossTheOuterStepEndsUnavailableAndTheNextPullGetsTheNewRound) {
  auto config = LoadConfig(SourceDir() + "/config/tiny.yaml", kOverrides);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string dir = ScratchDir("pull_held_across_step");
  RunningProcess coordinator("diloco-coordinator", With(TinyArgs(dir, kOverrides), {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  auto stub = SlowReaderStub(address);

  StatusReply status;
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ASSERT_TRUE(stub->GetStatus(&ctx, StatusRequest(), &status).ok());
  }
  const std::string fp = status.fingerprint();
  {
    JoinRequest join;
    *join.mutable_meta() = Meta(0, fp);
    join.mutable_model()->set_vocab_size(config->model.vocab_size);
    join.mutable_model()->set_seq_len(config->model.seq_len);
    join.mutable_model()->set_n_layer(config->model.n_layer);
    join.mutable_model()->set_n_head(config->model.n_head);
    join.mutable_model()->set_d_model(config->model.d_model);
    join.set_fragments(1);
    JoinReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    grpc::Status s = stub->Join(&ctx, join, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(reply.round(), 0);
  }

  // The held pull: its header and first chunk, then nothing read until round 0 has closed.
  PullRequest request;
  *request.mutable_meta() = Meta(0, fp);
  grpc::ClientContext held_ctx;
  Deadline(&held_ctx);
  auto held = stub->PullParameters(&held_ctx, request);
  PullMessage m;
  ASSERT_TRUE(held->Read(&m) && m.has_header()) << "no header";
  ASSERT_EQ(m.header().round(), 0);
  const int64_t total_elements = m.header().num_elements();
  ASSERT_TRUE(held->Read(&m) && m.has_chunk()) << "no first chunk";
  const TensorChunk first = m.chunk();
  ASSERT_GT(total_elements * 4, 20 * config->comm.chunk_bytes) << "the model must be many windows long";

  // This member's push of 0.01 everywhere (one chunk per tensor, its layout from the chunks' shapes) closes round 0:
  // the outer step writes theta_1 over theta_0. The tensors' names and shapes come from a whole pull of its own.
  std::vector<PushMessage> push(1);
  {
    PushHeader* h = push[0].mutable_header();
    *h->mutable_meta() = Meta(0, fp);
    h->set_tokens(1000);
    h->set_inner_steps(10);
    h->set_loss(3.0);
    h->set_seconds(1.0);
    auto layout_stub = Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    Deadline(&ctx);
    auto reader = layout_stub->PullParameters(&ctx, request);
    PullMessage c;
    while (reader->Read(&c)) {
      if (!c.has_chunk() || c.chunk().offset() != 0) continue;
      PushMessage p;
      TensorChunk* t = p.mutable_chunk();
      t->set_name(c.chunk().name());
      t->set_dtype(FLOAT32);
      int64_t numel = 1;
      for (int64_t d : c.chunk().shape()) {
        t->add_shape(d);
        numel *= d;
      }
      t->set_count(numel);
      t->set_codec(CODEC_RAW);
      std::vector<float> values(static_cast<size_t>(numel), 0.01f);
      t->set_data(values.data(), values.size() * sizeof(float));
      push.push_back(p);
    }
    grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << "an unheld pull of round 0: " << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    PushReply reply;
    auto writer = stub->PushPseudoGradient(&ctx, &reply);
    for (const PushMessage& p : push) ASSERT_TRUE(writer->Write(p));
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  ASSERT_TRUE(coordinator.WaitForOutput("round 1/3 closed", 60)) << coordinator.output();

  // Reading on: the chunks still in flight were written from a theta that moved on; the stream must say so.
  int chunks = 1;
  while (held->Read(&m)) ++chunks;
  const grpc::Status held_status = held->Finish();
  EXPECT_EQ(held_status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "the held pull ended with '" << held_status.error_message() << "' after " << chunks << " chunks";

  // A pull after the step: round 1, every element, and the first chunk changed by the step.
  request.mutable_meta()->set_round(1);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  auto next = stub->PullParameters(&ctx, request);
  ASSERT_TRUE(next->Read(&m) && m.has_header());
  EXPECT_EQ(m.header().round(), 1);
  int64_t elements = 0;
  bool first_changed = false;
  while (next->Read(&m)) {
    elements += m.chunk().count();
    if (m.chunk().name() == first.name() && m.chunk().offset() == 0) first_changed = m.chunk().data() != first.data();
  }
  grpc::Status s = next->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(elements, total_elements);
  EXPECT_TRUE(first_changed) << "theta_1 should differ from theta_0 after a push of 0.01 everywhere";
}

// A stream's deadline is its progress, not its length (worker/client.h StreamWatch): a pull whose chunks keep coming
// completes however long it takes in all (here 40 chunks read 50 ms apart, 2 s, under workers.rpc_timeout_s 1),
// where one fixed deadline on the call cut it at 1 s and the worker retried it forever (a large model over a slow
// link); a pull that stops moving for rpc_timeout_s is cancelled and says so.
TEST(Pulls, APullThatKeepsMovingOutlastsRpcTimeoutAndOneThatStallsIsCut) {
  auto config = LoadConfig(SourceDir() + "/config/tiny.yaml", kOverrides);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string dir = ScratchDir("pull_progress_deadline");
  RunningProcess coordinator("diloco-coordinator", With(TinyArgs(dir, kOverrides), {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  std::string fingerprint;
  {
    auto stub = Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    StatusReply status;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ASSERT_TRUE(stub->GetStatus(&ctx, StatusRequest(), &status).ok());
    fingerprint = status.fingerprint();
  }
  CoordinatorClient client(address, "w0", fingerprint, /*rpc_timeout_s=*/1.0, config->comm.chunk_bytes, CODEC_RAW);
  ModelSpec model;
  model.set_vocab_size(config->model.vocab_size);
  model.set_seq_len(config->model.seq_len);
  model.set_n_layer(config->model.n_layer);
  model.set_n_head(config->model.n_head);
  model.set_d_model(config->model.d_model);
  auto joined = client.Join(model, 1, "cpu");
  ASSERT_TRUE(joined.ok()) << joined.status();

  const int64_t elements = 40 * config->comm.chunk_bytes / 4;  // 40 raw chunks
  int chunks = 0;
  auto moving = client.PullPart(-1, 0, elements, [&chunks](const TensorChunk&) {
    ++chunks;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return absl::OkStatus();
  });
  ASSERT_TRUE(moving.ok()) << moving.status() << " after " << chunks << " chunks";
  EXPECT_GE(chunks, 40);

  chunks = 0;
  auto stalled = client.PullPart(-1, 0, elements, [&chunks](const TensorChunk&) {
    if (++chunks == 3) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    return absl::OkStatus();
  });
  ASSERT_FALSE(stalled.ok());
  EXPECT_EQ(stalled.status().code(), absl::StatusCode::kDeadlineExceeded) << stalled.status();
  EXPECT_NE(std::string(stalled.status().message()).find("made no progress for workers.rpc_timeout_s (1 s)"),
            std::string::npos)
      << stalled.status();
}

}  // namespace
}  // namespace diloco::testing
