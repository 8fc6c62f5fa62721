// The sparse top-k codec end to end (comm.codec topk, proto/PROTOCOL.md "CODEC_TOPK"): a real diloco-coordinator
// (config/tiny.yaml on 127.0.0.1) trains with two real diloco-worker processes pushing topk, while a raw gRPC client
// joins as more members and sends one topk push of each malformed kind: a position outside its block, unsorted and
// repeated positions, more kept values than the block holds, a non-finite level, a 2-bit payload a byte short and a
// byte long. Each is refused with INVALID_ARGUMENT and its own message; the good workers contribute to every round,
// and the run ends at the validation loss of the same topk run without the hostile client (nothing refused reached
// the global model).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "config/config_loader.h"
#include "proto/diloco.grpc.pb.h"
#include "tests/integration/settled_round.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

constexpr int kRounds = 6;
constexpr int64_t kBlock = 48;  // 6-bit positions: 48..63 fit the bits but not the block
constexpr int64_t kKeep = 4;
const std::vector<std::string> kTopk = {"comm.codec=topk", "comm.topk_chunk=48", "comm.topk_per_chunk=4",
                                        "outer.rounds=6"};

std::unique_ptr<Coordinator::Stub> Stub(const std::string& address) {
  return Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void Deadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
}

RequestMeta Meta(const std::string& id, int64_t round, const std::string& fp) {
  RequestMeta m;
  m.set_worker_id(id);
  m.set_round(round);
  m.set_fingerprint(fp);
  return m;
}

// One hand-built topk chunk over a whole tensor of n elements: every block keeps positions {0, 2, 4, 6} (fewer in a
// block shorter than that) with levels (0.5, 1.0) and code 0 (+0.5). mutate may change blocks' positions, levels
// (bf16 bits) and the keep count before packing.
struct HandTopk {
  std::vector<std::vector<int>> positions;  // per block
  std::vector<std::pair<uint16_t, uint16_t>> levels;
  int64_t keep = kKeep;
};

TensorChunk PackTopk(const std::string& name, const std::vector<int64_t>& shape, int64_t n, const HandTopk& h) {
  std::string data;
  for (auto [r0, r1] : h.levels) {
    data.append({static_cast<char>(r0 & 0xff), static_cast<char>(r0 >> 8), static_cast<char>(r1 & 0xff),
                 static_cast<char>(r1 >> 8)});
  }
  auto pack = [](const std::vector<int>& values, int width) {
    std::string out((values.size() * width + 7) / 8, '\0');
    for (size_t i = 0; i < values.size(); ++i) {
      for (int b = 0; b < width; ++b) {
        if ((values[i] >> b) & 1) out[(i * width + b) / 8] |= static_cast<char>(1 << ((i * width + b) % 8));
      }
    }
    return out;
  };
  std::vector<int> all;
  for (const auto& p : h.positions) all.insert(all.end(), p.begin(), p.end());
  data += pack(all, 6) + pack(std::vector<int>(all.size(), 0), 2);
  TensorChunk c;
  c.set_name(name);
  c.set_dtype(FLOAT32);
  for (int64_t d : shape) c.add_shape(d);
  c.set_offset(0);
  c.set_count(n);
  c.set_codec(CODEC_TOPK);
  c.set_topk_chunk(kBlock);
  c.set_topk_keep(h.keep);
  c.set_data(data);
  return c;
}

HandTopk GoodHand(int64_t n) {
  HandTopk h;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    std::vector<int> p;
    for (int i = 0; i < std::min<int64_t>(kKeep, len); ++i) p.push_back(len >= 2 * kKeep ? 2 * i : i);
    h.positions.push_back(p);
    h.levels.push_back({0x3F00, 0x3F80});
  }
  return h;
}

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 1;
};

std::vector<Layout> PullLayout(Coordinator::Stub& stub, const std::string& id, int64_t round, const std::string& fp) {
  PullRequest r;
  *r.mutable_meta() = Meta(id, round, fp);
  grpc::ClientContext ctx;
  Deadline(&ctx);
  auto reader = stub.PullParameters(&ctx, r);
  std::vector<Layout> layout;
  PullMessage m;
  while (reader->Read(&m)) {
    if (!m.has_chunk() || (!layout.empty() && layout.back().name == m.chunk().name())) continue;
    Layout t{m.chunk().name(), {m.chunk().shape().begin(), m.chunk().shape().end()}};
    for (int64_t d : t.shape) t.numel *= d;
    layout.push_back(t);
  }
  EXPECT_TRUE(reader->Finish().ok());
  return layout;
}

grpc::Status Push(Coordinator::Stub& stub, const std::vector<PushMessage>& messages) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  PushReply reply;
  auto writer = stub.PushPseudoGradient(&ctx, &reply);
  for (const PushMessage& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

struct RunResult {
  nlohmann::json summary;
  std::string coordinator_log;
};

RunResult TinyTopkRun(const std::string& name, const std::function<void(const std::string&)>& hostile) {
  const std::string dir = ScratchDir(name);
  const std::vector<std::string> args = TinyArgs(dir, kTopk);
  RunningProcess coordinator("diloco-coordinator", With(args, {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  EXPECT_FALSE(address.empty()) << coordinator.output();
  if (address.empty()) return {};
  RunningProcess w0("diloco-worker", With(args, {"--coordinator", address, "--id", "w0"}));
  EXPECT_TRUE(coordinator.WaitForOutput("joined: worker w0", 60)) << coordinator.output();
  RunningProcess w1("diloco-worker", With(args, {"--coordinator", address, "--id", "w1"}));
  if (hostile) {
    // The hostile pushes go to a round of a run that goes on: once round 1 has closed the good workers are stopped
    // (SIGSTOP) until the hostile client is done, so the run cannot complete under it however fast rounds close.
    EXPECT_TRUE(coordinator.WaitForOutput("round 1/" + std::to_string(kRounds) + " closed", 120))
        << coordinator.output();
    w0.Signal(SIGSTOP);
    w1.Signal(SIGSTOP);
    hostile(address);
    w0.Signal(SIGCONT);
    w1.Signal(SIGCONT);
  }
  EXPECT_EQ(w0.Wait(180), 0) << w0.output();
  EXPECT_EQ(w1.Wait(180), 0) << w1.output();
  EXPECT_EQ(coordinator.Wait(60), 0) << coordinator.output();
  return {ReadJson(dir + "/summary.json"), coordinator.output()};
}

struct BadTopk {
  std::string name;
  std::string message;                       // a substring of the refusal
  std::function<void(HandTopk&)> hand;       // changes the first tensor's blocks before packing, or
  std::function<void(TensorChunk&)> packed;  // changes its packed chunk
};

TEST(TopkPush, EveryMalformedSparsePushIsRefusedAndTheModelIsUnchanged) {
  auto config = LoadConfig(SourceDir() + "/config/tiny.yaml", kTopk);
  ASSERT_TRUE(config.ok()) << config.status();
  int refused = 0;
  std::set<std::string> messages;
  const std::vector<BadTopk> cases = {
      {"position out of range", "position 50 outside its 48 elements", [](HandTopk& h) { h.positions[0].back() = 50; },
       nullptr},
      {"unsorted positions", "position 0 after 2 (positions must ascend)",
       [](HandTopk& h) { std::swap(h.positions[0][0], h.positions[0][1]); }, nullptr},
      {"repeated positions", "position 2 after 2 (positions must ascend)", [](HandTopk& h) { h.positions[0][0] = 2; },
       nullptr},
      {"count above the block", "topk keeps 49 values per block of 48", [](HandTopk& h) { h.keep = 49; }, nullptr},
      {"non-finite level", "magnitude levels 0.5, nan", [](HandTopk& h) { h.levels[0].second = 0x7FC0; }, nullptr},
      {"payload a byte short", "but carries", nullptr, [](TensorChunk& c) { c.mutable_data()->pop_back(); }},
      {"payload a byte long", "but carries", nullptr, [](TensorChunk& c) { c.mutable_data()->push_back('\0'); }},
  };
  auto hostile = [&](const std::string& address) {
    auto stub = Stub(address);
    StatusReply status;
    for (int i = 0; i < 1200; ++i) {  // until round 1 has closed
      grpc::ClientContext ctx;
      Deadline(&ctx);
      ASSERT_TRUE(stub->GetStatus(&ctx, StatusRequest(), &status).ok());
      if (status.round() >= 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_GE(status.round(), 1) << "round 1 never closed";
    const std::string fp = status.fingerprint();
    std::vector<std::string> ids;
    int64_t r = status.round();
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string id = "hostile" + std::to_string(i);
      ids.push_back(id);
      JoinRequest j;
      *j.mutable_meta() = Meta(id, 0, fp);
      j.mutable_model()->set_vocab_size(config->model.vocab_size);
      j.mutable_model()->set_seq_len(config->model.seq_len);
      j.mutable_model()->set_n_layer(config->model.n_layer);
      j.mutable_model()->set_n_head(config->model.n_head);
      j.mutable_model()->set_d_model(config->model.d_model);
      JoinReply joined;
      grpc::ClientContext ctx;
      Deadline(&ctx);
      ASSERT_TRUE(stub->Join(&ctx, j, &joined).ok());
      r = SettledRound(*stub);  // from the first Join on, the open round waits for the hostile members
      const std::vector<Layout> layout = PullLayout(*stub, id, r, fp);
      ASSERT_GE(layout.size(), 2u);
      std::vector<PushMessage> push(1);
      PushHeader* h = push[0].mutable_header();
      *h->mutable_meta() = Meta(id, r, fp);
      h->set_tokens(1000);
      h->set_inner_steps(10);
      h->set_loss(3.0);
      h->set_seconds(1.0);
      for (size_t t = 0; t < layout.size(); ++t) {
        HandTopk hand = GoodHand(layout[t].numel);
        if (t == 0 && cases[i].hand) cases[i].hand(hand);
        PushMessage m;
        *m.mutable_chunk() = PackTopk(layout[t].name, layout[t].shape, layout[t].numel, hand);
        if (t == 0 && cases[i].packed) cases[i].packed(*m.mutable_chunk());
        push.push_back(m);
      }
      grpc::Status got = Push(*stub, push);
      EXPECT_EQ(got.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << cases[i].name << ": " << got.error_message();
      EXPECT_NE(got.error_message().find(cases[i].message), std::string::npos)
          << cases[i].name << ": '" << got.error_message() << "' lacks '" << cases[i].message << "'";
      std::cout << "[refused] " << cases[i].name << ": " << got.error_message() << "\n";
      messages.insert(got.error_message());
      ++refused;
    }
    for (const std::string& id : ids) {
      LeaveRequest l;
      *l.mutable_meta() = Meta(id, r, fp);
      LeaveReply reply;
      grpc::ClientContext ctx;
      Deadline(&ctx);
      EXPECT_TRUE(stub->Leave(&ctx, l, &reply).ok());
    }
  };
  const RunResult attacked = TinyTopkRun("topk_hostile", hostile);
  EXPECT_EQ(refused, static_cast<int>(cases.size()));
  EXPECT_EQ(messages.size(), cases.size()) << "two kinds of bad push got the same message";
  ASSERT_TRUE(attacked.summary.is_object());
  EXPECT_EQ(attacked.summary["round"].get<int64_t>(), kRounds);
  for (const auto& w : attacked.summary["workers"]) {
    const bool bad = w["id"].get<std::string>().rfind("hostile", 0) == 0;
    EXPECT_EQ(w["rounds_contributed"].get<int64_t>(), bad ? 0 : kRounds) << w.dump();
  }
  const RunResult clean = TinyTopkRun("topk_clean", nullptr);
  ASSERT_TRUE(clean.summary.is_object());
  const double loss = attacked.summary["evals"].back()["val_loss"].get<double>();
  const double reference = clean.summary["evals"].back()["val_loss"].get<double>();
  std::cout << "[loss] topk attacked run " << loss << ", clean topk run " << reference << "\n";
  EXPECT_NEAR(loss, reference, 1e-4);
}

}  // namespace
}  // namespace diloco::testing
