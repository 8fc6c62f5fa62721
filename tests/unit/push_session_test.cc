// PushSession (coordinator/push_session.h) driven with hand-made push streams, no network: every kind of bad message
// gets its own gRPC code and message (the table "Errors a push can get" in docs/operations.md), and a round that saw
// every
// kind of refused push ends with exactly (bit for bit) the global model of a round that never saw them.
// Rounds are closed with CoordinatorCore::Poll() under an injected clock, so nothing here waits on time.
#include "coordinator/push_session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "config/config_loader.h"
#include "proto/tensor_chunks.h"
#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_coordinator_config.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;
using Named = std::vector<std::pair<std::string, at::Tensor>>;
using Stream = std::vector<PushMessage>;

class PushSessionTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_ = TinyCoordinatorConfig(dir_);
    config_.coordinator.lease_s = 100;
  }

  std::unique_ptr<CoordinatorCore> MakeCore() {
    auto core = CoordinatorCore::Create(config_, TinyTheta0(config_.model), std::make_unique<SumOfSquaresEvaluator>(),
                                        false, [this] { return now_; });
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? std::move(*core) : nullptr;
  }
  static void Join(CoordinatorCore& core, const std::string& id, const Config& config) {
    JoinRequest r;
    r.mutable_meta()->set_worker_id(id);
    r.mutable_meta()->set_fingerprint(core.fingerprint());
    r.mutable_model()->set_vocab_size(config.model.vocab_size);
    r.mutable_model()->set_seq_len(config.model.seq_len);
    r.mutable_model()->set_n_layer(config.model.n_layer);
    r.mutable_model()->set_n_head(config.model.n_head);
    r.mutable_model()->set_d_model(config.model.d_model);
    ASSERT_TRUE(core.Join(r).ok()) << id;
  }
  // A valid push stream: header, then `delta` in chunks of 256 bytes (tensors of > 64 elements take several).
  static Stream GoodStream(const CoordinatorCore& core, const std::string& id, int64_t round, const Named& delta,
                           int64_t tokens = 1000) {
    Stream s(1);
    PushHeader* h = s[0].mutable_header();
    h->mutable_meta()->set_worker_id(id);
    h->mutable_meta()->set_round(round);
    h->mutable_meta()->set_fingerprint(core.fingerprint());
    h->set_tokens(tokens);
    h->set_inner_steps(5);
    h->set_loss(3.5);
    h->set_seconds(2.0);
    TensorChunker chunker(delta, 256);
    PushMessage m;
    while (chunker.Next(m.mutable_chunk())) s.push_back(m);
    return s;
  }
  // Feeds `stream` to a fresh session; with `end`, closes it (OnEnd) if every message was accepted.
  static absl::Status Send(CoordinatorCore& core, const Stream& stream, bool end = true) {
    PushSession session(&core);
    for (const PushMessage& m : stream) {
      absl::Status s = session.OnMessage(m);
      if (!s.ok()) {
        EXPECT_EQ(session.OnMessage(m).code(), s.code()) << "a refused session must stay refused";
        return s;
      }
    }
    if (!end) return absl::OkStatus();
    return session.OnEnd().status();
  }
  Named RandomDelta(const CoordinatorCore& core, uint64_t seed) const {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    Named d;
    for (const TensorSpec& s : core.specs()) d.emplace_back(s.name, at::randn(s.shape, gen, at::kFloat));
    return d;
  }
  static std::vector<at::Tensor> Theta(CoordinatorCore& core, const std::string& member, int64_t* round) {
    PullRequest r;
    r.mutable_meta()->set_worker_id(member);
    r.mutable_meta()->set_fingerprint(core.fingerprint());
    auto snap = core.BeginPull(r);
    EXPECT_TRUE(snap.ok()) << snap.status();
    std::vector<at::Tensor> out;
    if (!snap.ok()) return out;
    *round = (*snap)->round;
    for (const auto& [name, p] : (*snap)->params) out.push_back(p.clone());  // a pull copies; theta steps in place
    return out;
  }
  static bool Pushed(CoordinatorCore& core, const std::string& id) {
    HeartbeatRequest r;
    r.mutable_meta()->set_worker_id(id);
    r.mutable_meta()->set_fingerprint(core.fingerprint());
    auto reply = core.Heartbeat(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() && reply->pushed();
  }

  Config config_;
  double now_ = 0;
};

struct BadCase {
  std::string name;
  std::function<Stream(Stream)> mutate;  // applied to a good stream of worker H for the open round
  bool end;                              // the client closes the stream after the last message
  absl::StatusCode code;
  std::string message;  // a substring of the refusal
};

std::vector<BadCase> BadCases(int64_t round, const std::string& first_tensor, const std::string& second_tensor) {
  auto chunk = [](Stream& s, size_t i) { return s[i].mutable_chunk(); };
  return {
      {"no header",
       [](Stream s) {
         s.erase(s.begin());
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "push stream must start with a header"},
      {"empty stream", [](Stream) { return Stream{}; }, true, absl::StatusCode::kInvalidArgument,
       "push stream ended before its header"},
      {"unknown worker",
       [](Stream s) {
         s[0].mutable_header()->mutable_meta()->set_worker_id("nobody");
         return s;
       },
       true, absl::StatusCode::kNotFound, "worker 'nobody' is not an active member"},
      {"no worker id",
       [](Stream s) {
         s[0].mutable_header()->mutable_meta()->clear_worker_id();
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "request without a worker id"},
      {"wrong fingerprint",
       [](Stream s) {
         s[0].mutable_header()->mutable_meta()->set_fingerprint("0123456789abcdef");
         return s;
       },
       true, absl::StatusCode::kFailedPrecondition, "model fingerprint 0123456789abcdef does not match"},
      {"stale round",
       [round](Stream s) {
         s[0].mutable_header()->mutable_meta()->set_round(round - 1);
         return s;
       },
       true, absl::StatusCode::kFailedPrecondition,
       "push for round " + std::to_string(round) + " refused: the coordinator's round is " + std::to_string(round + 1)},
      {"future round",
       [round](Stream s) {
         s[0].mutable_header()->mutable_meta()->set_round(round + 5);
         return s;
       },
       true, absl::StatusCode::kFailedPrecondition, "push for round " + std::to_string(round + 6) + " refused"},
      {"zero tokens",
       [](Stream s) {
         s[0].mutable_header()->set_tokens(0);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "push header: tokens (0) must be in [1, 2^40]"},
      {"NaN loss",
       [](Stream s) {
         s[0].mutable_header()->set_loss(std::nan(""));
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "push header: loss (nan) must be finite"},
      {"wrong fragment",
       [](Stream s) {
         s[0].mutable_header()->set_fragment(1);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "push of fragment 1 refused"},
      {"second header",
       [](Stream s) {
         s.insert(s.begin() + 2, s[0]);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "a push header may appear only once"},
      {"empty message",
       [](Stream s) {
         s.insert(s.begin() + 1, PushMessage());
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "push message holds neither a header nor a chunk"},
      {"wrong tensor name",
       [chunk](Stream s) {
         chunk(s, 1)->set_name("evil");
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "expected tensor 1/"},
      {"wrong dtype",
       [chunk](Stream s) {
         chunk(s, 1)->set_dtype(FLOAT16);
         chunk(s, 1)->set_count(chunk(s, 1)->count() * 2);  // the same bytes: only the dtype is wrong
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "tensor '" + first_tensor + "': dtype Half, expected Float"},
      {"unknown dtype",
       [chunk](Stream s) {
         chunk(s, 1)->set_dtype(static_cast<DType>(99));
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "unknown wire dtype 99"},
      {"wrong shape",
       [chunk](Stream s) {
         chunk(s, 1)->add_shape(1);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "tensor '" + first_tensor + "': shape ["},
      {"offset gap",
       [chunk](Stream s) {
         chunk(s, 2)->set_offset(chunk(s, 2)->offset() + 1);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "tensor '" + first_tensor + "': chunk at element"},
      {"count past the tensor end",
       [chunk](Stream s) {
         chunk(s, 1)->set_count(1 << 30);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "tensor '" + first_tensor + "': chunk of 1073741824 elements at 0"},
      {"declared bytes differ from received",
       [chunk](Stream s) {
         chunk(s, 1)->mutable_data()->resize(chunk(s, 1)->data().size() - 4);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "tensor '" + first_tensor + "': chunk declares 64 elements"},
      {"unknown codec",
       [chunk](Stream s) {
         chunk(s, 1)->set_codec(static_cast<Codec>(42));
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "tensor '" + first_tensor + "': unknown codec 42"},
      {"bad quantization scale",
       [chunk](Stream s) {
         TensorChunk* c = chunk(s, 1);
         c->set_codec(CODEC_INT8);
         c->mutable_data()->resize(static_cast<size_t>(c->count()));
         c->set_scale(0);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "tensor '" + first_tensor + "': bad quantization scale 0"},
      {"NaN in a later tensor",
       [chunk, second_tensor](Stream s) {
         for (size_t i = 1; i < s.size(); ++i) {
           if (s[i].chunk().name() != second_tensor) continue;
           float nan = std::numeric_limits<float>::quiet_NaN();
           chunk(s, i)->mutable_data()->replace(0, sizeof(float), reinterpret_cast<const char*>(&nan), sizeof(float));
           break;
         }
         return s;
       },
       true, absl::StatusCode::kInvalidArgument,
       "pseudo-gradient of '" + second_tensor + "' holds NaN or Inf near element 0; push refused"},
      {"int8 chunk decoding to Inf",
       [chunk](Stream s) {
         TensorChunk* c = chunk(s, 1);
         c->set_codec(CODEC_INT8);
         c->set_data(std::string(static_cast<size_t>(c->count()), '\xff'));
         c->set_lo(3e38f);
         c->set_scale(3e38f);  // 3e38 + 255 * 3e38 overflows float
         return s;
       },
       true, absl::StatusCode::kInvalidArgument,
       "pseudo-gradient of '" + first_tensor + "' holds NaN or Inf near element 0"},
      {"truncated stream",
       [](Stream s) {
         s.resize(s.size() - 1);
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "push stream ended early, at tensor"},
      {"chunk after the last tensor",
       [](Stream s) {
         s.push_back(s.back());
         return s;
       },
       true, absl::StatusCode::kInvalidArgument, "unexpected chunk '"},
  };
}

// Round 0 is clean. In round 1, member H (joined after round 0) sends every kind of bad push (some refused at the
// header, some after chunks were folded), A pushes, H's bad pushes come again (those refused after folding restart
// the aggregation, so A pushes again), B pushes, H's lease runs out and it leaves. The model after round 2 must
// equal, bit for bit, that of a core that only ever saw A's and B's pushes.
TEST_F(PushSessionTest, EveryBadPushGetsItsOwnErrorAndLeavesTheModelBitForBitUnchanged) {
  std::unique_ptr<CoordinatorCore> reference = MakeCore(), core = MakeCore();
  ASSERT_NE(reference, nullptr);
  ASSERT_NE(core, nullptr);
  for (const std::string& id : {"A", "B"}) {
    Join(*reference, id, config_);
    Join(*core, id, config_);
  }
  ASSERT_GT(core->specs()[0].numel(), 64) << "the cases need a first tensor of several 256-byte chunks";
  const Named a0 = RandomDelta(*core, 1), b0 = RandomDelta(*core, 2), a1 = RandomDelta(*core, 3),
              b1 = RandomDelta(*core, 4);
  int64_t round = -1;
  for (CoordinatorCore* c : {reference.get(), core.get()}) {
    ASSERT_TRUE(Send(*c, GoodStream(*c, "A", 0, a0, 3000)).ok());
    ASSERT_TRUE(Send(*c, GoodStream(*c, "B", 0, b0, 1000)).ok());
    c->Poll();
    Theta(*c, "A", &round);
    ASSERT_EQ(round, 1);
  }
  Join(*core, "H", config_);
  const std::vector<BadCase> cases = BadCases(1, core->specs()[0].name, core->specs()[1].name);
  // Each bad push comes from its own member (H<pass>_<case>): a member whose pushes break off twice in a row is
  // quarantined (round_policy.h QuarantineRounds) and would get that refusal instead of its case's.
  int pass = 0;
  auto send_bad_pushes = [&] {
    std::set<std::string> messages;
    ++pass;
    int index = 0;
    for (const BadCase& c : cases) {
      const std::string id = "H" + std::to_string(pass) + "_" + std::to_string(index++);
      Join(*core, id, config_);
      absl::Status s = Send(*core, c.mutate(GoodStream(*core, id, 1, a1)), c.end);
      EXPECT_EQ(s.code(), c.code) << c.name << ": " << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.name;
      messages.insert(std::string(s.message()));
    }
    EXPECT_EQ(messages.size(), cases.size()) << "two kinds of bad push got the same message";
  };
  send_bad_pushes();
  ASSERT_TRUE(Send(*core, GoodStream(*core, "A", 1, a1, 3000)).ok());
  ASSERT_TRUE(Pushed(*core, "A"));
  absl::Status duplicate = Send(*core, GoodStream(*core, "A", 1, a1, 3000));
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kAlreadyExists) << duplicate;
  EXPECT_THAT(std::string(duplicate.message()), HasSubstr("worker 'A' already pushed for round 2"));
  send_bad_pushes();
  EXPECT_FALSE(Pushed(*core, "A")) << "a push refused after some chunks were folded restarts the aggregation";
  ASSERT_TRUE(Send(*core, GoodStream(*core, "A", 1, a1, 3000)).ok());
  Stream broken = GoodStream(*core, "H", 1, a1);
  broken.resize(broken.size() / 2);
  ASSERT_TRUE(Send(*core, broken, /*end=*/false).ok());  // the stream breaks off: no status, the session aborts
  EXPECT_FALSE(Pushed(*core, "A")) << "a broken push restarts the aggregation too";
  ASSERT_TRUE(Send(*core, GoodStream(*core, "A", 1, a1, 3000)).ok());
  ASSERT_TRUE(Send(*core, GoodStream(*core, "B", 1, b1, 1000)).ok());

  now_ = 150;  // H silent for 150 s > lease_s 100; A and B heartbeat
  Pushed(*core, "A");
  Pushed(*core, "B");
  absl::Status expired = Send(*core, GoodStream(*core, "H", 1, a1));
  EXPECT_EQ(expired.code(), absl::StatusCode::kNotFound) << expired;
  EXPECT_THAT(std::string(expired.message()), HasSubstr("worker 'H' lease expired"));
  core->Poll();  // marks H lost; A and B pushed: the round closes

  Pushed(*reference, "A");  // heartbeats at now_ = 150, as in `core`
  Pushed(*reference, "B");
  ASSERT_TRUE(Send(*reference, GoodStream(*reference, "A", 1, a1, 3000)).ok());
  ASSERT_TRUE(Send(*reference, GoodStream(*reference, "B", 1, b1, 1000)).ok());
  reference->Poll();
  int64_t got_round = -1, want_round = -1;
  const std::vector<at::Tensor> got = Theta(*core, "A", &got_round), want = Theta(*reference, "A", &want_round);
  EXPECT_EQ(got_round, 2);
  EXPECT_EQ(want_round, 2);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << core->specs()[i].name;
  const StatusReply status = core->Status();
  for (const WorkerStatus& w : status.workers()) {
    if (w.id() != "H") continue;
    EXPECT_EQ(w.state(), "lost");
    EXPECT_EQ(w.rounds_contributed(), 0);
    EXPECT_EQ(w.tokens(), 0);
    EXPECT_EQ(w.bytes_pushed(), 0);
  }
}

// A chunk before any header is refused without touching the core, and the session stays refused.
TEST_F(PushSessionTest, ChunkBeforeAnyHeaderIsRefusedAndTheSessionStaysRefused) {
  std::unique_ptr<CoordinatorCore> core = MakeCore();
  ASSERT_NE(core, nullptr);
  PushSession session(core.get());
  PushMessage m;
  m.mutable_chunk();
  EXPECT_EQ(session.OnMessage(m).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session.OnEnd().status().code(), absl::StatusCode::kInvalidArgument) << "stays refused";
  EXPECT_EQ(core->Status().bytes_received(), 0);
}

// The gRPC message limits are comm.chunk_bytes + 1 MiB as an int (coordinator/main.cc, worker/client.cc): the loader
// keeps chunk_bytes where that cannot overflow.
TEST(PushMessageLimitTest, ChunkBytesAbove256MiBIsAConfigError) {
  absl::StatusOr<Config> most =
      ParseConfig("", "my.yaml", {"comm.chunk_bytes=268435456", "coordinator.grpc_memory_quota_mb=514"});
  ASSERT_TRUE(most.ok()) << most.status();
  absl::StatusOr<Config> over = ParseConfig("", "my.yaml", {"comm.chunk_bytes=268435457"});
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr("comm.chunk_bytes: must be in [1, 268435456], got 268435457"));
}

// The gRPC memory quota (default 32 MiB) must hold two of the largest messages, else every push would be reset.
TEST(PushMessageLimitTest, AQuotaBelowTwoMessagesIsAConfigError) {
  ASSERT_TRUE(ParseConfig("", "my.yaml", {"comm.chunk_bytes=15728640"}).ok());  // 15 MiB + 1 MiB: 2 x 16 fits 32
  absl::StatusOr<Config> big = ParseConfig("", "my.yaml", {"comm.chunk_bytes=16777216"});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(std::string(big.status().message()),
            "my.yaml: coordinator.grpc_memory_quota_mb: 32 MiB cannot hold two messages of comm.chunk_bytes + 1 MiB "
            "(17 MiB each); set at least 34, lower comm.chunk_bytes, or 0 (off)");
  EXPECT_TRUE(ParseConfig("", "my.yaml", {"comm.chunk_bytes=16777216", "coordinator.grpc_memory_quota_mb=0"}).ok());
}

}  // namespace
}  // namespace diloco
