// Hostile and broken input, end to end: a real diloco-coordinator (config/tiny.yaml on 127.0.0.1) trains with two
// real diloco-worker processes while a raw gRPC client (the generated stub, not worker/client.cc, so that it can
// send malformed streams) joins as a third member and sends one push of each bad kind: wrong fingerprint, stale
// round, wrong shape, wrong dtype, truncated stream, oversized chunk, NaN, and more. Each must get its own gRPC code
// and message (docs/operations.md, "Errors a push can get"); the coordinator keeps serving, the good workers contribute
// to
// every round, the bad member never does, and the run ends at the validation loss of the same run without the
// hostile client (so no refused push reached the global model).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "config/config_loader.h"
#include "proto/diloco.grpc.pb.h"
#include "tests/integration/settled_round.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

constexpr int kRounds = 4;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

// The bad member: a raw stub on its own channel.
class RawClient {
 public:
  explicit RawClient(const std::string& address)
      : stub_(Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

  StatusReply Status() {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    StatusReply reply;
    grpc::Status s = stub_->GetStatus(&ctx, StatusRequest(), &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return reply;
  }
  int64_t SettledRound() { return diloco::testing::SettledRound(*stub_); }
  grpc::Status Join(const Config& config, const std::string& fingerprint, JoinReply* reply) {
    JoinRequest r;
    *r.mutable_meta() = Meta(0, fingerprint);
    r.mutable_model()->set_vocab_size(config.model.vocab_size);
    r.mutable_model()->set_seq_len(config.model.seq_len);
    r.mutable_model()->set_n_layer(config.model.n_layer);
    r.mutable_model()->set_n_head(config.model.n_head);
    r.mutable_model()->set_d_model(config.model.d_model);
    r.set_fragments(static_cast<int32_t>(config.comm.fragments));
    grpc::ClientContext ctx;
    Deadline(&ctx);
    return stub_->Join(&ctx, r, reply);
  }
  grpc::Status Heartbeat(int64_t round, const std::string& fingerprint) {
    HeartbeatRequest r;
    *r.mutable_meta() = Meta(round, fingerprint);
    HeartbeatReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    return stub_->Heartbeat(&ctx, r, &reply);
  }
  grpc::Status Leave(int64_t round, const std::string& fingerprint) {
    LeaveRequest r;
    *r.mutable_meta() = Meta(round, fingerprint);
    r.set_reason("hostile test done");
    LeaveReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    return stub_->Leave(&ctx, r, &reply);
  }
  // The tensors of the model, in order, from a pull of the global parameters. A pull that the good workers' next
  // commit overtakes is refused ("moved on ... pull again") and pulled again, as a worker does.
  std::vector<TensorInfo> PullLayout(int64_t round, const std::string& fingerprint) {
    for (int attempt = 0;; ++attempt) {
      PullRequest r;
      *r.mutable_meta() = Meta(round, fingerprint);
      grpc::ClientContext ctx;
      Deadline(&ctx);
      auto reader = stub_->PullParameters(&ctx, r);
      std::vector<TensorInfo> layout;
      PullMessage m;
      while (reader->Read(&m)) {
        if (!m.has_chunk() || (!layout.empty() && layout.back().name == m.chunk().name())) continue;
        TensorInfo t{m.chunk().name(), {m.chunk().shape().begin(), m.chunk().shape().end()}, 1};
        for (int64_t d : t.shape) t.numel *= d;
        layout.push_back(t);
      }
      grpc::Status s = reader->Finish();
      if (!s.ok() && s.error_message().find("pull again") != std::string::npos && attempt < 10) continue;
      EXPECT_TRUE(s.ok()) << s.error_message();
      return layout;
    }
  }
  // Sends `messages` as one push stream (stops writing once the server has refused) and returns the final status.
  grpc::Status Push(const std::vector<PushMessage>& messages) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    PushReply reply;
    auto writer = stub_->PushPseudoGradient(&ctx, &reply);
    for (const PushMessage& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  // Each bad push comes from a member of its own (hostile<i>): a member whose pushes break off after folding twice in
  // a row is quarantined (coordinator/round_policy.h) and would get that refusal instead of its case's.
  void set_id(const std::string& id) { id_ = id; }
  RequestMeta Meta(int64_t round, const std::string& fingerprint) const {
    RequestMeta meta;
    meta.set_worker_id(id_);
    meta.set_round(round);
    meta.set_fingerprint(fingerprint);
    return meta;
  }

 private:
  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }
  std::unique_ptr<Coordinator::Stub> stub_;
  std::string id_ = "hostile";
};

// A well-formed push of 0.5 everywhere (one chunk per tensor): were any of it applied, the loss would jump.
std::vector<PushMessage> GoodPush(const RawClient& client, int64_t round, const std::string& fingerprint,
                                  const std::vector<TensorInfo>& layout) {
  std::vector<PushMessage> out(1);
  PushHeader* h = out[0].mutable_header();
  *h->mutable_meta() = client.Meta(round, fingerprint);
  h->set_tokens(1000);
  h->set_inner_steps(10);
  h->set_loss(3.0);
  h->set_seconds(1.0);
  for (const TensorInfo& t : layout) {
    PushMessage m;
    TensorChunk* c = m.mutable_chunk();
    c->set_name(t.name);
    c->set_dtype(FLOAT32);
    for (int64_t d : t.shape) c->add_shape(d);
    c->set_offset(0);
    c->set_count(t.numel);
    c->set_codec(CODEC_RAW);
    std::vector<float> values(static_cast<size_t>(t.numel), 0.5f);
    c->set_data(values.data(), values.size() * sizeof(float));
    out.push_back(m);
  }
  return out;
}

struct RunResult {
  nlohmann::json summary;
  std::string coordinator_log;
};

// Runs the tiny config for kRounds rounds with workers w0 and w1 (w0 joins first, so shards are the same in every
// run). `hostile`, if set, is called once round 1 has closed, with the coordinator's address. With
// `pause_workers`, w0 and w1 are stopped (SIGSTOP) from round 1's close until `hostile` returns, so the run cannot
// end before the hostile client has joined, however fast rounds close.
RunResult TinyRun(const std::string& name, const std::function<void(const std::string&)>& hostile,
                  std::vector<std::string> overrides = {}, bool pause_workers = false) {
  const std::string dir = ScratchDir(name);
  overrides.push_back("outer.rounds=" + std::to_string(kRounds));
  const std::vector<std::string> args = TinyArgs(dir, overrides);
  RunningProcess coordinator("diloco-coordinator", With(args, {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  EXPECT_FALSE(address.empty()) << coordinator.output();
  if (address.empty()) return {};
  RunningProcess w0("diloco-worker", With(args, {"--coordinator", address, "--id", "w0"}));
  EXPECT_TRUE(coordinator.WaitForOutput("joined: worker w0", 60)) << coordinator.output();
  RunningProcess w1("diloco-worker", With(args, {"--coordinator", address, "--id", "w1"}));
  if (hostile && pause_workers) {
    EXPECT_TRUE(coordinator.WaitForOutput("round 1/" + std::to_string(kRounds) + " closed", 120))
        << coordinator.output();
    w0.Signal(SIGSTOP);
    w1.Signal(SIGSTOP);
  }
  if (hostile) hostile(address);
  if (hostile && pause_workers) {
    w0.Signal(SIGCONT);
    w1.Signal(SIGCONT);
  }
  EXPECT_EQ(w0.Wait(180), 0) << w0.output();
  EXPECT_EQ(w1.Wait(180), 0) << w1.output();
  EXPECT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  return {ReadJson(dir + "/summary.json"), coordinator.output()};
}

struct BadPush {
  std::string name;
  std::vector<PushMessage> messages;
  grpc::StatusCode code;
  std::string message;  // a substring of the error message
};

TEST(HostileInput, EveryBadPushGetsItsOwnErrorWhileTheGoodWorkersFinishTheRun) {
  auto config = LoadConfig(SourceDir() + "/config/tiny.yaml", {});
  ASSERT_TRUE(config.ok()) << config.status();
  std::set<std::string> seen_messages;
  int refused = 0;

  auto hostile = [&](const std::string& address) {
    RawClient client(address);
    StatusReply status;
    for (int i = 0; i < 1200; ++i) {  // until round 1 has closed (at most 120 s)
      status = client.Status();
      if (status.round() >= 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_GE(status.round(), 1) << "round 1 never closed";
    const std::string fp = status.fingerprint();
    JoinReply joined;
    grpc::Status s = client.Join(*config, fp, &joined);
    ASSERT_TRUE(s.ok()) << s.error_message();
    // The open round now waits for this member too: it closes only after the Leave below, so every push here is
    // checked against round r (the one after a close that was in flight at the Join).
    const int64_t r = client.SettledRound();
    ASSERT_LT(r, kRounds) << "the run ended before the hostile client could join";
    const std::vector<TensorInfo> layout = client.PullLayout(r, fp);
    ASSERT_GE(layout.size(), 2u);
    const std::string t0 = layout[0].name, t1 = layout[1].name;
    const std::vector<PushMessage> good = GoodPush(client, r, fp, layout);

    std::vector<BadPush> cases;
    auto add = [&](const std::string& name, grpc::StatusCode code, const std::string& message,
                   const std::function<void(std::vector<PushMessage>&)>& mutate) {
      std::vector<PushMessage> m = good;
      mutate(m);
      cases.push_back({name, std::move(m), code, message});
    };
    add("wrong fingerprint", grpc::StatusCode::FAILED_PRECONDITION,
        "model fingerprint 0123456789abcdef does not match the coordinator's " + fp,
        [](auto& m) { m[0].mutable_header()->mutable_meta()->set_fingerprint("0123456789abcdef"); });
    add("stale round", grpc::StatusCode::FAILED_PRECONDITION,
        "push for round " + std::to_string(r) + " refused: the coordinator's round is " + std::to_string(r + 1),
        [r](auto& m) { m[0].mutable_header()->mutable_meta()->set_round(r - 1); });
    add("unknown worker", grpc::StatusCode::NOT_FOUND, "worker 'intruder' is not an active member",
        [](auto& m) { m[0].mutable_header()->mutable_meta()->set_worker_id("intruder"); });
    add("wrong shape", grpc::StatusCode::INVALID_ARGUMENT, "tensor '" + t0 + "': shape [7,7], expected [", [](auto& m) {
      m[1].mutable_chunk()->clear_shape();
      m[1].mutable_chunk()->add_shape(7);
      m[1].mutable_chunk()->add_shape(7);
    });
    add("wrong dtype", grpc::StatusCode::INVALID_ARGUMENT, "tensor '" + t0 + "': dtype Double, expected Float",
        [](auto& m) {
          m[1].mutable_chunk()->set_dtype(FLOAT64);
          m[1].mutable_chunk()->set_count(m[1].chunk().count() / 2);
        });
    add("declared and received bytes differ", grpc::StatusCode::INVALID_ARGUMENT,
        "tensor '" + t0 + "': chunk declares " + std::to_string(layout[0].numel) + " elements",
        [](auto& m) { m[1].mutable_chunk()->mutable_data()->resize(m[1].chunk().data().size() / 2); });
    add("chunk offset", grpc::StatusCode::INVALID_ARGUMENT, "tensor '" + t0 + "': chunk at element 5, expected 0",
        [](auto& m) { m[1].mutable_chunk()->set_offset(5); });
    add("truncated stream", grpc::StatusCode::INVALID_ARGUMENT, "push stream ended early, at tensor 2/",
        [](auto& m) { m.resize(2); });
    add("oversized chunk", grpc::StatusCode::RESOURCE_EXHAUSTED, "Received message larger than max (",
        [](auto& m) { m[1].mutable_chunk()->mutable_data()->resize(3 << 20); });  // > chunk_bytes + 1 MiB
    add("NaN", grpc::StatusCode::INVALID_ARGUMENT, "pseudo-gradient of '" + t1 + "' holds NaN or Inf", [](auto& m) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      m[2].mutable_chunk()->mutable_data()->replace(8, sizeof(float), reinterpret_cast<const char*>(&nan),
                                                    sizeof(float));
    });
    add("Inf", grpc::StatusCode::INVALID_ARGUMENT, "pseudo-gradient of '" + t0 + "' holds NaN or Inf", [](auto& m) {
      const float inf = std::numeric_limits<float>::infinity();
      m[1].mutable_chunk()->mutable_data()->replace(0, sizeof(float), reinterpret_cast<const char*>(&inf),
                                                    sizeof(float));
    });
    add("fragment", grpc::StatusCode::INVALID_ARGUMENT, "push of fragment 3 refused",
        [](auto& m) { m[0].mutable_header()->set_fragment(3); });
    // Peer input echoed back is cut (proto/peer_text.h): a 200,000-dimension shape, a 300 KB tensor name.
    add("huge shape", grpc::StatusCode::INVALID_ARGUMENT, ",... (200000 dimensions)], expected [", [](auto& m) {
      m[1].mutable_chunk()->clear_shape();
      for (int i = 0; i < 200000; ++i) m[1].mutable_chunk()->add_shape(1);
    });
    add("huge name", grpc::StatusCode::INVALID_ARGUMENT, " bytes cut)'",
        [](auto& m) { m[1].mutable_chunk()->set_name(std::string(300000, 'n')); });

    std::vector<std::string> ids = {"hostile"};
    for (const BadPush& c : cases) {
      ids.push_back("hostile" + std::to_string(ids.size()));
      client.set_id(ids.back());
      JoinReply also_joined;
      ASSERT_TRUE(client.Join(*config, fp, &also_joined).ok()) << c.name;
      ASSERT_TRUE(client.Heartbeat(r, fp).ok()) << "the coordinator stopped serving before: " << c.name;
      std::vector<PushMessage> messages = c.messages;
      RequestMeta* meta = messages[0].mutable_header()->mutable_meta();
      if (meta->worker_id() == "hostile") meta->set_worker_id(ids.back());
      grpc::Status got = client.Push(messages);
      // A stream that gRPC itself cut off (the oversized chunk) is cleaned up on the coordinator a moment after the
      // client sees its status; until then a new push is UNAVAILABLE "still streaming", and a worker retries.
      for (int retry = 0; retry < 200 && got.error_code() == grpc::StatusCode::UNAVAILABLE &&
                          got.error_message().find("is still streaming") != std::string::npos;
           ++retry) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        got = client.Push(messages);
      }
      EXPECT_EQ(got.error_code(), c.code) << c.name << ": " << got.error_message();
      EXPECT_LE(got.error_message().size(), 1024u) << c.name << ": a refusal is at most 1 KB";
      EXPECT_NE(got.error_message().find(c.message), std::string::npos)
          << c.name << ": '" << got.error_message() << "' does not contain '" << c.message << "'";
      std::cout << "[refused] " << c.name << ": " << got.error_code() << " " << got.error_message() << "\n";
      seen_messages.insert(got.error_message());
      ++refused;
    }
    const StatusReply during = client.Status();
    EXPECT_EQ(during.round(), r) << "the open round moved on while a member had not pushed";
    for (const WorkerStatus& w : during.workers()) {
      if (w.id().rfind("hostile", 0) == 0) EXPECT_FALSE(w.pushed_this_round());
    }
    for (const std::string& id : ids) {
      client.set_id(id);
      ASSERT_TRUE(client.Leave(r, fp).ok());
    }
  };

  const RunResult attacked = TinyRun("hostile_input", hostile, {}, /*pause_workers=*/true);
  EXPECT_EQ(refused, 14);
  EXPECT_EQ(seen_messages.size(), 14u) << "two kinds of bad push got the same message";
  const nlohmann::json& summary = attacked.summary;
  ASSERT_TRUE(summary.is_object());
  EXPECT_EQ(summary["round"].get<int64_t>(), kRounds);
  EXPECT_EQ(summary["phase"].get<std::string>(), "complete");
  ASSERT_EQ(summary["workers"].size(), 2u + 1u + 14u) << summary.dump();
  for (const auto& w : summary["workers"]) {
    const std::string id = w["id"].get<std::string>();
    const bool hostile = id.rfind("hostile", 0) == 0;
    EXPECT_EQ(w["state"].get<std::string>(), "left") << w.dump();
    EXPECT_EQ(w["rounds_contributed"].get<int64_t>(), hostile ? 0 : kRounds) << w.dump();
    if (hostile) {
      EXPECT_EQ(w["tokens"].get<int64_t>(), 0);
      EXPECT_EQ(w["bytes_pushed"].get<int64_t>(), 0);
    }
  }
  EXPECT_NE(attacked.coordinator_log.find("' refused: INVALID_ARGUMENT: pseudo-gradient of"), std::string::npos)
      << "a refusal is logged with its reason";
  for (absl::string_view line : absl::StrSplit(attacked.coordinator_log, '\n')) {
    EXPECT_LE(line.size(), 2048u) << "a log line over 2 KB: " << std::string(line.substr(0, 200)) << "...";
  }

  // The same run without the hostile client ends at the same validation loss: nothing refused was applied (a 0.5
  // pseudo-gradient on every parameter would move the loss by whole nats).
  const RunResult clean = TinyRun("hostile_input_reference", nullptr);
  ASSERT_TRUE(clean.summary.is_object());
  const double loss = summary["evals"].back()["val_loss"].get<double>();
  const double reference = clean.summary["evals"].back()["val_loss"].get<double>();
  EXPECT_EQ(summary["evals"].back()["round"].get<int64_t>(), kRounds);
  std::cout << "[loss] attacked run " << loss << ", clean run " << reference << "\n";
  EXPECT_NEAR(loss, reference, 1e-4) << "attacked run " << loss << ", clean run " << reference;
}

// A member whose pushes break off in every round (coordinator/round_policy.h "Broken pushes"): it joins, and once per
// round pushes a header and its first tensor, then either cancels the stream or holds it open without a word until
// the round moves on. Every such push restarts the round's aggregation (the good workers push again) or is cut as
// late when the round is due to close; the member is quarantined, and the good workers complete every round.
enum class Misbehaviour { kCancel, kHoldOpen };

struct BrokenPushRecord {
  int attempts = 0;               // pushes it started (header accepted or not)
  int quarantine_refusals = 0;    // pushes refused at the header because it was quarantined
  int64_t max_broken_pushes = 0;  // from GetStatus while the run went on
  bool seen_quarantined = false;
};

void BreakPushesUntilTheRunEnds(const std::string& address, const Config& config, Misbehaviour how,
                                BrokenPushRecord* record) {
  auto stub = Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto status = [&](StatusReply* reply) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->GetStatus(&ctx, StatusRequest(), reply).ok();
  };
  StatusReply s;
  ASSERT_TRUE(status(&s));
  const std::string fp = s.fingerprint();
  auto meta = [&](int64_t round) {
    RequestMeta m;
    m.set_worker_id("breaker");
    m.set_round(round);
    m.set_fingerprint(fp);
    return m;
  };
  auto join = [&] {
    JoinRequest r;
    *r.mutable_meta() = meta(0);
    r.mutable_model()->set_vocab_size(config.model.vocab_size);
    r.mutable_model()->set_seq_len(config.model.seq_len);
    r.mutable_model()->set_n_layer(config.model.n_layer);
    r.mutable_model()->set_n_head(config.model.n_head);
    r.mutable_model()->set_d_model(config.model.d_model);
    r.set_fragments(1);
    grpc::ClientContext ctx;
    JoinReply reply;
    return stub->Join(&ctx, r, &reply).ok();
  };
  auto beat = [&](int64_t round) {
    HeartbeatRequest r;
    *r.mutable_meta() = meta(round);
    grpc::ClientContext ctx;
    HeartbeatReply reply;
    if (stub->Heartbeat(&ctx, r, &reply).error_code() == grpc::StatusCode::NOT_FOUND) join();
  };
  ASSERT_TRUE(join());
  // The first tensor of the model, from a pull: the part of the push that is sent before it breaks off.
  TensorChunk first;
  {
    PullRequest r;
    *r.mutable_meta() = meta(s.round());
    grpc::ClientContext ctx;
    auto reader = stub->PullParameters(&ctx, r);
    PullMessage m;
    while (reader->Read(&m)) {
      if (m.has_chunk() && first.name().empty()) first = m.chunk();
    }
    reader->Finish();
  }
  ASSERT_FALSE(first.name().empty());
  std::vector<float> values(static_cast<size_t>(first.count()), 0.5f);
  first.set_data(values.data(), values.size() * sizeof(float));

  int64_t last_round = -1;
  for (int pass = 0; pass < 3000; ++pass) {  // at most ~10 minutes
    if (!status(&s) || s.phase() == "complete") break;
    for (const WorkerStatus& w : s.workers()) {
      if (w.id() != "breaker") continue;
      record->max_broken_pushes = std::max(record->max_broken_pushes, w.broken_pushes());
      record->seen_quarantined |= w.quarantined_until_round() > 0;
    }
    beat(s.round());
    if (s.round() != last_round && s.phase() == "training") {
      last_round = s.round();
      ++record->attempts;
      grpc::ClientContext ctx;
      PushReply reply;
      auto writer = stub->PushPseudoGradient(&ctx, &reply);
      PushMessage header;
      *header.mutable_header()->mutable_meta() = meta(s.round());
      header.mutable_header()->set_tokens(1000);
      header.mutable_header()->set_inner_steps(10);
      header.mutable_header()->set_loss(3.0);
      header.mutable_header()->set_seconds(1.0);
      PushMessage chunk;
      *chunk.mutable_chunk() = first;
      writer->Write(header);
      writer->Write(chunk);
      if (how == Misbehaviour::kCancel) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the chunk is folded by then
      } else {  // silent while the round is open, heartbeats going on (it is an active member)
        StatusReply now;
        for (int i = 0; i < 600 && status(&now) && now.round() == s.round() && now.phase() != "complete"; ++i) {
          beat(now.round());
          for (const WorkerStatus& w : now.workers()) {
            if (w.id() == "breaker") record->seen_quarantined |= w.quarantined_until_round() > 0;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
      ctx.TryCancel();
      grpc::Status got = writer->Finish();
      if (got.error_message().find("quarantined") != std::string::npos) ++record->quarantine_refusals;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  LeaveRequest leave;
  *leave.mutable_meta() = meta(s.round());
  grpc::ClientContext ctx;
  LeaveReply left;
  stub->Leave(&ctx, leave, &left);
}

class BrokenPushes : public ::testing::TestWithParam<Misbehaviour> {};

TEST_P(BrokenPushes, AMemberWhosePushesBreakOffEveryRoundIsQuarantinedAndTheOthersCompleteTheRun) {
  auto config = LoadConfig(SourceDir() + "/config/tiny.yaml", {});
  ASSERT_TRUE(config.ok()) << config.status();
  BrokenPushRecord record;
  const RunResult run =
      TinyRun(GetParam() == Misbehaviour::kCancel ? "broken_push_cancel" : "broken_push_hold",
              [&](const std::string& address) { BreakPushesUntilTheRunEnds(address, *config, GetParam(), &record); },
              {"coordinator.round_timeout_s=4", "coordinator.lease_s=3"});
  std::cout << "[breaker] attempts " << record.attempts << ", refused as quarantined " << record.quarantine_refusals
            << ", broken pushes " << record.max_broken_pushes << ", seen quarantined " << record.seen_quarantined
            << "\n";
  const nlohmann::json& summary = run.summary;
  ASSERT_TRUE(summary.is_object()) << run.coordinator_log;
  EXPECT_EQ(summary["round"].get<int64_t>(), kRounds);
  EXPECT_EQ(summary["phase"].get<std::string>(), "complete");
  for (const auto& w : summary["workers"]) {
    const std::string id = w["id"].get<std::string>();
    EXPECT_EQ(w["rounds_contributed"].get<int64_t>(), id == "breaker" ? 0 : kRounds) << w.dump();
    if (id == "breaker") EXPECT_GE(w["broken_pushes"].get<int64_t>(), 2) << w.dump();
  }
  EXPECT_GE(record.attempts, 2);
  // (record.seen_quarantined is only printed: a one-round quarantine can pass between two status polls under load.)
  EXPECT_NE(run.coordinator_log.find("quarantined: worker breaker through round"), std::string::npos);
  if (GetParam() == Misbehaviour::kHoldOpen) {
    EXPECT_NE(run.coordinator_log.find("push from breaker for round"), std::string::npos);
    EXPECT_NE(run.coordinator_log.find("cut as late"), std::string::npos) << "the held stream was never cut";
  }
  const double first = summary["evals"].front()["val_loss"].get<double>();
  const double last = summary["evals"].back()["val_loss"].get<double>();
  EXPECT_LT(last, first) << "the good workers' rounds did not train the model";
}

INSTANTIATE_TEST_SUITE_P(HostileInput, BrokenPushes, ::testing::Values(Misbehaviour::kCancel, Misbehaviour::kHoldOpen),
                         [](const ::testing::TestParamInfo<Misbehaviour>& info) {
                           return info.param == Misbehaviour::kCancel ? std::string("CancelEveryRound")
                                                                      : std::string("HoldOpenEveryRound");
                         });

// Worker ids (proto/peer_text.h): 1..128 characters of [A-Za-z0-9._:-], refused at Join by the coordinator itself;
// members that left are remembered only up to a bound, so 10,000 joins and leaves with the longest ids leave the
// status reply under 1 MiB and `diloco-ctl status` working.
TEST(HostileInput, WorkerIdsAreBoundedAndTenThousandJoinsAndLeavesKeepStatusSmall) {
  auto config = LoadConfig(SourceDir() + "/config/tiny.yaml", {});
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string dir = ScratchDir("hostile_ids");
  RunningProcess coordinator("diloco-coordinator", With(TinyArgs(dir, {}), {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  auto stub = Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto status = [&] {
    grpc::ClientContext ctx;
    StatusReply reply;
    grpc::Status s = stub->GetStatus(&ctx, StatusRequest(), &reply);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return reply;
  };
  const std::string fp = status().fingerprint();
  auto join = [&](const std::string& id) {
    JoinRequest r;
    r.mutable_meta()->set_worker_id(id);
    r.mutable_meta()->set_fingerprint(fp);
    r.mutable_model()->set_vocab_size(config->model.vocab_size);
    r.mutable_model()->set_seq_len(config->model.seq_len);
    r.mutable_model()->set_n_layer(config->model.n_layer);
    r.mutable_model()->set_n_head(config->model.n_head);
    r.mutable_model()->set_d_model(config->model.d_model);
    r.set_fragments(static_cast<int32_t>(config->comm.fragments));
    grpc::ClientContext ctx;
    JoinReply reply;
    return stub->Join(&ctx, r, &reply);
  };
  auto leave = [&](const std::string& id) {
    LeaveRequest r;
    r.mutable_meta()->set_worker_id(id);
    r.mutable_meta()->set_fingerprint(fp);
    r.set_reason(std::string(100000, 'r'));  // echoed in the log, cut
    grpc::ClientContext ctx;
    LeaveReply reply;
    return stub->Leave(&ctx, r, &reply);
  };
  for (const std::string& bad :
       {std::string(129, 'a'), std::string("a/b"), std::string("tab\there"), std::string(1 << 20, 'x')}) {
    grpc::Status s = join(bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.size() << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("worker id"), std::string::npos) << s.error_message();
    EXPECT_LE(s.error_message().size(), 1024u);
  }
  const auto id_of = [](int i) {
    std::string n = std::to_string(i);
    return std::string(128 - n.size(), 'w') + n;  // the longest allowed
  };
  constexpr int kMembers = 10000;
  for (int i = 0; i < kMembers; ++i) {
    grpc::Status s = join(id_of(i));
    ASSERT_TRUE(s.ok()) << "join " << i << ": " << s.error_message();
    s = leave(id_of(i));
    ASSERT_TRUE(s.ok()) << "leave " << i << ": " << s.error_message();
  }
  const StatusReply after = status();
  std::cout << "[status] " << after.ByteSizeLong() << " bytes, " << after.workers_size() << " listed, "
            << after.members_not_listed() << " not listed\n";
  EXPECT_LT(after.ByteSizeLong(), size_t{1} << 20);
  ASSERT_EQ(after.workers_size(), 64);
  EXPECT_EQ(after.members_not_listed(), kMembers - 64);
  EXPECT_EQ(after.workers(0).id(), id_of(kMembers - 1)) << "the most recently gone first";
  EXPECT_EQ(after.workers(0).state(), "left");
  RunningProcess ctl("diloco-ctl", {"status", "--addr", address});
  EXPECT_EQ(ctl.Wait(60), 0) << ctl.output();
  EXPECT_NE(ctl.output().find(id_of(kMembers - 1)), std::string::npos) << ctl.output();
  for (absl::string_view line : absl::StrSplit(coordinator.output(), '\n')) {
    ASSERT_LE(line.size(), 2048u) << "a log line over 2 KB: " << std::string(line.substr(0, 200)) << "...";
  }
}

}  // namespace
}  // namespace diloco::testing
