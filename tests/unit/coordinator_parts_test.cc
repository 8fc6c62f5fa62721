// CoordinatorCore with pushes in parts (coordinator/push_parts.h, proto/PROTOCOL.md "Push and pull in parts"),
// driven directly with a fake clock: a member of cluster_size n pushes n parts, each a range of the flat buffer folded
// at its flat offsets. The round waits for the member's last part and steps with its whole pseudo-gradient (checked
// against the token-weighted average and the Nesterov step computed here); a refused part restarts the aggregation
// and makes the member's other parts stale; parts that stall are cut when the round is due.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "proto/slice_plan.h"
#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_coordinator_config.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;
using Tensors = std::vector<at::Tensor>;

constexpr double kLr = 0.7;
constexpr double kMu = 0.9;

class CoordinatorPartsTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_ = TinyCoordinatorConfig(dir_);
    config_.outer.lr = kLr;
    config_.outer.momentum = kMu;
    config_.coordinator.min_workers = 1;
    config_.coordinator.round_timeout_s = 100;
    config_.coordinator.lease_s = 10;
    auto core = CoordinatorCore::Create(config_, TinyTheta0(config_.model), nullptr, false, [this] { return now_; });
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
    for (const TensorSpec& s : core_->specs()) numel_ += s.numel();
  }

  RequestMeta Meta(const std::string& id, int64_t round = 0) const {
    RequestMeta meta;
    meta.set_worker_id(id);
    meta.set_round(round);
    meta.set_fingerprint(core_->fingerprint());
    return meta;
  }
  void Join(const std::string& id, int cluster_size) {
    auto joined = TryJoin(id, cluster_size, /*push_parts=*/0);
    ASSERT_TRUE(joined.ok()) << id << ": " << joined.status();
  }
  // push_parts 0: not said (an older client), as Join above.
  absl::StatusOr<JoinReply> TryJoin(const std::string& id, int cluster_size, int push_parts) {
    JoinRequest r;
    *r.mutable_meta() = Meta(id);
    r.mutable_model()->set_vocab_size(config_.model.vocab_size);
    r.mutable_model()->set_seq_len(config_.model.seq_len);
    r.mutable_model()->set_n_layer(config_.model.n_layer);
    r.mutable_model()->set_n_head(config_.model.n_head);
    r.mutable_model()->set_d_model(config_.model.d_model);
    r.set_cluster_size(cluster_size);
    r.set_push_parts(push_parts);
    return core_->Join(r);
  }
  bool Pushed(const std::string& id) {
    HeartbeatRequest r;
    *r.mutable_meta() = Meta(id);
    auto reply = core_->Heartbeat(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() && reply->pushed();
  }
  PushHeader Header(const std::string& id, int64_t tokens, int part = 0, int parts = 0, FlatRange range = {},
                    uint64_t attempt = 0) const {
    PushHeader h;
    *h.mutable_meta() = Meta(id);
    h.set_tokens(tokens);
    h.set_inner_steps(5);
    h.set_loss(3.5);
    h.set_seconds(2.0);
    if (parts > 1) {
      h.set_part(part);
      h.set_parts(parts);
      h.set_attempt(attempt);
      h.mutable_range()->set_begin(range.begin);
      h.mutable_range()->set_end(range.end);
    }
    return h;
  }
  // Folds the elements [range.begin, range.end) of the flat `delta` (every tensor end to end), one chunk per tensor
  // piece, at their tensors and offsets.
  absl::Status FoldRange(PushTicket& t, const at::Tensor& flat, FlatRange range) {
    int64_t base = 0;
    for (size_t i = 0; i < core_->specs().size(); ++i) {
      const int64_t n = core_->specs()[i].numel();
      const int64_t begin = std::max(range.begin, base), end = std::min(range.end, base + n);
      if (begin < end) {
        absl::Status s = core_->FoldChunk(t, i, begin - base, flat.narrow(0, begin, end - begin));
        if (!s.ok()) return s;
      }
      base += n;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<PushTicket> BeginPart(const std::string& id, int64_t tokens, int part, int parts, FlatRange range,
                                       const at::Tensor& flat, uint64_t attempt = 0) {
    auto t = core_->BeginPush(Header(id, tokens, part, parts, range, attempt));
    if (!t.ok()) return t.status();
    absl::Status s = FoldRange(*t, flat, range);
    if (!s.ok()) return s;
    return t;
  }
  absl::Status PushPart(const std::string& id, int64_t tokens, int part, int parts, FlatRange range,
                        const at::Tensor& flat, uint64_t attempt = 0) {
    auto t = BeginPart(id, tokens, part, parts, range, flat, attempt);
    return t.ok() ? core_->CommitPush(*t) : t.status();
  }
  absl::Status PushWhole(const std::string& id, int64_t tokens, const at::Tensor& flat) {
    auto t = core_->BeginPush(Header(id, tokens));
    if (!t.ok()) return t.status();
    absl::Status s = FoldRange(*t, flat, {0, numel_});
    return s.ok() ? core_->CommitPush(*t) : s;
  }
  at::Tensor FlatTheta() {
    PullRequest r;
    *r.mutable_meta() = Meta("A");
    auto snap = core_->BeginPull(r);
    EXPECT_TRUE(snap.ok()) << snap.status();
    Tensors flat;
    for (const auto& [name, p] : (*snap)->params) flat.push_back(p.reshape({-1}).clone());
    return at::cat(flat);
  }
  // The first Nesterov outer step (torch SGD, buf = delta): theta - lr * (delta + mu * delta).
  static at::Tensor Step(const at::Tensor& theta, const at::Tensor& delta) { return theta - kLr * (1 + kMu) * delta; }
  WorkerStatus Worker(const std::string& id) {
    const StatusReply status = core_->Status();
    for (const WorkerStatus& w : status.workers()) {
      if (w.id() == id) return w;
    }
    ADD_FAILURE() << "no worker " << id;
    return WorkerStatus();
  }

  // A of cluster_size 2 (parts p0, p1: the halves of the flat buffer) and B in one stream joined; theta_0, the
  // members' deltas and a junk one.
  struct TwoMembers {
    at::Tensor theta0, dA, dB, junk;
    FlatRange p0, p1;
  };
  TwoMembers JoinTwoMembers() {
    Join("A", 2);
    Join("B", 1);
    return {FlatTheta(),     at::randn({numel_}), at::randn({numel_}), at::randn({numel_}) * 100,
            {0, numel_ / 2}, {numel_ / 2, numel_}};
  }

  Config config_;
  double now_ = 0;
  std::unique_ptr<CoordinatorCore> core_;
  int64_t numel_ = 0;
};

// A of cluster_size 3 (parts of unequal size, one starting mid-tensor) and B in one stream. At round_timeout_s the
// round is due, but A has parts in the sums that progressed within lease_s: the round waits for A's last part, then
// steps with the token-weighted average of both whole pushes.
TEST_F(CoordinatorPartsTest, TheRoundWaitsForTheLastPartAndStepsWithTheWholeMember) {
  now_ = 90;  // the round opened at 0 and is due at round_timeout_s 100; the members join late (lease_s 10)
  Join("A", 3);
  Join("B", 1);
  const at::Tensor theta0 = FlatTheta();
  const at::Tensor dA = at::randn({numel_}), dB = at::randn({numel_});
  const FlatRange p0{0, 7}, p1{7, numel_ / 2}, p2{numel_ / 2, numel_};
  now_ = 95;
  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  ASSERT_TRUE(PushPart("A", 3000, 2, 3, p2, dA).ok());
  ASSERT_TRUE(PushPart("A", 3000, 0, 3, p0, dA).ok());
  EXPECT_FALSE(Pushed("A")) << "not counted before its last part";
  EXPECT_EQ(Worker("A").parts_received(), 2);
  EXPECT_EQ(Worker("A").parts(), 3);
  now_ = 104;  // the round is due (round_timeout_s 100); A's parts progressed 9 s ago (< lease_s 10)
  EXPECT_TRUE(Pushed("B"));
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 0) << "closed over a member with parts in the sums";
  EXPECT_THAT(core_->Status().phase_reason(), HasSubstr("push stream(s) in flight"));
  ASSERT_TRUE(PushPart("A", 3000, 1, 3, p1, dA).ok());
  EXPECT_TRUE(Pushed("A"));
  EXPECT_EQ(Worker("A").parts(), 0);
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  EXPECT_TRUE(at::allclose(FlatTheta(), Step(theta0, (dA * 3000 + dB * 1000) / 4000), 1e-5, 1e-6));
  EXPECT_EQ(Worker("A").tokens(), 3000) << "a member in parts counts its tokens once";
  EXPECT_EQ(Worker("A").rounds_contributed(), 1);
  // The member's push norm is the whole pseudo-gradient's, not one part's (status, metrics, the suspect flag).
  EXPECT_NEAR(Worker("A").last_push_norm(), dA.norm().item<double>(), 1e-4 * dA.norm().item<double>());
}

// A refused part breaks A's push: B (counted) must push again, A's part still streaming gets ABORTED, and the round
// then steps with B's and A's second, complete push only.
TEST_F(CoordinatorPartsTest, ARefusedPartRestartsTheAggregationAndMakesTheOtherPartsStale) {
  Join("A", 3);
  Join("B", 1);
  const at::Tensor theta0 = FlatTheta();
  const at::Tensor dA = at::randn({numel_}), dB = at::randn({numel_}), junk = at::randn({numel_}) * 100;
  const FlatRange p0{0, 7}, p1{7, numel_ / 2}, p2{numel_ / 2, numel_};
  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  ASSERT_TRUE(PushPart("A", 3000, 0, 3, p0, junk).ok());
  auto streaming = core_->BeginPush(Header("A", 3000, 1, 3, p1));
  ASSERT_TRUE(streaming.ok()) << streaming.status();
  absl::Status overlap = PushPart("A", 3000, 2, 3, {numel_ / 2 - 1, numel_}, junk);
  EXPECT_EQ(overlap.code(), absl::StatusCode::kInvalidArgument) << overlap;
  EXPECT_THAT(std::string(overlap.message()), HasSubstr("overlaps part 1's"));
  EXPECT_FALSE(Pushed("B")) << "A's part 0 was in the sums: B's counted push went with them";
  absl::Status stale = FoldRange(*streaming, junk, p1);
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted) << stale;
  core_->AbortPush(*streaming, "refused");
  EXPECT_EQ(Worker("A").broken_pushes(), 1);

  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  ASSERT_TRUE(PushPart("A", 3000, 1, 3, p1, dA).ok());
  ASSERT_TRUE(PushPart("A", 3000, 0, 3, p0, dA).ok());
  ASSERT_TRUE(PushPart("A", 3000, 2, 3, p2, dA).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  EXPECT_TRUE(at::allclose(FlatTheta(), Step(theta0, (dA * 3000 + dB * 1000) / 4000), 1e-5, 1e-6));
}

// A's attempt 1: part 0 in the sums, part 1 streaming when the ranks give up on it (say its connection broke before
// the coordinator read it). Attempt 2 pushes over, part 1 first: attempt 1 goes (B pushes again, its stream is
// ABORTED), a late part of attempt 1 is refused as stale, and the parts of attempt 2 join one assembly whatever their
// order. The round steps with attempt 2's push once.
TEST_F(CoordinatorPartsTest, APartOfANewerAttemptStartsTheMembersPushOver) {
  const TwoMembers m = JoinTwoMembers();
  const at::Tensor &theta0 = m.theta0, &dA = m.dA, &dB = m.dB, &junk = m.junk;
  const FlatRange p0 = m.p0, p1 = m.p1;
  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  ASSERT_TRUE(PushPart("A", 3000, 0, 2, p0, junk, /*attempt=*/1).ok());
  auto old_part_1 = core_->BeginPush(Header("A", 3000, 1, 2, p1, /*attempt=*/1));
  ASSERT_TRUE(old_part_1.ok()) << old_part_1.status();
  auto new_part_1 = BeginPart("A", 3000, 1, 2, p1, dA, /*attempt=*/2);
  ASSERT_TRUE(new_part_1.ok()) << "a part of a newer attempt is not refused: " << new_part_1.status();
  EXPECT_FALSE(Pushed("B")) << "attempt 1's part 0 was in the sums: B's counted push went with them";
  EXPECT_EQ(Worker("A").broken_pushes(), 1);
  EXPECT_EQ(FoldRange(*old_part_1, junk, p1).code(), absl::StatusCode::kAborted);
  core_->AbortPush(*old_part_1, "broke off");
  absl::Status late = PushPart("A", 3000, 0, 2, p0, junk, /*attempt=*/1);
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("older than attempt 2"));
  ASSERT_TRUE(core_->CommitPush(*new_part_1).ok());
  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  ASSERT_TRUE(PushPart("A", 3000, 0, 2, p0, dA, /*attempt=*/2).ok());
  EXPECT_TRUE(Pushed("A"));
  EXPECT_EQ(PushPart("A", 3000, 0, 2, p0, junk, 3).code(), absl::StatusCode::kAlreadyExists) << "counted: no push over";
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  EXPECT_TRUE(at::allclose(FlatTheta(), Step(theta0, (dA * 3000 + dB * 1000) / 4000), 1e-5, 1e-6));
  EXPECT_EQ(Worker("A").rounds_contributed(), 1);
  EXPECT_EQ(Worker("A").broken_pushes(), 1) << "the stale part broke nothing";
}

// The review's cases around attempts. (1) A push-over whose earlier parts had no chunks in the sums restarts nothing:
// B stays counted, A takes no strike. (2) C's broken push restarts the aggregation while A's attempt 2 is under way:
// a late part of attempt 2 must not open a new assembly (that would cost A a strike when attempt 3 pushes over); it is
// refused as discarded, and A's attempt 3 is counted once with no broken push on A's record.
TEST_F(CoordinatorPartsTest, AttemptsAlreadyDiscardedOpenNothingAndAPushOverWithoutChunksRestartsNothing) {
  const TwoMembers m = JoinTwoMembers();
  const at::Tensor &theta0 = m.theta0, &dA = m.dA, &dB = m.dB, &junk = m.junk;
  const FlatRange p0 = m.p0, p1 = m.p1;
  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  auto empty = core_->BeginPush(Header("A", 3000, 1, 2, p1, /*attempt=*/1));  // begun, nothing folded
  ASSERT_TRUE(empty.ok()) << empty.status();
  auto part_0 = BeginPart("A", 3000, 0, 2, p0, junk, /*attempt=*/2);
  ASSERT_TRUE(part_0.ok()) << part_0.status();
  EXPECT_TRUE(Pushed("B")) << "attempt 1 had nothing in the sums: no restart";
  EXPECT_EQ(Worker("A").broken_pushes(), 0);
  ASSERT_TRUE(core_->CommitPush(*part_0).ok());

  auto b_again = core_->BeginPush(Header("B", 1000));  // B is counted: ALREADY_EXISTS; C breaks the round instead
  EXPECT_EQ(b_again.status().code(), absl::StatusCode::kAlreadyExists);
  Join("C", 1);
  auto broken = core_->BeginPush(Header("C", 1000));
  ASSERT_TRUE(broken.ok()) << broken.status();
  ASSERT_TRUE(FoldRange(*broken, junk, {0, 7}).ok());
  core_->AbortPush(*broken, "connection lost");  // C's chunks were in the sums: the aggregation restarts
  EXPECT_FALSE(Pushed("B"));
  absl::Status late = PushPart("A", 3000, 1, 2, p1, junk, /*attempt=*/2);
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("was discarded"));
  EXPECT_EQ(Worker("A").parts_received(), 0) << "the late part opened an assembly";

  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  ASSERT_TRUE(PushWhole("C", 1000, dB).ok());
  ASSERT_TRUE(PushPart("A", 3000, 1, 2, p1, dA, /*attempt=*/3).ok());
  ASSERT_TRUE(PushPart("A", 3000, 0, 2, p0, dA, /*attempt=*/3).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  EXPECT_TRUE(at::allclose(FlatTheta(), Step(theta0, (dA * 3000 + dB * 2000) / 5000), 1e-5, 1e-6));
  EXPECT_EQ(Worker("A").broken_pushes(), 0);
  EXPECT_EQ(Worker("C").broken_pushes(), 1);
}

// A's process restarts mid-push (its clock now behind the attempts it sent): joining again discards its parts under
// way and forgets its attempts, so the new process's smaller attempt is taken and counted once.
TEST_F(CoordinatorPartsTest, JoiningAgainForgetsTheMembersAttempts) {
  Join("A", 2);
  const at::Tensor theta0 = FlatTheta();
  const at::Tensor dA = at::randn({numel_}), junk = at::randn({numel_}) * 100;
  const FlatRange p0{0, numel_ / 2}, p1{numel_ / 2, numel_};
  ASSERT_TRUE(PushPart("A", 3000, 0, 2, p0, junk, /*attempt=*/500).ok());
  Join("A", 2);
  EXPECT_EQ(Worker("A").parts_received(), 0);
  ASSERT_TRUE(PushPart("A", 3000, 0, 2, p0, dA, /*attempt=*/7).ok());
  ASSERT_TRUE(PushPart("A", 3000, 1, 2, p1, dA, /*attempt=*/7).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  EXPECT_TRUE(at::allclose(FlatTheta(), Step(theta0, dA), 1e-5, 1e-6));
}

// A's part 0 is in the sums and its other parts never come: when the round is due (round_timeout_s) and the parts
// made no progress for lease_s, they are cut, the aggregation restarts, A is quarantined, and the round closes on B.
TEST_F(CoordinatorPartsTest, StalledPartsAreCutWhenTheRoundIsDue) {
  Join("A", 2);
  Join("B", 1);
  const at::Tensor theta0 = FlatTheta();
  const at::Tensor dB = at::randn({numel_}), junk = at::randn({numel_}) * 100;
  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  ASSERT_TRUE(PushPart("A", 3000, 0, 2, {0, numel_ / 2}, junk).ok());
  auto streaming = core_->BeginPush(Header("A", 3000, 1, 2, {numel_ / 2, numel_}));  // header read, a chunk in
  ASSERT_TRUE(streaming.ok()) << streaming.status();
  ASSERT_TRUE(FoldRange(*streaming, junk, {numel_ / 2, numel_ / 2 + 7}).ok());
  now_ = 150;
  Pushed("A");  // both heartbeat: only A's push stalls
  EXPECT_TRUE(Pushed("B"));
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 0);
  EXPECT_FALSE(Pushed("B")) << "A's stalled part had chunks in the sums: B pushes again";
  EXPECT_EQ(Worker("A").broken_pushes(), 1);
  EXPECT_EQ(Worker("A").quarantined_until_round(), 1);
  EXPECT_EQ(Worker("A").parts(), 0);
  absl::Status cut = FoldRange(*streaming, junk, {numel_ / 2 + 7, numel_});
  EXPECT_EQ(cut.code(), absl::StatusCode::kFailedPrecondition) << "a part cut as stalled is told so, not ABORTED";
  EXPECT_THAT(std::string(cut.message()), HasSubstr("cut as late"));
  ASSERT_TRUE(PushWhole("B", 1000, dB).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  EXPECT_TRUE(at::allclose(FlatTheta(), Step(theta0, dB), 1e-5, 1e-6));
}

// outer.aggregation clip takes a claimed norm per stream, not per member: a push in parts is refused under it with a
// line that names the worker's setting to change, as INVALID_ARGUMENT (the worker gives up instead of retraining
// every round to be refused again), and nothing of it is folded (the same member's one-stream push is admitted).
TEST_F(CoordinatorPartsTest, ClipRefusesAPushInParts) {
  config_.outer.aggregation = Aggregation::kClip;
  auto core = CoordinatorCore::Create(config_, TinyTheta0(config_.model), nullptr, false, [this] { return now_; });
  ASSERT_TRUE(core.ok()) << core.status();
  core_ = std::move(*core);
  Join("A", 2);
  const SlicePlan plan(numel_, 2, 1);
  const auto refused = core_->BeginPush(Header("A", 3000, 0, 2, plan.slice(0)));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("clip takes each push in one stream"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("set comm.cluster_parts false"));
  PushHeader whole = Header("A", 3000);
  whole.set_claimed_norm(1.0);
  EXPECT_TRUE(core_->BeginPush(whole).ok());
}

// A worker that says at Join it will push in parts (JoinRequest.push_parts) is refused there under clip and the
// coordinate-wise rules, before it trains a round, with the line that names its setting; one that pushes in one
// stream, or says nothing (an older client), joins; under mean a push in parts joins.
TEST_F(CoordinatorPartsTest, ARuleThatTakesOneStreamRefusesAtJoinAWorkerThatPushesInParts) {
  for (Aggregation rule : {Aggregation::kClip, Aggregation::kTrimmedMean, Aggregation::kCenteredClip}) {
    const std::string name(EnumName(rule));
    SCOPED_TRACE(name);
    config_.outer.aggregation = rule;
    auto core = CoordinatorCore::Create(config_, TinyTheta0(config_.model), nullptr, false, [this] { return now_; });
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
    const auto refused = TryJoin("A", 4, /*push_parts=*/4);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr("outer.aggregation " + name + " takes each push in one stream"));
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("pushes in 4 parts"));
    EXPECT_EQ(core_->Status().workers_size(), 0) << "a refused Join makes no member";
    EXPECT_TRUE(TryJoin("B", 4, /*push_parts=*/1).ok());
    EXPECT_TRUE(TryJoin("C", 4, /*push_parts=*/0).ok());
  }
  config_.outer.aggregation = Aggregation::kMean;
  auto core = CoordinatorCore::Create(config_, TinyTheta0(config_.model), nullptr, false, [this] { return now_; });
  ASSERT_TRUE(core.ok()) << core.status();
  core_ = std::move(*core);
  EXPECT_TRUE(TryJoin("A", 4, /*push_parts=*/4).ok());
}

}  // namespace
}  // namespace diloco
