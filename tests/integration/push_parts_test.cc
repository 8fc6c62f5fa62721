// Pushes and pulls in parts (proto/PROTOCOL.md "Push and pull in parts") against real diloco-coordinator processes
// (config/tiny.yaml on 127.0.0.1, port 0), through the generated gRPC stub. Coordinator A gets a member of
// cluster_size 2 that pushes each round's pseudo-gradient as two part streams (proto/slice_plan.h's layout), and,
// between its two rounds, hostile members whose parts are refused (overlapping, missing, a part index the member does
// not have, more parts than it declared, a part of another round, a part that breaks off, a chunk past its range),
// and in its second round the member pushes over (a part of a newer attempt discards the parts before it). Coordinator
// B gets the same two pseudo-gradients from a plain member in one stream each. Both start from the same theta_0 (same
// seed); theta_1 and theta_2 must be bit-equal, so the parts were folded at the right places and nothing of a refused
// or pushed-over part reached the global model. A pull in parts returns the slice of theta.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "config/config_loader.h"
#include "proto/diloco.grpc.pb.h"
#include "proto/slice_plan.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

const std::vector<std::string> kOverrides = {
    "workers.count=1", "coordinator.min_workers=1",       "coordinator.eval_every=0", "comm.chunk_bytes=1024",
    "outer.rounds=3",  "coordinator.round_timeout_s=600", "coordinator.lease_s=300",  "coordinator.checkpoint_every=0"};
constexpr int64_t kAlign = 1024 / 4;  // comm.chunk_bytes / 4: SlicePlan's alignment
constexpr int64_t kTokens = 1000;

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

struct Theta {
  int64_t round = -1;
  std::vector<TensorInfo> layout;
  std::vector<float> flat;  // every tensor's values, end to end in parameter order
};

void Deadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
}

// One member on a channel of its own.
class Member {
 public:
  Member(const std::string& address, std::string id, std::string fingerprint)
      : stub_(Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))),
        id_(std::move(id)),
        fingerprint_(std::move(fingerprint)) {}

  RequestMeta Meta(int64_t round) const {
    RequestMeta meta;
    meta.set_worker_id(id_);
    meta.set_round(round);
    meta.set_fingerprint(fingerprint_);
    return meta;
  }
  grpc::Status Join(const Config& config, int cluster_size) {
    JoinRequest r;
    *r.mutable_meta() = Meta(0);
    r.mutable_model()->set_vocab_size(config.model.vocab_size);
    r.mutable_model()->set_seq_len(config.model.seq_len);
    r.mutable_model()->set_n_layer(config.model.n_layer);
    r.mutable_model()->set_n_head(config.model.n_head);
    r.mutable_model()->set_d_model(config.model.d_model);
    r.set_fragments(1);
    r.set_cluster_size(cluster_size);
    JoinReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    return stub_->Join(&ctx, r, &reply);
  }
  void Leave() {
    LeaveRequest r;
    *r.mutable_meta() = Meta(0);
    LeaveReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    EXPECT_TRUE(stub_->Leave(&ctx, r, &reply).ok());
  }
  StatusReply Status() {
    StatusReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    EXPECT_TRUE(stub_->GetStatus(&ctx, StatusRequest(), &reply).ok());
    return reply;
  }
  // The whole theta (no range), or the slice `range` of it (its values only, in `flat`).
  Theta Pull(int64_t round, const ElementRange* range = nullptr) {
    PullRequest r;
    *r.mutable_meta() = Meta(round);
    if (range != nullptr) *r.mutable_range() = *range;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    auto reader = stub_->PullParameters(&ctx, r);
    Theta theta;
    PullMessage m;
    while (reader->Read(&m)) {
      if (m.has_header()) {
        theta.round = m.header().round();
        continue;
      }
      const TensorChunk& c = m.chunk();
      EXPECT_EQ(c.codec(), CODEC_RAW);
      if (theta.layout.empty() || theta.layout.back().name != c.name()) {
        TensorInfo t{c.name(), {c.shape().begin(), c.shape().end()}, 1};
        for (int64_t d : t.shape) t.numel *= d;
        theta.layout.push_back(t);
      }
      const size_t at = theta.flat.size();
      theta.flat.resize(at + static_cast<size_t>(c.count()));
      std::memcpy(theta.flat.data() + at, c.data().data(), static_cast<size_t>(c.count()) * sizeof(float));
    }
    grpc::Status s = reader->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
    return theta;
  }
  // Sends the messages as one push stream; returns its final status.
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
  // Part `part` of `parts` (parts 0: a push in one stream) of `delta` over elements [begin, end) of the flat buffer,
  // in chunks of at most 200 elements that never cross a tensor's end.
  std::vector<PushMessage> PartMessages(const std::vector<TensorInfo>& layout, const std::vector<float>& delta,
                                        int64_t round, int part, int parts, FlatRange range,
                                        uint64_t attempt = 0) const {
    std::vector<PushMessage> out(1);
    PushHeader* h = out[0].mutable_header();
    *h->mutable_meta() = Meta(round);
    h->set_tokens(kTokens);
    h->set_inner_steps(10);
    h->set_loss(3.0);
    h->set_seconds(1.0);
    if (parts > 1) {
      h->set_part(part);
      h->set_parts(parts);
      h->set_attempt(attempt);
      h->mutable_range()->set_begin(range.begin);
      h->mutable_range()->set_end(range.end);
    }
    int64_t base = 0;  // flat index of the tensor's first element
    for (const TensorInfo& t : layout) {
      for (int64_t i = std::max(range.begin, base); i < std::min(range.end, base + t.numel);) {
        const int64_t count = std::min<int64_t>({200, base + t.numel - i, range.end - i});
        PushMessage m;
        TensorChunk* c = m.mutable_chunk();
        c->set_name(t.name);
        c->set_dtype(FLOAT32);
        for (int64_t d : t.shape) c->add_shape(d);
        c->set_offset(i - base);
        c->set_count(count);
        c->set_codec(CODEC_RAW);
        c->set_data(delta.data() + i, static_cast<size_t>(count) * sizeof(float));
        out.push_back(m);
        i += count;
      }
      base += t.numel;
    }
    return out;
  }

 private:
  std::unique_ptr<Coordinator::Stub> stub_;
  std::string id_;
  std::string fingerprint_;
};

// A pseudo-gradient with a value of its own at every element.
std::vector<float> Delta(size_t n, float scale) {
  std::vector<float> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = scale * static_cast<float>(std::sin(0.37 * static_cast<double>(i) + scale));
  return d;
}

class CoordinatorRun {
 public:
  explicit CoordinatorRun(const std::string& name)
      : dir_(ScratchDir(name)),
        process_("diloco-coordinator", With(TinyArgs(dir_, kOverrides), {"--port-file", dir_ + "/addr"})),
        address_(WaitForAddress(process_, dir_ + "/addr")) {}
  const std::string& address() const { return address_; }
  RunningProcess& process() { return process_; }
  std::string Fingerprint() {
    auto stub = Coordinator::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    StatusReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    EXPECT_TRUE(stub->GetStatus(&ctx, StatusRequest(), &reply).ok());
    return reply.fingerprint();
  }

 private:
  std::string dir_;
  RunningProcess process_;
  std::string address_;
};

// Waits until the coordinator's round is `round` (the outer step after the last push is done on its round thread).
void WaitForRound(Member& m, int64_t round) {
  for (int i = 0; i < 600 && m.Status().round() < round; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(m.Status().round(), round);
}

// Pushes `delta` for `round` as two parts, part 1 first; checks the status shows 1/2 in between.
void PushTwoParts(Member& m, const std::vector<TensorInfo>& layout, const std::vector<float>& delta, int64_t round,
                  const std::string& id) {
  const SlicePlan plan(static_cast<int64_t>(delta.size()), 2, kAlign);
  grpc::Status s = m.Push(m.PartMessages(layout, delta, round, 1, 2, plan.slice(1)));
  ASSERT_TRUE(s.ok()) << s.error_message();
  bool shown = false;
  const StatusReply status = m.Status();
  for (const WorkerStatus& w : status.workers()) {
    if (w.id() == id) shown = w.parts_received() == 1 && w.parts() == 2 && !w.pushed_this_round();
  }
  EXPECT_TRUE(shown) << "status should show member " << id << " with 1/2 parts in and not yet counted";
  s = m.Push(m.PartMessages(layout, delta, round, 0, 2, plan.slice(0)));
  ASSERT_TRUE(s.ok()) << s.error_message();
}

struct HostileCase {
  std::string what;
  grpc::StatusCode code;
  std::string message;  // a piece of the refusal's message
  // The streams the hostile member sends, in order; the last one must be refused with `code`.
  std::function<std::vector<std::vector<PushMessage>>(const Member&)> streams;
};

TEST(PushParts, TwoPartPushesGiveTheThetaOfOneStreamAndHostilePartsAreRefusedWithTheModelUnchanged) {
  auto config = LoadConfig(SourceDir() + "/config/tiny.yaml", kOverrides);
  ASSERT_TRUE(config.ok()) << config.status();
  CoordinatorRun a("push_parts_a");
  CoordinatorRun b("push_parts_b");
  ASSERT_FALSE(a.address().empty()) << a.process().output();
  ASSERT_FALSE(b.address().empty()) << b.process().output();
  const std::string fp = a.Fingerprint();
  ASSERT_EQ(fp, b.Fingerprint());

  Member cluster(a.address(), "cluster", fp);
  Member single(b.address(), "single", fp);
  ASSERT_TRUE(cluster.Join(*config, 2).ok());
  ASSERT_TRUE(single.Join(*config, 1).ok());
  const Theta theta_0 = cluster.Pull(0);
  ASSERT_EQ(theta_0.flat, single.Pull(0).flat) << "both coordinators must start from the same theta_0";
  const std::vector<TensorInfo>& layout = theta_0.layout;
  const int64_t n = static_cast<int64_t>(theta_0.flat.size());
  const std::vector<float> d1 = Delta(theta_0.flat.size(), 0.01f);
  const std::vector<float> d2 = Delta(theta_0.flat.size(), 0.02f);

  // Round 1: two parts on A, one stream on B.
  PushTwoParts(cluster, layout, d1, 0, "cluster");
  ASSERT_TRUE(single.Push(single.PartMessages(layout, d1, 0, 0, 0, {0, n})).ok());
  WaitForRound(cluster, 1);
  WaitForRound(single, 1);
  const Theta theta_1 = cluster.Pull(1);
  ASSERT_NE(theta_1.flat, theta_0.flat);
  ASSERT_EQ(theta_1.flat, single.Pull(1).flat) << "a two-part push must step theta as the same delta in one stream";

  // Hostile members on A, each refused; the round stays open (the cluster member has not pushed).
  const SlicePlan plan(n, 2, kAlign);
  const FlatRange s0 = plan.slice(0);
  const FlatRange s1 = plan.slice(1);
  auto part = [&](const Member& h, int p, int parts, FlatRange r, int64_t round = 1) {
    return h.PartMessages(layout, d2, round, p, parts, r);
  };
  const std::vector<HostileCase> cases = {
      {"overlapping ranges", grpc::StatusCode::INVALID_ARGUMENT, "overlaps",
       [&](const Member& h) {
         return std::vector<std::vector<PushMessage>>{part(h, 0, 2, s0), part(h, 1, 2, {s1.begin - 8, s1.end})};
       }},
      {"a missing range", grpc::StatusCode::FAILED_PRECONDITION, "missing",
       [&](const Member& h) {
         return std::vector<std::vector<PushMessage>>{part(h, 0, 2, s0), part(h, 1, 2, {s1.begin + 8, s1.end})};
       }},
      {"a part the member does not have", grpc::StatusCode::INVALID_ARGUMENT, "pushes 2 parts",
       [&](const Member& h) {
         return std::vector<std::vector<PushMessage>>{part(h, 0, 2, s0), part(h, 2, 2, s1)};
       }},
      {"more parts than declared at Join", grpc::StatusCode::INVALID_ARGUMENT, "cluster_size 2",
       [&](const Member& h) {
         return std::vector<std::vector<PushMessage>>{part(h, 0, 2, s0), part(h, 1, 3, s1)};
       }},
      {"parts of two rounds", grpc::StatusCode::FAILED_PRECONDITION, "push for round 1 refused",
       [&](const Member& h) {
         return std::vector<std::vector<PushMessage>>{part(h, 0, 2, s0), part(h, 1, 2, s1, /*round=*/0)};
       }},
      {"a part pushed twice in one attempt", grpc::StatusCode::FAILED_PRECONDITION, "already pushed",
       [&](const Member& h) {
         return std::vector<std::vector<PushMessage>>{part(h, 0, 2, s0), part(h, 0, 2, s0)};
       }},
      {"a part that ends early", grpc::StatusCode::INVALID_ARGUMENT, "ended early",
       [&](const Member& h) {
         std::vector<PushMessage> cut = part(h, 0, 2, s0);
         cut.pop_back();
         return std::vector<std::vector<PushMessage>>{part(h, 1, 2, s1), cut};
       }},
      {"a chunk past its part's range", grpc::StatusCode::INVALID_ARGUMENT, "range",
       [&](const Member& h) {
         std::vector<PushMessage> past = part(h, 0, 2, {s0.begin, s0.end - 8});
         past[0].mutable_header()->mutable_range()->set_end(s0.end - 16);
         return std::vector<std::vector<PushMessage>>{part(h, 1, 2, s1), past};
       }},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const HostileCase& c = cases[i];
    SCOPED_TRACE(c.what);
    Member hostile(a.address(), "hostile" + std::to_string(i), fp);
    ASSERT_TRUE(hostile.Join(*config, 2).ok());
    const auto streams = c.streams(hostile);
    for (size_t k = 0; k + 1 < streams.size(); ++k) {
      grpc::Status s = hostile.Push(streams[k]);
      ASSERT_TRUE(s.ok()) << "stream " << k << ": " << s.error_message();
    }
    grpc::Status s = hostile.Push(streams.back());
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_NE(s.error_message().find(c.message), std::string::npos) << s.error_message();
    hostile.Leave();
    const Theta now = cluster.Pull(1);
    EXPECT_EQ(now.round, 1);
    EXPECT_EQ(now.flat, theta_1.flat);
  }

  // Round 2: on A the member's attempt 5 sends part 0 with other values; then it pushes over (attempt 6: how a
  // cluster recovers from a part that broke before the coordinator read it), part 0 first; a late part of attempt 5
  // is refused as stale; B gets the delta in one stream. theta_2 equal means neither a refused part nor attempt 5's
  // part 0 stayed in A's sums.
  grpc::Status first = cluster.Push(cluster.PartMessages(layout, d1, 1, 0, 2, s0, /*attempt=*/5));
  ASSERT_TRUE(first.ok()) << first.error_message();
  grpc::Status over = cluster.Push(cluster.PartMessages(layout, d2, 1, 0, 2, s0, /*attempt=*/6));
  ASSERT_TRUE(over.ok()) << "a part of a newer attempt starts the member's push over: " << over.error_message();
  grpc::Status late = cluster.Push(cluster.PartMessages(layout, d1, 1, 1, 2, s1, /*attempt=*/5));
  EXPECT_EQ(late.error_code(), grpc::StatusCode::ABORTED) << late.error_message();
  EXPECT_NE(late.error_message().find("older than attempt 6"), std::string::npos) << late.error_message();
  EXPECT_EQ(cluster.Status().round(), 1) << "one part of attempt 6 is in: the round must stay open";
  grpc::Status rest = cluster.Push(cluster.PartMessages(layout, d2, 1, 1, 2, s1, /*attempt=*/6));
  ASSERT_TRUE(rest.ok()) << rest.error_message();
  ASSERT_TRUE(single.Push(single.PartMessages(layout, d2, 1, 0, 0, {0, n})).ok());
  WaitForRound(cluster, 2);
  WaitForRound(single, 2);
  const Theta theta_2 = cluster.Pull(2);
  EXPECT_EQ(theta_2.flat, single.Pull(2).flat) << "a refused part reached the global model";

  // A pull in parts: each slice is that range of the whole theta.
  for (int r = 0; r < 2; ++r) {
    ElementRange range;
    range.set_begin(plan.slice(r).begin);
    range.set_end(plan.slice(r).end);
    const Theta slice = cluster.Pull(2, &range);
    EXPECT_EQ(slice.round, 2);
    EXPECT_EQ(slice.flat, std::vector<float>(theta_2.flat.begin() + range.begin(), theta_2.flat.begin() + range.end()));
  }
  ElementRange outside;
  outside.set_begin(0);
  outside.set_end(n + 1);
  PullRequest bad;
  *bad.mutable_meta() = cluster.Meta(2);
  *bad.mutable_range() = outside;
  auto stub = Coordinator::NewStub(grpc::CreateChannel(a.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  Deadline(&ctx);
  auto reader = stub->PullParameters(&ctx, bad);
  PullMessage m;
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace diloco::testing
