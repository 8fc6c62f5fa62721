// CoordinatorCore (coordinator/coordinator.h) driven directly, with no network and an injected fake clock: the
// token-weighted outer step, duplicate/late/broken/NaN pushes, request checks, lease expiry, drain, and
// checkpoint + resume. Rounds are closed by the real round loop (Run) on a thread; tests wait on Status() with a
// generous bound and never assert on time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "config/model_spec.h"
#include "coordinator/coordinate_window.h"
#include "coordinator/coordinator.h"
#include "proto/checkpoint.h"
#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_coordinator_config.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Tensors = std::vector<at::Tensor>;

constexpr double kLr = 0.7;
constexpr double kMu = 0.9;

bool Close(const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, /*rtol=*/1e-5, /*atol=*/1e-6); }

class CoordinatorCoreTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_ = TinyCoordinatorConfig(dir_);
    config_.outer.lr = kLr;
    config_.outer.momentum = kMu;
    config_.coordinator.lease_s = 1e6;
  }

  void TearDown() override {
    StopRun();
    core_.reset();
    ScratchDirTest::TearDown();
  }

  std::unique_ptr<CoordinatorCore> MakeCore(bool resume) {
    auto core = CoordinatorCore::Create(config_, TinyTheta0(config_.model), std::make_unique<SumOfSquaresEvaluator>(),
                                        resume, [this] { return now_.load(); });
    EXPECT_TRUE(core.ok()) << core.status();
    return core.ok() ? std::move(*core) : nullptr;
  }
  void Start() {
    core_ = MakeCore(/*resume=*/false);
    ASSERT_NE(core_, nullptr);
  }
  // outer.aggregation trimmed_mean with `trim`, `ids` joined. The pushes of these tests stream one after the other on
  // this thread, so the window lets each run to its end (window_chunks 1000); 64 float32 a chunk (chunk_bytes 256),
  // so that the pushes' tensors stream in several chunks.
  void StartTrimmedMean(int64_t trim, const std::vector<std::string>& ids) {
    config_.outer.aggregation = Aggregation::kTrimmedMean;
    config_.outer.trim = trim;
    config_.outer.window_chunks = 1000;
    config_.comm.chunk_bytes = 256;
    Start();
    for (const std::string& id : ids) Join(id);
  }
  void StartRun() {
    run_core_ = core_.get();
    run_thread_ = std::thread([core = run_core_] { core->Run(); });
  }
  void StopRun() {
    if (!run_thread_.joinable()) return;
    run_core_->Stop();
    run_thread_.join();
  }
  // Polls Status() until `done` holds or 30 s pass; returns whether it held.
  bool WaitFor(const std::function<bool(const StatusReply&)>& done) {
    for (int i = 0; i < 3000; ++i) {
      if (done(core_->Status())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  bool WaitForRound(int64_t round) {
    return WaitFor([round](const StatusReply& s) { return s.round() >= round; });
  }

  RequestMeta Meta(const std::string& id, int64_t round = 0) const {
    RequestMeta meta;
    meta.set_worker_id(id);
    meta.set_round(round);
    meta.set_fingerprint(core_->fingerprint());
    return meta;
  }
  JoinRequest JoinReq(const std::string& id) const {
    JoinRequest r;
    *r.mutable_meta() = Meta(id);
    r.mutable_model()->set_vocab_size(config_.model.vocab_size);
    r.mutable_model()->set_seq_len(config_.model.seq_len);
    r.mutable_model()->set_n_layer(config_.model.n_layer);
    r.mutable_model()->set_n_head(config_.model.n_head);
    r.mutable_model()->set_d_model(config_.model.d_model);
    return r;
  }
  void Join(const std::string& id) { ASSERT_TRUE(core_->Join(JoinReq(id)).ok()) << id; }
  // Starts an async run (Delayed Nesterov with N = 2) of workers A and B.
  // Started, A and B joined, and round 1 closed by A's random *dA and B's *dB (1000 tokens each).
  void CloseRoundOneWithAB(Tensors* dA, Tensors* dB) {
    Start();
    Join("A");
    Join("B");
    *dA = RandomDelta();
    *dB = RandomDelta();
    ASSERT_TRUE(Push("A", 0, 1000, *dA).ok());
    ASSERT_TRUE(Push("B", 0, 1000, *dB).ok());
    core_->Poll();
    ASSERT_EQ(core_->Status().round(), 1);
  }
  void StartAsyncAB(int64_t max_staleness) {
    config_.outer.mode = OuterMode::kAsync;
    config_.outer.delay_n = 2;
    config_.outer.max_staleness = max_staleness;
    config_.workers.count = 2;
    Start();
    Join("A");
    Join("B");
  }
  HeartbeatReply Beat(const std::string& id) {
    HeartbeatRequest r;
    *r.mutable_meta() = Meta(id);
    auto reply = core_->Heartbeat(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? *reply : HeartbeatReply();
  }
  PushHeader Header(const std::string& id, int64_t round, int64_t tokens, int64_t inner_steps = 5,
                    double seconds = 2.0) const {
    PushHeader h;
    *h.mutable_meta() = Meta(id, round);
    h.set_tokens(tokens);
    h.set_inner_steps(inner_steps);
    h.set_loss(3.5);
    h.set_seconds(seconds);
    return h;
  }
  Tensors RandomDelta() const {
    Tensors d;
    for (const TensorSpec& s : core_->specs()) d.push_back(at::randn(s.shape, at::kFloat));
    return d;
  }
  // The chunks (offset, count) FoldTensor sends of tensor i: two halves (offset 0 and numel/2), or under a
  // coordinate-wise rule the coordinator's own chunking (comm.chunk_bytes), which every push must follow there.
  std::vector<std::pair<int64_t, int64_t>> ChunksOf(size_t i) const {
    const int64_t numel = core_->specs()[i].numel();
    std::vector<std::pair<int64_t, int64_t>> chunks;
    if (IsCoordinateWise(config_.outer.aggregation) && config_.outer.mode == OuterMode::kSync) {
      const int64_t e = CoordinateWindowOptionsOf(config_, core_->specs()).chunk_elements.at(i);
      for (int64_t o = 0; o < numel; o += e) chunks.emplace_back(o, std::min(e, numel - o));
      return chunks;
    }
    const int64_t half = numel / 2;
    if (half > 0) chunks.emplace_back(0, half);
    chunks.emplace_back(half, numel - half);
    return chunks;
  }
  // Folds tensor i of `delta` in its chunks (ChunksOf); `only_first_half` stops after the first chunk.
  absl::Status FoldTensor(PushTicket& t, size_t i, const at::Tensor& delta, bool only_first_half = false) {
    at::Tensor flat = delta.reshape({-1});
    for (const auto& [offset, count] : ChunksOf(i)) {
      absl::Status s = core_->FoldChunk(t, i, offset, flat.narrow(0, offset, count));
      if (!s.ok() || only_first_half) return s;
    }
    return absl::OkStatus();
  }
  absl::Status Push(const std::string& id, int64_t round, int64_t tokens, const Tensors& delta, int64_t inner_steps = 5,
                    double seconds = 2.0) {
    auto ticket = core_->BeginPush(Header(id, round, tokens, inner_steps, seconds));
    if (!ticket.ok()) return ticket.status();
    for (size_t i = 0; i < delta.size(); ++i) {
      absl::Status s = FoldTensor(*ticket, i, delta[i]);
      if (!s.ok()) return s;
    }
    return core_->CommitPush(*ticket);
  }
  // theta_t as pulled by member `id` (any active member; pulling does not change membership).
  Tensors Theta(const std::string& id = "A", int64_t* round = nullptr) {
    PullRequest r;
    *r.mutable_meta() = Meta(id);
    auto snap = core_->BeginPull(r);
    EXPECT_TRUE(snap.ok()) << snap.status();
    Tensors out;
    if (!snap.ok()) return out;
    if (round != nullptr) *round = (*snap)->round;
    for (const auto& [name, p] : (*snap)->params) out.push_back(p.clone());  // a pull copies; theta steps in place
    return out;
  }
  // Token-weighted average of the pushes, DiLoCo Algorithm 1: delta = sum_i w_i delta_i / sum_i w_i.
  static Tensors Average(const std::vector<Tensors>& deltas, const std::vector<double>& weights) {
    double total = 0;
    for (double w : weights) total += w;
    Tensors avg;
    for (size_t t = 0; t < deltas[0].size(); ++t) {
      at::Tensor sum = at::zeros_like(deltas[0][t]);
      for (size_t i = 0; i < deltas.size(); ++i) sum.add_(deltas[i][t], weights[i]);
      avg.push_back(sum / total);
    }
    return avg;
  }
  // Nesterov outer step (torch SGD, dampening 0): buf = delta on the first step (no prev_buf), else
  // buf = mu * prev_buf + delta; theta - lr * (delta + mu * buf).
  static Tensors Step(const Tensors& theta, const Tensors& delta, const Tensors& prev_buf = {}) {
    Tensors out;
    for (size_t i = 0; i < theta.size(); ++i) {
      at::Tensor buf = prev_buf.empty() ? delta[i] : prev_buf[i] * kMu + delta[i];
      out.push_back(theta[i] - kLr * (delta[i] + kMu * buf));
    }
    return out;
  }
  static void ExpectAllClose(const Tensors& got, const Tensors& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(Close(got[i], want[i]))
          << "tensor " << i << " max |diff| " << (got[i] - want[i]).abs().max().item<float>();
    }
  }
  // A coordinator killed after round `round`'s checkpoint: every later checkpoint (and anything else) removed.
  void KeepOnlyCheckpointOfRound(int64_t round) const {
    const std::string keep = std::filesystem::path(CheckpointPath(config_.CheckpointDir(), round)).filename().string();
    for (const auto& entry : std::filesystem::directory_iterator(config_.CheckpointDir())) {
      if (entry.path().filename().string() != keep) std::filesystem::remove_all(entry.path());
    }
  }
  // `id`'s push for `round` computed against the theta of id `stale_id` is refused (another theta of that round);
  // against `current_id`, the coordinator's, it is admitted.
  void ExpectPushAgainstThetaIdRefused(const std::string& id, int64_t round, uint64_t stale_id, uint64_t current_id) {
    PushHeader stale = Header(id, round, 1000);
    stale.mutable_meta()->set_theta_id(stale_id);
    const absl::Status refused = core_->BeginPush(stale).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("computed against another theta of that round"));
    PushHeader fresh = Header(id, round, 1000);
    fresh.mutable_meta()->set_theta_id(current_id);
    EXPECT_TRUE(core_->BeginPush(fresh).ok());
  }
  static WorkerStatus Worker(const StatusReply& s, const std::string& id) {
    for (const WorkerStatus& w : s.workers()) {
      if (w.id() == id) return w;
    }
    ADD_FAILURE() << "no worker " << id << " in status";
    return WorkerStatus();
  }

  Config config_;
  std::atomic<double> now_{0.0};
  std::unique_ptr<CoordinatorCore> core_;
  CoordinatorCore* run_core_ = nullptr;
  std::thread run_thread_;
};

TEST_F(CoordinatorCoreTest, OneRoundAppliesNesterovToTokenWeightedAverage) {
  Start();
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), d2 = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 3000, d1).ok());
  ASSERT_TRUE(Push("B", 0, 1000, d2).ok());
  StartRun();
  ASSERT_TRUE(WaitForRound(1));
  int64_t round = -1;
  ExpectAllClose(Theta("A", &round), Step(theta0, Average({d1, d2}, {3000, 1000})));
  EXPECT_EQ(round, 1);
  const StatusReply s = core_->Status();
  EXPECT_EQ(s.round(), 1);
  EXPECT_EQ(s.bytes_received(), 4 * s.params() * 2);
  EXPECT_EQ(Worker(s, "A").rounds_contributed(), 1);
  EXPECT_EQ(Worker(s, "B").rounds_contributed(), 1);
  EXPECT_EQ(Worker(s, "A").tokens(), 3000);
  EXPECT_EQ(Worker(s, "B").tokens(), 1000);
  EXPECT_EQ(Worker(s, "A").bytes_pushed(), 4 * s.params());
}

// Synchronous rounds keep one copy of theta: the close steps the published tensors in place, so a snapshot pulled
// before it reads as stale afterwards (a pull in flight ends and the worker pulls again); asynchronous rounds publish
// immutable snapshots that stay readable.
TEST_F(CoordinatorCoreTest, SyncRoundsStepThetaInPlaceAndEarlierSnapshotsReadAsStale) {
  for (const OuterMode mode : {OuterMode::kSync, OuterMode::kAsync}) {
    config_.outer.mode = mode;
    Start();
    Join("A");
    Join("B");
    PullRequest r;
    *r.mutable_meta() = Meta("A");
    auto before = core_->BeginPull(r);
    ASSERT_TRUE(before.ok()) << before.status();
    int reads = 0;
    EXPECT_TRUE(ReadSnapshot(**before, [&] { ++reads; }));
    const at::Tensor theta0 = (*before)->params[0].second.clone();
    ASSERT_TRUE(Push("A", 0, 1000, RandomDelta()).ok());
    ASSERT_TRUE(Push("B", 0, 1000, RandomDelta()).ok());
    core_->Poll();
    if (mode == OuterMode::kAsync) core_->Poll();  // async: one version per push
    auto after = core_->BeginPull(r);
    ASSERT_TRUE(after.ok()) << after.status();
    ASSERT_GE((*after)->round, 1);
    EXPECT_TRUE(ReadSnapshot(**after, [&] { ++reads; }));
    const bool in_place = mode == OuterMode::kSync;
    EXPECT_EQ((*after)->params[0].second.data_ptr() == (*before)->params[0].second.data_ptr(), in_place);
    EXPECT_EQ(ReadSnapshot(**before, [&] { ++reads; }), !in_place) << "round 0's snapshot after the close";
    EXPECT_EQ(reads, in_place ? 2 : 3);
    EXPECT_EQ((*before)->params[0].second.equal(theta0), !in_place);
    core_.reset();
  }
}

TEST_F(CoordinatorCoreTest, DuplicatePushIsRefusedAndCountedOnce) {
  Start();
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), d2 = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 3000, d1).ok());
  EXPECT_EQ(Push("A", 0, 3000, d1).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(Push("B", 0, 1000, d2).ok());
  StartRun();
  ASSERT_TRUE(WaitForRound(1));
  ExpectAllClose(Theta(), Step(theta0, Average({d1, d2}, {3000, 1000})));
  EXPECT_EQ(Worker(core_->Status(), "A").rounds_contributed(), 1);
}

// Two streams from the same worker for the same round (a retry while the first stream is still open on the server):
// whichever way the core refuses the second, A's pseudo-gradient must weigh once in the average.
// (BeginPush refuses a second stream while the first is open, with Unavailable: the worker retries later.)
TEST_F(CoordinatorCoreTest, ConcurrentDuplicatePushIsCountedOnce) {
  Start();
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), d2 = RandomDelta();
  auto first = core_->BeginPush(Header("A", 0, 3000));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = core_->BeginPush(Header("A", 0, 3000));
  absl::Status s = second.status();
  for (size_t i = 0; i < d1.size(); ++i) {
    ASSERT_TRUE(FoldTensor(*first, i, d1[i]).ok());
    if (s.ok()) s = FoldTensor(*second, i, d1[i]);
  }
  ASSERT_TRUE(core_->CommitPush(*first).ok());
  if (s.ok()) s = core_->CommitPush(*second);
  EXPECT_FALSE(s.ok()) << "a second push from A for round 0 was accepted";
  if (second.ok()) core_->AbortPush(*second, "refused");  // what the service does with a refused stream
  if (!Beat("A").pushed()) ASSERT_TRUE(Push("A", 0, 3000, d1).ok());
  ASSERT_TRUE(Push("B", 0, 1000, d2).ok());
  StartRun();
  ASSERT_TRUE(WaitForRound(1));
  ExpectAllClose(Theta(), Step(theta0, Average({d1, d2}, {3000, 1000})));
}

// A round that times out while B's push has folded some chunks and is still making progress must not close over
// them: it waits for B's stream, and when that stream breaks, the aggregation restarts and the round closes on
// complete pushes only. A first break is forgiven: B is not quarantined.
TEST_F(CoordinatorCoreTest, RoundNeverClosesOverAPartiallyFoldedPushThatIsStillProgressing) {
  config_.coordinator.min_workers = 1;
  config_.coordinator.round_timeout_s = 100;
  config_.coordinator.lease_s = 10;
  Start();
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), partial = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 3000, d1).ok());
  now_ = 120;
  Beat("A");
  Beat("B");
  auto b = core_->BeginPush(Header("B", 0, 1000));
  ASSERT_TRUE(b.ok()) << b.status();
  now_ = 145;
  ASSERT_TRUE(FoldTensor(*b, 0, partial[0]).ok());  // half of B's push is in the sums, 5 s ago at the check
  Beat("A");
  Beat("B");
  now_ = 150;  // past round_timeout_s with min_workers pushes; B folded 5 s ago < lease_s
  StartRun();
  ASSERT_TRUE(WaitFor(
      [](const StatusReply& s) { return s.phase_reason().find("push stream(s) in flight") != std::string::npos; }));
  EXPECT_EQ(core_->Status().round(), 0) << "closed over a partial push";
  core_->AbortPush(*b, "stream broke");
  EXPECT_FALSE(Beat("A").pushed()) << "A's push was discarded with the sums: it must push again";
  const StatusReply after_break = core_->Status();
  for (const WorkerStatus& w : after_break.workers()) {
    if (w.id() == "B") EXPECT_EQ(w.broken_pushes(), 1);
    if (w.id() == "B") EXPECT_EQ(w.quarantined_until_round(), 0) << "a first break is forgiven";
  }
  ASSERT_TRUE(Push("A", 0, 3000, d1).ok());
  // The restart gives B min(lease_s, round_timeout_s) to push again before the timeout closes the round without it.
  ASSERT_TRUE(
      WaitFor([](const StatusReply& s) { return s.phase_reason().find("waiting for B") != std::string::npos; }));
  EXPECT_EQ(core_->Status().round(), 0);
  now_ = 158;
  Beat("A");
  Beat("B");
  now_ = 161;  // the restart at 150 + lease_s 10: B did not come back
  ASSERT_TRUE(WaitForRound(1));
  ExpectAllClose(Theta(), Step(theta0, d1));
}

// A push that folded some chunks and then went silent cannot hold a round past its timeout: the stream is cut as
// late (its next chunk is refused), the aggregation restarts once, its member is quarantined at once (its pushes
// are refused and no close waits for it), and the round closes on A's complete push.
TEST_F(CoordinatorCoreTest, AStalledPartialPushIsCutAtTheTimeoutAndItsMemberQuarantined) {
  config_.coordinator.min_workers = 1;
  config_.coordinator.round_timeout_s = 100;
  config_.coordinator.lease_s = 10;
  Start();
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), partial = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 3000, d1).ok());
  auto b = core_->BeginPush(Header("B", 0, 1000));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(FoldTensor(*b, 0, partial[0]).ok());  // then B's stream goes silent
  now_ = 150;
  Beat("A");
  Beat("B");  // B heartbeats: it is active, only its push stream stalls
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 0);
  EXPECT_FALSE(Beat("A").pushed()) << "the cut push had chunks in the sums: A pushes again";
  bool seen = false;
  const StatusReply after_cut = core_->Status();
  for (const WorkerStatus& w : after_cut.workers()) {
    if (w.id() != "B") continue;
    seen = true;
    EXPECT_EQ(w.broken_pushes(), 1);
    EXPECT_EQ(w.quarantined_until_round(), 1);
  }
  EXPECT_TRUE(seen);
  absl::Status late = FoldTensor(*b, 1, partial[1]);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("cut as late"));
  core_->AbortPush(*b, "refused");  // what the session does with a refused stream: no second restart
  absl::Status quarantined = Push("B", 0, 1000, partial);
  EXPECT_EQ(quarantined.code(), absl::StatusCode::kFailedPrecondition) << quarantined;
  EXPECT_THAT(std::string(quarantined.message()),
              HasSubstr("worker 'B' is quarantined through round 1 (1 broken pushes in a row, the last one stalled)"));
  EXPECT_EQ(Beat("B").quarantined_until_round(), 1) << "the heartbeat tells the worker to wait";
  EXPECT_EQ(Beat("A").quarantined_until_round(), 0);
  ASSERT_TRUE(Push("A", 0, 3000, d1).ok());
  core_->Poll();  // all unquarantined active members pushed
  EXPECT_EQ(core_->Status().round(), 1);
  ExpectAllClose(Theta(), Step(theta0, d1));
  EXPECT_EQ(Beat("B").quarantined_until_round(), 0) << "over at round 1";
  ASSERT_TRUE(Push("B", 1, 1000, partial).ok()) << "the quarantine ends at round 1";
}

TEST_F(CoordinatorCoreTest, LatePushIsRefusedAndLeavesNoTrace) {
  config_.coordinator.min_workers = 1;
  config_.coordinator.round_timeout_s = 100;
  Start();
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), d2 = RandomDelta(), late = RandomDelta();
  auto in_flight = core_->BeginPush(Header("B", 0, 1000));  // B starts streaming, then the round times out
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  ASSERT_TRUE(Push("A", 0, 3000, d1).ok());
  StartRun();
  now_ = 150;
  ASSERT_TRUE(WaitForRound(1));
  const Tensors theta1 = Theta();
  ExpectAllClose(theta1, Step(theta0, d1));

  absl::Status s = FoldTensor(*in_flight, 0, late[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(core_->CommitPush(*in_flight).code(), absl::StatusCode::kFailedPrecondition);
  s = Push("B", /*round=*/0, 1000, late);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("push for round 1 refused: the coordinator's round is 2"));
  ExpectAllClose(Theta(), theta1);

  // Round 2 (A alone, by timeout) must see only A's round-1 push, no leftover of the late chunks.
  ASSERT_TRUE(Push("A", 1, 3000, d2).ok());
  now_ = 300;
  ASSERT_TRUE(WaitForRound(2));
  ExpectAllClose(Theta(), Step(theta1, d2, /*prev_buf=*/d1));
}

TEST_F(CoordinatorCoreTest, BrokenPushRestartsAggregationAndLeavesNoTrace) {
  Start();
  Join("A");
  Join("B");
  Join("C");
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 3000, dA).ok());
  EXPECT_TRUE(Beat("A").pushed());
  auto stale = core_->BeginPush(Header("C", 0, 500));  // begun before the abort
  ASSERT_TRUE(stale.ok()) << stale.status();
  auto broken = core_->BeginPush(Header("B", 0, 1000));
  ASSERT_TRUE(broken.ok()) << broken.status();
  const Tensors garbage = RandomDelta();
  for (size_t i = 0; i < core_->specs().size() / 2; ++i) ASSERT_TRUE(FoldTensor(*broken, i, garbage[i] * 100).ok());
  ASSERT_TRUE(FoldTensor(*broken, core_->specs().size() / 2, garbage.back(), /*only_first_half=*/true).ok());
  core_->AbortPush(*broken, "test");

  EXPECT_FALSE(Beat("A").pushed()) << "A's push was discarded with the aggregation: it must push again";
  absl::Status s = FoldTensor(*stale, 0, garbage[0]);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(core_->CommitPush(*stale).code(), absl::StatusCode::kAborted);
  LeaveRequest leave;
  *leave.mutable_meta() = Meta("C");
  ASSERT_TRUE(core_->Leave(leave).ok());

  ASSERT_TRUE(Push("A", 0, 3000, dA).ok());
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  StartRun();
  ASSERT_TRUE(WaitForRound(1));
  ExpectAllClose(Theta(), Step(theta0, Average({dA, dB}, {3000, 1000})));
  const StatusReply status = core_->Status();
  EXPECT_EQ(Worker(status, "A").rounds_contributed(), 1);
  EXPECT_EQ(Worker(status, "A").tokens(), 3000) << "the discarded first push must not be credited";
  EXPECT_EQ(Worker(status, "C").rounds_contributed(), 0);
}

TEST_F(CoordinatorCoreTest, NonFinitePseudoGradientIsRefused) {
  config_.coordinator.min_workers = 1;
  Start();
  Join("A");
  const Tensors theta0 = Theta();
  const Tensors d = RandomDelta();
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    auto t = core_->BeginPush(Header("A", 0, 1000));
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(FoldTensor(*t, 0, d[0]).ok());
    at::Tensor poisoned = d[1].clone().reshape({-1});
    poisoned[poisoned.numel() - 1] = bad;
    absl::Status s = FoldTensor(*t, 1, poisoned);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(core_->specs()[1].name));
    core_->AbortPush(*t, "refused");
  }
  // Two refusals after folding in a row: A is quarantined for a round (round_policy.h QuarantineRounds).
  const Tensors clean = RandomDelta();
  absl::Status quarantined = Push("A", 0, 1000, clean);
  EXPECT_EQ(quarantined.code(), absl::StatusCode::kFailedPrecondition) << quarantined;
  Join("C");
  ASSERT_TRUE(Push("C", 0, 1000, clean).ok());
  StartRun();
  ASSERT_TRUE(WaitForRound(1));
  ExpectAllClose(Theta(), Step(theta0, clean));
}

// HeartbeatRequest.wait_ms (held_heartbeats.h): a worker whose push is counted is answered when its answer changes
// (the round closed, its push was discarded) or at the deadline, not at once; driven by Poll, no round thread.
TEST_F(CoordinatorCoreTest, AHeldHeartbeatIsAnsweredWhenItsAnswerChangesOrAtItsDeadline) {
  Start();
  Join("A");
  Join("B");
  std::vector<absl::StatusOr<HeartbeatReply>> answers;
  auto beat = [&](const std::string& id, int64_t round, int64_t wait_ms) {
    HeartbeatRequest r;
    *r.mutable_meta() = Meta(id, round);
    r.set_wait_ms(wait_ms);
    core_->Heartbeat(r, [&answers](absl::StatusOr<HeartbeatReply> a) { answers.push_back(std::move(a)); });
  };
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  beat("A", 0, 5000);  // A has not pushed: nothing to wait for, answered at once
  ASSERT_EQ(answers.size(), 1u);
  ASSERT_TRUE(answers[0].ok()) << answers[0].status();
  EXPECT_FALSE(answers[0]->pushed());

  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  beat("A", 0, 5000);
  EXPECT_EQ(answers.size(), 1u) << "A's push is counted and round 1 is open: the answer is held";
  EXPECT_EQ(core_->held_heartbeats(), 1u);
  beat("A", 0, 5000);  // one held heartbeat per worker: the older one is answered now, unchanged
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[1]->round(), 0);
  EXPECT_TRUE(answers[1]->pushed());
  beat("A", 1, 5000);  // a worker that thinks another round is open is answered at once
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[2]->round(), 0);
  core_->Poll();  // nothing changed and no deadline passed
  EXPECT_EQ(answers.size(), 3u);
  EXPECT_EQ(core_->held_heartbeats(), 1u);

  // B's push breaks off after folding a chunk: the aggregation restarts and A must push again.
  auto broken = core_->BeginPush(Header("B", 0, 1000));
  ASSERT_TRUE(broken.ok()) << broken.status();
  ASSERT_TRUE(FoldTensor(*broken, 0, dB[0], /*only_first_half=*/true).ok());
  core_->AbortPush(*broken, "test");
  core_->Poll();
  ASSERT_EQ(answers.size(), 4u);
  EXPECT_EQ(answers[3]->round(), 0);
  EXPECT_FALSE(answers[3]->pushed()) << "the held answer changed: push again";

  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  beat("A", 0, 5000);
  EXPECT_EQ(answers.size(), 4u);
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();  // closes round 1: the held answer goes out with it
  ASSERT_EQ(answers.size(), 5u);
  EXPECT_EQ(answers[4]->round(), 1);
  EXPECT_EQ(core_->held_heartbeats(), 0u);

  // The deadline: wait_ms is capped at kMaxHeartbeatHoldMs; the answer is then the unchanged one.
  ASSERT_TRUE(Push("A", 1, 1000, dA).ok());
  beat("A", 1, 1000000);
  now_ = now_ + 0.5 * static_cast<double>(kMaxHeartbeatHoldMs) / 1000;
  core_->Poll();
  EXPECT_EQ(answers.size(), 5u);
  now_ = now_ + static_cast<double>(kMaxHeartbeatHoldMs) / 1000;
  core_->Poll();
  ASSERT_EQ(answers.size(), 6u);
  EXPECT_EQ(answers[5]->round(), 1);
  EXPECT_TRUE(answers[5]->pushed());

  // Stop answers what it holds, and holds nothing after.
  beat("A", 1, 5000);
  EXPECT_EQ(answers.size(), 6u);
  core_->Stop();
  ASSERT_EQ(answers.size(), 7u);
  EXPECT_EQ(answers[6]->round(), 1);
  beat("A", 1, 5000);
  EXPECT_EQ(answers.size(), 8u);
  EXPECT_EQ(core_->held_heartbeats(), 0u);
}

TEST_F(CoordinatorCoreTest, RefusesWrongFingerprintModelAndUnknownWorker) {
  Start();
  JoinRequest bad_fp = JoinReq("A");
  bad_fp.mutable_meta()->set_fingerprint("0000000000000000");
  EXPECT_EQ(core_->Join(bad_fp).status().code(), absl::StatusCode::kFailedPrecondition);
  JoinRequest bad_model = JoinReq("A");
  bad_model.mutable_model()->set_d_model(32);
  auto refused = core_->Join(bad_model);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("model.d_model"));
  // Settings the fingerprint cannot see (the tensors' shapes are the same): a worker whose rope scaling or sliding
  // window differs would train another model; each differing key is named.
  JoinRequest yarn = JoinReq("A");
  yarn.mutable_model()->set_rope_type("yarn");
  yarn.mutable_model()->set_rope_factor(4);
  auto rope = core_->Join(yarn);
  EXPECT_EQ(rope.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(rope.status().message()),
              HasSubstr("model.rope_type: worker has yarn, coordinator has default"));
  EXPECT_THAT(std::string(rope.status().message()), HasSubstr("model.rope_factor: worker has 4, coordinator has 1"));
  JoinRequest window = JoinReq("A");
  window.mutable_model()->set_rope_type("default");  // says the new fields (a client without them is not checked)
  window.mutable_model()->set_sliding_window(8);
  auto windowed = core_->Join(window);
  EXPECT_EQ(windowed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(windowed.status().message()),
              HasSubstr("model.sliding_window: worker has 8, coordinator has 0"));
  EXPECT_TRUE(core_->Status().workers().empty()) << "a refused join must not add a member";
  JoinRequest full = JoinReq("A");  // every field as a real worker sends it (config/model_spec.h)
  *full.mutable_model() = ModelSpecOf(config_.model);
  EXPECT_TRUE(core_->Join(full).ok());

  Join("A");
  HeartbeatRequest beat;
  *beat.mutable_meta() = Meta("A");
  beat.mutable_meta()->set_fingerprint("0000000000000000");
  EXPECT_EQ(core_->Heartbeat(beat).status().code(), absl::StatusCode::kFailedPrecondition);
  *beat.mutable_meta() = Meta("nobody");
  EXPECT_EQ(core_->Heartbeat(beat).status().code(), absl::StatusCode::kNotFound);
  Beat("A");  // the same heartbeat with the right fingerprint is accepted (Beat expects OK)
}

// The Join reply and the status carry the run settings a foreign client needs (proto/PROTOCOL.md "Run settings"),
// taken from the config: values set away from their defaults here, so a reply left at defaults fails.
TEST_F(CoordinatorCoreTest, JoinReplyAndStatusCarryRunSettings) {
  config_.coordinator.lease_s = 7.5;
  config_.coordinator.heartbeat_interval_s = 0.25;
  config_.comm.chunk_bytes = 4096;
  config_.inner.steps = 12;
  config_.workers.count = 2;
  Start();
  auto reply = core_->Join(JoinReq("A"));
  ASSERT_TRUE(reply.ok()) << reply.status();
  const StatusReply status = core_->Status();
  for (const auto& [what, lease, max_message, chunk, inner, model] :
       {std::make_tuple("join", reply->lease_ms(), reply->max_message_bytes(), reply->chunk_bytes(),
                        reply->inner_steps(), reply->model()),
        std::make_tuple("status", status.lease_ms(), status.max_message_bytes(), status.chunk_bytes(),
                        status.inner_steps(), status.model())}) {
    SCOPED_TRACE(what);
    EXPECT_EQ(lease, 7500);
    EXPECT_EQ(max_message, 4096 + (1 << 20));
    EXPECT_EQ(chunk, 4096);
    EXPECT_EQ(inner, 12);
    EXPECT_EQ(model.vocab_size(), 64);
    EXPECT_EQ(model.seq_len(), 16);
    EXPECT_EQ(model.n_layer(), 1);
    EXPECT_EQ(model.n_head(), 2);
    EXPECT_EQ(model.d_model(), 16);
    EXPECT_EQ(model.arch(), "gpt");
    EXPECT_EQ(model.n_kv_head(), 2);       // defaults resolved: n_head
    EXPECT_EQ(model.ffn_hidden(), 64);     // 4 x d_model
    EXPECT_EQ(model.max_positions(), 16);  // seq_len
    EXPECT_EQ(model.rope_theta(), config_.model.rope_theta);
    EXPECT_EQ(model.norm_eps(), config_.model.norm_eps);
    EXPECT_FALSE(model.untied_head());
  }
  EXPECT_EQ(reply->fragments(), 1);
  EXPECT_EQ(reply->heartbeat_interval_ms(), 250);
  EXPECT_EQ(status.heartbeat_interval_ms(), 250);
  // The declared model a client copies from the reply is accepted as is.
  JoinRequest again = JoinReq("B");
  *again.mutable_model() = reply->model();
  auto b = core_->Join(again);
  ASSERT_TRUE(b.ok()) << b.status();
  // More members than workers.count (shards): the third shares shard 0 as its second reader, in status too.
  EXPECT_EQ(reply->shard_reader(), 0);
  EXPECT_EQ(b->shard_reader(), 0);
  auto c = core_->Join(JoinReq("C"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shard_index(), 0);
  EXPECT_EQ(c->shard_reader(), 1);
  const StatusReply after = core_->Status();
  ASSERT_EQ(after.workers_size(), 3);
  for (const WorkerStatus& w : after.workers()) EXPECT_EQ(w.shard_reader(), w.id() == "C" ? 1 : 0) << w.id();
}

TEST_F(CoordinatorCoreTest, LeaseExpiryMarksSilentMemberLostAndClosesRound) {
  config_.coordinator.min_workers = 1;
  config_.coordinator.lease_s = 5;
  Start();
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors d = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 3000, d).ok());
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(200);
  spdlog::default_logger()->sinks().push_back(log);
  StartRun();
  EXPECT_TRUE(WaitFor([](const StatusReply& s) { return absl::StrContains(s.phase_reason(), "waiting for B"); }));
  now_ = 4;
  Beat("A");
  now_ = 6;  // B silent for 6 s > lease_s 5; A for 2 s
  const bool closed = WaitForRound(1);
  StopRun();
  spdlog::default_logger()->sinks().pop_back();
  ASSERT_TRUE(closed);
  const StatusReply s = core_->Status();
  EXPECT_EQ(Worker(s, "A").state(), "active");
  EXPECT_EQ(Worker(s, "B").state(), "lost");
  EXPECT_EQ(Worker(s, "B").rounds_contributed(), 0);
  bool logged = false;
  for (const std::string& line : log->last_formatted()) logged |= line.find("all 1 active members pushed") != line.npos;
  EXPECT_TRUE(logged) << "round 1 should close because every remaining active member pushed";
  ExpectAllClose(Theta(), Step(theta0, d));
}

TEST_F(CoordinatorCoreTest, DrainIsSeenInHeartbeat) {
  Start();
  Join("A");
  Join("B");
  EXPECT_FALSE(Beat("A").drain());
  ASSERT_TRUE(core_->Drain("A").ok());
  EXPECT_TRUE(Beat("A").drain());
  EXPECT_FALSE(Beat("B").drain());
  EXPECT_EQ(core_->Drain("nobody").code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorCoreTest, CheckpointNowAndResumeRestoreThetaMomentumAndEvals) {
  config_.coordinator.min_workers = 1;
  config_.coordinator.eval_every = 1;
  Start();
  Join("A");
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), d2 = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 1000, d1).ok());
  StartRun();
  ASSERT_TRUE(WaitForRound(1));
  ASSERT_TRUE(WaitFor([](const StatusReply& s) { return s.evals_size() == 2; }));
  StopRun();
  const Tensors theta1 = Theta();
  const StatusReply before = core_->Status();

  auto written = core_->CheckpointNow();
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->round, 1);
  auto loaded = LoadCheckpoint(written->path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->round, 1);
  EXPECT_EQ(loaded->fingerprint, core_->fingerprint());
  ASSERT_EQ(loaded->params.size(), theta1.size());
  for (size_t i = 0; i < theta1.size(); ++i) EXPECT_TRUE(loaded->params[i].second.equal(theta1[i])) << i;
  ASSERT_EQ(loaded->momentum.size(), theta1.size());
  for (size_t i = 0; i < theta1.size(); ++i) EXPECT_TRUE(Close(loaded->momentum[i], d1[i])) << "buf = delta, " << i;

  core_ = MakeCore(/*resume=*/true);
  ASSERT_NE(core_, nullptr);
  const StatusReply after = core_->Status();
  EXPECT_EQ(after.round(), 1);
  ASSERT_EQ(after.evals_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(after.evals(i).round(), before.evals(i).round());
    EXPECT_EQ(after.evals(i).val_loss(), before.evals(i).val_loss());
  }
  Join("A");
  const Tensors resumed = Theta();
  ASSERT_EQ(resumed.size(), theta1.size());
  for (size_t i = 0; i < theta1.size(); ++i) EXPECT_TRUE(resumed[i].equal(theta1[i])) << i;
  // Momentum: the next step must continue the first one's buffer (a lost buffer gives Step(theta1, d2)).
  ASSERT_TRUE(Push("A", 1, 1000, d2).ok());
  StartRun();
  ASSERT_TRUE(WaitForRound(2));
  ExpectAllClose(Theta(), Step(theta1, d2, /*prev_buf=*/d1));
}

// Members survive a coordinator restart (kill -9, started again on the same config): the checkpoint keeps the active
// members and which of their pushes counted. A resend of a push the checkpointed round counted is ALREADY_EXISTS
// (async would apply it a second time; sync workers would roll their error feedback back), a member that lives
// heartbeats on without joining again, and a round waits for every restored member as before the restart, until one
// is silent for lease_s (min_workers 1 here: before, the first member to join again closed the round alone while
// the other was still training). Started on a changed config, the members must join again, keeping their records,
// also across a second restart before they joined (checkpoint version 4 keeps lost members: before, the checkpoint
// of the first restart held active members only, none, and the second one forgot A's counted pushes).
TEST_F(CoordinatorCoreTest, MembersAndTheirCountedPushesSurviveARestart) {
  config_.coordinator.min_workers = 1;
  config_.coordinator.lease_s = 10;
  Tensors dA, dB;
  ASSERT_NO_FATAL_FAILURE(CloseRoundOneWithAB(&dA, &dB));
  const int shard_b = Worker(core_->Status(), "B").shard_index();
  ASSERT_TRUE(core_->CheckpointNow().ok());

  core_ = MakeCore(/*resume=*/true);  // the same config: A and B are members still
  ASSERT_NE(core_, nullptr);
  EXPECT_EQ(core_->Status().round(), 1);
  EXPECT_EQ(Worker(core_->Status(), "B").state(), "active");
  EXPECT_EQ(Worker(core_->Status(), "B").shard_index(), shard_b);
  const absl::Status resent = Push("A", 0, 1000, dA);
  EXPECT_EQ(resent.code(), absl::StatusCode::kAlreadyExists) << resent;
  Beat("B");  // no NOT_FOUND: B heartbeats on as before
  ASSERT_TRUE(Push("A", 1, 1000, dA).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 1) << "round 2 must wait for B, a member before the restart";
  now_ = now_ + 11;  // B silent past its lease from the restart: lost, and the round closes with A
  Beat("A");
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 2);
  EXPECT_EQ(Worker(core_->Status(), "B").state(), "lost");
  ASSERT_TRUE(core_->CheckpointNow().ok());

  config_.outer.rounds += 1;  // a changed config (more rounds): the members must join again
  core_ = MakeCore(/*resume=*/true);
  ASSERT_NE(core_, nullptr);
  EXPECT_EQ(Worker(core_->Status(), "A").state(), "lost");
  ASSERT_TRUE(core_->CheckpointNow().ok());  // before anyone joined again
  config_.outer.rounds += 1;                 // and again changed
  core_ = MakeCore(/*resume=*/true);
  ASSERT_NE(core_, nullptr);
  EXPECT_EQ(Worker(core_->Status(), "A").state(), "lost");
  EXPECT_EQ(Worker(core_->Status(), "B").shard_index(), shard_b);
  HeartbeatRequest beat;
  *beat.mutable_meta() = Meta("A");
  EXPECT_EQ(core_->Heartbeat(beat).status().code(), absl::StatusCode::kNotFound);
  Join("A");
  EXPECT_EQ(Push("A", 1, 1000, dA).code(), absl::StatusCode::kAlreadyExists) << "its record stands";
}

// The run's totals and each member's contributions go on from the checkpoint (version 5), whatever the evaluations:
// here eval_every 0 (there are none). Before, tokens and bytes came back only from an evaluation record of the
// checkpoint's round, the data-parallel figure and the members' rounds, tokens and bytes never: summary.json of a run
// restarted once showed rounds_contributed 34 of 40 and a data-parallel ratio off by as much.
TEST_F(CoordinatorCoreTest, RunTotalsAndContributionsSurviveARestart) {
  config_.coordinator.eval_every = 0;
  Tensors dA, dB;
  ASSERT_NO_FATAL_FAILURE(CloseRoundOneWithAB(&dA, &dB));
  const StatusReply before = core_->Status();
  ASSERT_GT(before.dp_equivalent_bytes(), 0);
  ASSERT_GT(before.bytes_pushed_committed(), 0);
  ASSERT_EQ(Worker(before, "A").rounds_contributed(), 1);
  ASSERT_TRUE(core_->CheckpointNow().ok());

  core_ = MakeCore(/*resume=*/true);
  ASSERT_NE(core_, nullptr);
  const StatusReply after = core_->Status();
  EXPECT_EQ(after.round(), 1);
  EXPECT_EQ(after.dp_equivalent_bytes(), before.dp_equivalent_bytes());
  EXPECT_EQ(after.bytes_pushed_committed(), before.bytes_pushed_committed());
  for (const char* id : {"A", "B"}) {
    EXPECT_EQ(Worker(after, id).rounds_contributed(), 1) << id;
    EXPECT_EQ(Worker(after, id).tokens(), Worker(before, id).tokens()) << id;
    EXPECT_EQ(Worker(after, id).bytes_pushed(), Worker(before, id).bytes_pushed()) << id;
  }
}

// A coordinator killed after publishing round 2 but before its checkpoint resumes from round 1 and steps round 2
// again, to another theta under the same number. A worker that pulled the first theta_2 (and slept past its lease,
// so that the round went on without it) pushes "round 2": its pseudo-gradient is against a theta this coordinator
// never had. Each theta carries an id (PullHeader.theta_id, kept in checkpoints) that pushes echo
// (RequestMeta.theta_id): that push is refused, so the worker pulls. Before, round numbers alone matched it.
TEST_F(CoordinatorCoreTest, APushAgainstAThetaOfItsRoundFromBeforeARestartIsRefused) {
  config_.coordinator.min_workers = 1;
  Start();
  Join("A");
  ASSERT_TRUE(Push("A", 0, 1000, RandomDelta()).ok());
  core_->Poll();
  ASSERT_TRUE(core_->CheckpointNow().ok());  // round 1 on disk
  ASSERT_TRUE(Push("A", 1, 1000, RandomDelta()).ok());
  core_->Poll();
  PullRequest pull;
  *pull.mutable_meta() = Meta("A");
  auto first = core_->BeginPull(pull);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ((*first)->round, 2);
  const uint64_t first_id = (*first)->id;
  EXPECT_NE(first_id, 0u);
  first->reset();
  KeepOnlyCheckpointOfRound(1);  // killed before the checkpoint of round 2

  core_ = MakeCore(/*resume=*/true);
  ASSERT_NE(core_, nullptr);
  ASSERT_EQ(core_->Status().round(), 1);
  ASSERT_TRUE(Push("A", 1, 1000, RandomDelta()).ok());  // round 2 again, to another theta
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 2);
  auto second = core_->BeginPull(pull);
  ASSERT_TRUE(second.ok()) << second.status();
  const uint64_t second_id = (*second)->id;
  second->reset();
  EXPECT_NE(second_id, first_id);
  Join("B");
  ExpectPushAgainstThetaIdRefused("B", 2, /*stale_id=*/first_id, /*current_id=*/second_id);
}

// Async takes pushes against the last max_staleness versions, so the checkpoint (version 4) keeps their theta ids:
// after a second restart a push against a version the first restart stepped again is still refused. Version 2 is
// stepped (id x) and the coordinator killed before its checkpoint; the first restart resumes version 1, steps 2
// again (id y) and 3, and checkpoints 3; the second restart resumes version 3. A push against version 2 with id x (a
// worker that pulled before the kill) is refused, one with y is taken. Before, the second restart knew version 3's
// id only and took both.
TEST_F(CoordinatorCoreTest, AsyncThetaIdsWithinTheStalenessBoundSurviveTwoRestarts) {
  config_.outer.mode = OuterMode::kAsync;
  config_.outer.max_staleness = 3;
  config_.coordinator.min_workers = 1;
  Start();
  Join("A");
  PullRequest pull;
  *pull.mutable_meta() = Meta("A");
  auto step = [&](int64_t base) {  // one version per push
    ASSERT_TRUE(Push("A", base, 1000, RandomDelta()).ok());
    core_->Poll();
  };
  auto current_id = [&](int64_t round) {
    auto theta = core_->BeginPull(pull);
    EXPECT_TRUE(theta.ok()) << theta.status();
    if (!theta.ok()) return uint64_t{0};
    EXPECT_EQ((*theta)->round, round);
    return (*theta)->id;
  };
  ASSERT_NO_FATAL_FAILURE(step(0));
  ASSERT_TRUE(core_->CheckpointNow().ok());  // version 1 on disk
  ASSERT_NO_FATAL_FAILURE(step(1));
  const uint64_t x = current_id(2);
  KeepOnlyCheckpointOfRound(1);  // killed before the checkpoint of round 2

  core_ = MakeCore(/*resume=*/true);
  ASSERT_NE(core_, nullptr);
  ASSERT_NO_FATAL_FAILURE(step(1));
  const uint64_t y = current_id(2);
  ASSERT_NE(x, y);
  ASSERT_NO_FATAL_FAILURE(step(2));
  ASSERT_EQ(core_->Status().round(), 3);
  ASSERT_TRUE(core_->CheckpointNow().ok());

  core_ = MakeCore(/*resume=*/true);
  ASSERT_NE(core_, nullptr);
  ASSERT_EQ(core_->Status().round(), 3);
  Join("B");
  ExpectPushAgainstThetaIdRefused("B", 2, /*stale_id=*/x, /*current_id=*/y);
}

// The phase in heartbeats and Status is RoundPhase's name (proto/round_phase.h): training while the round is open,
// complete after the last round; the evaluator handed to Create is called on theta_0 and on each new theta.
TEST_F(CoordinatorCoreTest, PhasesAndEvaluationsOfAOneRoundRun) {
  config_.outer.rounds = 1;
  config_.coordinator.min_workers = 1;
  config_.coordinator.eval_every = 1;
  Start();
  Join("A");
  EXPECT_EQ(Beat("A").phase(), "training");
  EXPECT_EQ(core_->Status().phase(), "training");
  const Tensors theta0 = Theta();
  ASSERT_TRUE(Push("A", 0, 1000, RandomDelta()).ok());
  core_->Poll();
  const HeartbeatReply beat = Beat("A");
  EXPECT_TRUE(beat.run_complete());
  EXPECT_EQ(beat.phase(), "complete");
  const StatusReply s = core_->Status();
  EXPECT_EQ(s.phase(), "complete");
  EXPECT_EQ(s.round(), 1);
  auto sum_of_squares = [](const Tensors& theta) {
    NamedTensors named;
    for (const at::Tensor& t : theta) named.emplace_back("t", t);
    return SumOfSquaresEvaluator().Evaluate(named);
  };
  ASSERT_EQ(s.evals_size(), 2);
  EXPECT_DOUBLE_EQ(s.evals(0).val_loss(), sum_of_squares(theta0));
  EXPECT_DOUBLE_EQ(s.evals(1).val_loss(), sum_of_squares(Theta()));
  EXPECT_NE(s.evals(0).val_loss(), s.evals(1).val_loss());
}

// Streaming DiLoCo on the coordinator: round t takes only fragment t mod 2's tensors, steps only them (the other
// fragment's tensors stay as they were), and refuses a worker with another comm.fragments or a push of the wrong
// fragment.
TEST_F(CoordinatorCoreTest, FragmentRoundsStepOnlyTheirFragment) {
  config_.comm.fragments = 2;
  Start();
  JoinRequest plain = JoinReq("A");  // fragments unset: read as 1
  auto refused = core_->Join(plain);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("comm.fragments"));
  for (const std::string id : {"A", "B"}) {
    JoinRequest r = JoinReq(id);
    r.set_fragments(2);
    ASSERT_TRUE(core_->Join(r).ok()) << id;
  }
  ASSERT_EQ(core_->fragments(), 2);
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), d2 = RandomDelta();

  PushHeader wrong = Header("A", 0, 100);
  wrong.set_fragment(1);
  auto bad = core_->BeginPush(wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("fragment 0"));

  auto push_fragment = [&](const std::string& id, int64_t round, int fragment, int64_t tokens, const Tensors& d) {
    PushHeader h = Header(id, round, tokens);
    h.set_fragment(fragment);
    auto ticket = core_->BeginPush(h);
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    for (size_t i : core_->fragment_members(fragment)) ASSERT_TRUE(FoldTensor(*ticket, i, d[i]).ok());
    ASSERT_TRUE(core_->CommitPush(*ticket).ok());
  };
  push_fragment("A", 0, 0, 3000, d1);
  push_fragment("B", 0, 0, 1000, d2);
  StartRun();
  ASSERT_TRUE(WaitForRound(1));
  const Tensors theta1 = Theta();
  const Tensors stepped = Step(theta0, Average({d1, d2}, {3000, 1000}));
  std::vector<bool> in_fragment0(theta0.size(), false);
  for (size_t i : core_->fragment_members(0)) in_fragment0[i] = true;
  for (size_t i = 0; i < theta0.size(); ++i) {
    if (in_fragment0[i]) {
      EXPECT_TRUE(Close(theta1[i], stepped[i])) << "fragment 0 tensor " << i << " not stepped";
    } else {
      EXPECT_TRUE(theta1[i].equal(theta0[i])) << "fragment 1 tensor " << i << " changed in a fragment-0 round";
    }
  }
  // Round 2 syncs fragment 1: its first outer step (no momentum yet), fragment 0 untouched.
  push_fragment("A", 1, 1, 1000, d2);
  push_fragment("B", 1, 1, 1000, d2);
  ASSERT_TRUE(WaitForRound(2));
  const Tensors theta2 = Theta();
  const Tensors stepped_b = Step(theta1, d2);
  for (size_t i = 0; i < theta0.size(); ++i) {
    if (in_fragment0[i]) {
      EXPECT_TRUE(theta2[i].equal(theta1[i])) << "fragment 0 tensor " << i << " changed in a fragment-1 round";
    } else {
      EXPECT_TRUE(Close(theta2[i], stepped_b[i])) << "fragment 1 tensor " << i;
    }
  }
  EXPECT_EQ(core_->Status().fragments(), 2);
  EXPECT_EQ(core_->Status().rounds_total(), 2 * config_.outer.rounds);
}

// outer.mode async: every push is applied when it arrives, with Delayed Nesterov (N = 2 here), against whatever
// version is current; a push computed more than outer.max_staleness versions ago is refused with a reason, and a
// refused push changes nothing.
TEST_F(CoordinatorCoreTest, AsyncAppliesEachPushWithDelayedNesterovAndRefusesStalePushes) {
  StartAsyncAB(/*max_staleness=*/1);
  const Tensors theta0 = Theta();
  const Tensors d1 = RandomDelta(), d2 = RandomDelta(), d3 = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 1000, d1).ok());
  core_->Poll();  // version 1: theta0 - (lr / N) d1, no momentum move yet
  int64_t round = -1;
  Tensors want1;
  for (size_t i = 0; i < theta0.size(); ++i) want1.push_back(theta0[i] - kLr / 2 * d1[i]);
  ExpectAllClose(Theta("A", &round), want1);
  EXPECT_EQ(round, 1);
  // B computed against version 0: one version behind, accepted and applied to version 1 (the second arrival moves
  // the momentum: m = (d1 + d2) / 2; theta -= lr beta m + (lr / N) d2).
  ASSERT_TRUE(Push("B", 0, 1000, d2).ok());
  core_->Poll();
  Tensors want2;
  for (size_t i = 0; i < theta0.size(); ++i) {
    const at::Tensor m = (d1[i] + d2[i]) / 2;
    want2.push_back(want1[i] - kLr * kMu * m - kLr / 2 * d2[i]);
  }
  ExpectAllClose(Theta("A", &round), want2);
  EXPECT_EQ(round, 2);
  // A push of C (which joined late and pushes its first) against version 0 is now 2 behind: refused, naming the
  // staleness; nothing changes. (A's or B's against version 0 would be the resend of an applied push.)
  Join("C");
  const absl::Status stale = Push("C", 0, 1000, d3);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.message()),
              HasSubstr("push computed against version 0 refused: the global model is at version 2 (2 behind; "
                        "outer.max_staleness is 1)"));
  core_->Poll();
  ExpectAllClose(Theta("A", &round), want2);
  EXPECT_EQ(round, 2);
  EXPECT_EQ(core_->Status().rounds_total(), config_.outer.rounds * 2);  // async: outer.rounds x workers.count pushes
}

// outer.mode async accepts pushes up to max_staleness old, so the resend of an applied push (its reply lost, a
// rejoin) is refused as already counted instead of being applied a second time; the version stays. A stale push's
// heartbeat (its round is the version it was computed against, older than the open one) is held while the push is
// pending, and answered when it is applied. Before, the resend made version 2 and the heartbeat was answered at once.
TEST_F(CoordinatorCoreTest, AsyncRefusesTheResendOfAnAppliedPushAndHoldsAStalePushsHeartbeat) {
  StartAsyncAB(/*max_staleness=*/4);
  const Tensors d1 = RandomDelta(), d2 = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 1000, d1).ok());
  core_->Poll();
  int64_t round = -1;
  const Tensors theta1 = Theta("A", &round);
  ASSERT_EQ(round, 1);
  const absl::Status resent = Push("A", 0, 1000, d1);
  EXPECT_EQ(resent.code(), absl::StatusCode::kAlreadyExists) << resent;
  EXPECT_THAT(std::string(resent.message()), HasSubstr("push computed against version 0 was applied already"));
  core_->Poll();
  ExpectAllClose(Theta("A", &round), theta1);
  EXPECT_EQ(round, 1);
  EXPECT_EQ(Worker(core_->Status(), "A").rounds_contributed(), 1);

  // B's push against version 0 is one behind: pending in version 2, its heartbeat (round 0) is held until applied.
  auto push = core_->BeginPush(Header("B", 0, 1000));
  ASSERT_TRUE(push.ok()) << push.status();
  for (size_t i = 0; i < d2.size(); ++i) ASSERT_TRUE(FoldTensor(*push, i, d2[i]).ok());
  ASSERT_TRUE(core_->CommitPush(*push).ok());
  std::vector<absl::StatusOr<HeartbeatReply>> answers;
  HeartbeatRequest beat;
  *beat.mutable_meta() = Meta("B", 0);
  beat.set_wait_ms(5000);
  core_->Heartbeat(beat, [&answers](absl::StatusOr<HeartbeatReply> a) { answers.push_back(std::move(a)); });
  EXPECT_EQ(answers.size(), 0u);
  EXPECT_EQ(core_->held_heartbeats(), 1u);
  core_->Poll();  // applies B's push: version 2, the held answer goes out
  ASSERT_EQ(answers.size(), 1u);
  ASSERT_TRUE(answers[0].ok()) << answers[0].status();
  EXPECT_EQ(answers[0]->round(), 2);
  EXPECT_FALSE(answers[0]->pushed());
  EXPECT_EQ(Push("B", 0, 1000, d2).code(), absl::StatusCode::kAlreadyExists);
}

// Async: a pending push dropped by an aggregation restart (another push broke mid-stream) reads as not pending; once a
// later push steps the version, the round moved past the dropped push's base too. The heartbeat's last_applied_base
// (the base of the member's newest applied push) tells the two apart: the worker pushes again (protocol_decision.h).
// Before, "not pending and the version moved on" read as applied and the worker's round of work was lost.
TEST_F(CoordinatorCoreTest, AsyncHeartbeatTellsADroppedPushFromAnAppliedOne) {
  StartAsyncAB(/*max_staleness=*/4);
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());  // pending
  EXPECT_TRUE(Beat("A").pushed());
  auto broken = core_->BeginPush(Header("B", 0, 1000));
  ASSERT_TRUE(broken.ok()) << broken.status();
  ASSERT_TRUE(FoldTensor(*broken, 0, dB[0]).ok());
  core_->AbortPush(*broken, "stream broke");  // restarts the aggregation: A's push is dropped with the sums
  HeartbeatReply a = Beat("A");
  EXPECT_FALSE(a.pushed());
  ASSERT_TRUE(a.has_last_applied_base());
  EXPECT_EQ(a.last_applied_base(), -1);
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();  // version 1, from B's push alone
  a = Beat("A");
  EXPECT_EQ(a.round(), 1);
  EXPECT_FALSE(a.pushed());
  EXPECT_EQ(a.last_applied_base(), -1) << "A's push was never applied";
  EXPECT_EQ(Beat("B").last_applied_base(), 0);
  EXPECT_EQ(Worker(core_->Status(), "A").rounds_contributed(), 0);
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok()) << "the dropped push, pushed again, is one version behind: accepted";
  core_->Poll();
  EXPECT_EQ(Beat("A").last_applied_base(), 0);
  EXPECT_EQ(Worker(core_->Status(), "A").rounds_contributed(), 1);
}

// The resend of an applied push more than outer.max_staleness versions old is still "already counted", not a stale
// push that did not count (the worker would then keep its progress as not sent: reuse_local, error feedback).
TEST_F(CoordinatorCoreTest, AsyncResendOlderThanMaxStalenessIsStillAlreadyCounted) {
  StartAsyncAB(/*max_staleness=*/0);
  ASSERT_TRUE(Push("A", 0, 1000, RandomDelta()).ok());
  core_->Poll();
  const absl::Status resent = Push("A", 0, 1000, RandomDelta());
  EXPECT_EQ(resent.code(), absl::StatusCode::kAlreadyExists) << resent;
  const absl::Status stale = Push("B", 0, 1000, RandomDelta());  // B's push did not count: stale, as before
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
}

// Sync: a push whose reply was lost after it counted (its stream broke after the last chunk, the deadline passed) is
// sent again by its worker. Once the round is stepped, or while it is, the resend is "counted" (ALREADY_EXISTS), not
// "late" (FAILED_PRECONDITION): a worker told late rolls its error feedback back and, with late_policy reuse_local,
// keeps its local parameters over the global ones that already hold its push. Theta does not move again.
TEST_F(CoordinatorCoreTest, SyncResendOfACountedPushAfterItsRoundClosedIsAlreadyCounted) {
  config_.coordinator.min_workers = 1;
  Tensors dA, dB;
  ASSERT_NO_FATAL_FAILURE(CloseRoundOneWithAB(&dA, &dB));
  const Tensors theta1 = Theta();
  const absl::Status resent = Push("A", 0, 1000, dA);
  EXPECT_EQ(resent.code(), absl::StatusCode::kAlreadyExists) << resent;
  EXPECT_THAT(std::string(resent.message()),
              HasSubstr("worker 'A' already pushed for round 1 (counted in that round's outer step)"));
  core_->Poll();
  ExpectAllClose(Theta(), theta1);
  EXPECT_EQ(core_->Status().round(), 1);
  EXPECT_EQ(Worker(core_->Status(), "A").rounds_contributed(), 1);
  Join("C");  // a member whose push for round 0 never counted is still late
  EXPECT_EQ(Push("C", 0, 1000, dA).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Push("A", 1, 1000, dA).ok()) << "the next round's push counts as usual";
}

// The evaluation runs while the round is stepped (theta_{t+1} is vetted before it is published); `during` runs there.
class CallingEvaluator : public Evaluator {
 public:
  std::function<void()> during;
  double Evaluate(const NamedTensors& theta) override {
    if (during) during();
    double sum = 0;
    for (const auto& [name, t] : theta) sum += t.to(at::kDouble).pow(2).mean().item<double>();
    return sum;
  }
};

TEST_F(CoordinatorCoreTest, SyncResendOfAPushWhileItsRoundIsSteppedIsAlreadyCounted) {
  config_.coordinator.eval_every = 1;
  auto evaluator = std::make_unique<CallingEvaluator>();
  CallingEvaluator* calls = evaluator.get();
  auto created = CoordinatorCore::Create(config_, TinyTheta0(config_.model), std::move(evaluator), false,
                                         [this] { return now_.load(); });
  ASSERT_TRUE(created.ok()) << created.status();
  core_ = std::move(*created);
  Join("A");
  Join("B");
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  absl::Status during_step;
  calls->during = [&] { during_step = Push("A", 0, 1000, dA); };
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  EXPECT_EQ(during_step.code(), absl::StatusCode::kAlreadyExists) << during_step;
  EXPECT_THAT(std::string(during_step.message()), HasSubstr("(its outer step is under way)"));
  EXPECT_EQ(Worker(core_->Status(), "A").rounds_contributed(), 1);
}

// Calls `on_line` with each line logged (on the logging thread) while it is installed.
class CallbackSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit CallbackSink(std::function<void(const std::string&)> on_line) : on_line_(std::move(on_line)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    on_line_(std::string(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override {}

 private:
  std::function<void(const std::string&)> on_line_;
};

// The last round is published before its checkpoint is written (the round's sinks: its log line, then the checkpoint).
// A pull of it meanwhile would tell the worker "run complete" (it leaves), and a coordinator killed before the
// checkpoint lands resumes at the round before with no worker left: the run never ends and the last theta is lost.
// So that pull is UNAVAILABLE (the worker pulls again) until the checkpoint is on disk. Before, it was served.
TEST_F(CoordinatorCoreTest, TheLastRoundIsNotServedBeforeItsCheckpointIsWritten) {
  config_.outer.rounds = 1;
  Start();
  Join("A");
  Join("B");
  absl::Status during_commit = absl::OkStatus();
  bool pulled_during_commit = false;
  auto sink = std::make_shared<CallbackSink>([&](const std::string& line) {
    if (line.find("round 1/1 closed") == std::string::npos) return;
    PullRequest r;
    *r.mutable_meta() = Meta("A");
    during_commit = core_->BeginPull(r).status();
    pulled_during_commit = true;
  });
  spdlog::default_logger()->sinks().push_back(sink);
  ASSERT_TRUE(Push("A", 0, 1000, RandomDelta()).ok());
  ASSERT_TRUE(Push("B", 0, 1000, RandomDelta()).ok());
  core_->Poll();
  spdlog::default_logger()->sinks().pop_back();
  ASSERT_TRUE(pulled_during_commit);
  EXPECT_EQ(during_commit.code(), absl::StatusCode::kUnavailable) << during_commit;
  EXPECT_THAT(std::string(during_commit.message()), HasSubstr("being checkpointed; pull again"));
  ASSERT_TRUE(core_->complete());
  int64_t round = -1;
  Theta("A", &round);  // served once the checkpoint is written
  EXPECT_EQ(round, 1);
}

// inner.adaptive_steps (DyLU): after a round, each worker's H for the next one is its share of the fastest speed.
TEST_F(CoordinatorCoreTest, AdaptiveStepsGiveTheSlowerWorkerFewerInnerSteps) {
  config_.inner.adaptive_steps = true;
  config_.inner.steps = 40;
  Start();
  Join("A");
  Join("B");
  EXPECT_EQ(core_->InnerStepsFor("A"), 40);
  ASSERT_TRUE(Push("A", 0, 1000, RandomDelta(), /*inner_steps=*/40, /*seconds=*/2.0).ok());  // 20 steps/s
  ASSERT_TRUE(Push("B", 0, 1000, RandomDelta(), /*inner_steps=*/40, /*seconds=*/8.0).ok());  // 5 steps/s
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 1);
  EXPECT_EQ(core_->InnerStepsFor("A"), 40);
  EXPECT_EQ(core_->InnerStepsFor("B"), 10);
  EXPECT_EQ(Worker(core_->Status(), "B").inner_steps(), 10);
}

// Without inner.adaptive_steps the coordinator assigns no H (PullHeader.inner_steps 0): each worker trains its own
// inner.steps, as it did when the header carried the coordinator's.
TEST_F(CoordinatorCoreTest, WithoutAdaptiveStepsNoInnerStepsAreAssigned) {
  config_.inner.steps = 40;
  Start();
  Join("A");
  EXPECT_EQ(core_->InnerStepsFor("A"), 0);
  ASSERT_TRUE(Push("A", 0, 1000, RandomDelta(), /*inner_steps=*/40, /*seconds=*/2.0).ok());
  core_->Poll();
  EXPECT_EQ(core_->InnerStepsFor("A"), 0);
}

}  // namespace
}  // namespace diloco

namespace diloco {
namespace {

// The non-finite guard (issue 32 item 4) with outer.aggregation mean: one member's well-formed (finite) push makes
// the token-weighted sums overflow. The round is discarded with theta and the momentum as they were, the pushes are
// logged with their norms, the largest-norm member is quarantined at once and the others push again; the redone
// round is exactly the honest members' step.
TEST_F(CoordinatorCoreTest, ARoundWhoseSumsOverflowIsDiscardedAndRedoneWithoutTheLargestPush) {
  Start();
  Join("A");
  Join("B");
  Join("C");
  const Tensors theta0 = Theta();
  const Tensors dB = RandomDelta(), dC = RandomDelta();
  Tensors huge;
  for (const at::Tensor& d : dB) huge.push_back(at::full_like(d, 1.0e38f));  // x 1000 tokens: Inf in the sums
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(200);
  spdlog::default_logger()->sinks().push_back(log);
  ASSERT_TRUE(Push("A", 0, 1000, huge).ok());
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());
  core_->Poll();
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(core_->Status().round(), 0);
  ExpectAllClose(Theta("B"), theta0);
  EXPECT_FALSE(Beat("B").pushed()) << "B's push was discarded with the round: it must push again";
  EXPECT_GT(Worker(core_->Status(), "A").quarantined_until_round(), 0);
  std::string logged;
  for (const std::string& line : log->last_formatted()) logged += line;
  EXPECT_THAT(logged, HasSubstr("round 1 discarded: the averaged pseudo-gradient is not finite"));
  EXPECT_THAT(logged, HasSubstr("A norm "));
  EXPECT_THAT(logged, HasSubstr("quarantined: worker A"));
  EXPECT_EQ(Push("A", 0, 1000, huge).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 1);
  ExpectAllClose(Theta("B"), Step(theta0, Average({dB, dC}, {1000, 1000})));
}

// The sums are finite but the outer step would overflow theta (a one-token push of 3e38: Nesterov's update is 1.9 x
// the delta): the store's guard (OuterStep NonFiniteStep) refuses it before writing, theta stays theta_0.
TEST_F(CoordinatorCoreTest, AStepThatWouldOverflowThetaIsNotCommitted) {
  config_.coordinator.min_workers = 1;
  Start();
  Join("A");
  const Tensors theta0 = Theta();
  Tensors huge;
  for (const at::Tensor& t : theta0) huge.push_back(at::full_like(t, 3.0e38f));
  ASSERT_TRUE(Push("A", 0, 1, huge).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 0);
  ExpectAllClose(Theta("A"), theta0);
  Join("B");
  const Tensors dB = RandomDelta();
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 1);
  ExpectAllClose(Theta("B"), Step(theta0, dB));
}

// A round discarded at its outer step after round_timeout_s had passed (a slow round whose pushes all came) is redone
// with the same wait a restarted aggregation gets (min(lease_s, round_timeout_s)): before, its first min_workers
// re-pushes closed it at once and shut the other members out.
TEST_F(CoordinatorCoreTest, ARedoneRoundPastItsTimeoutWaitsForTheOtherPushesAgain) {
  config_.coordinator.min_workers = 1;
  config_.coordinator.round_timeout_s = 5;
  config_.coordinator.lease_s = 10;
  config_.coordinator.heartbeat_interval_s = 1;
  config_.workers.count = 3;
  Start();
  Join("A");
  Join("B");
  Join("C");
  const Tensors theta0 = Theta();
  Tensors huge;
  for (const at::Tensor& t : theta0) huge.push_back(at::full_like(t, 3.0e38f));
  const Tensors dB = RandomDelta(), dC = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 1000, huge).ok());
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  now_ = 6;  // the round's timeout has passed; every member pushed, so it closes now
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 0) << "the step would not be finite: discarded, A quarantined";
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  now_ = 8;
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 0) << "C has until 6 + min(lease_s, round_timeout_s) to push again";
  EXPECT_THAT(core_->Status().phase_reason(), HasSubstr("waiting for C"));
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  ExpectAllClose(Theta("B"), Step(theta0, Average({dB, dC}, {1000, 1000})));
}

}  // namespace
}  // namespace diloco

namespace diloco {
namespace {

double NormOf(const Tensors& delta) {
  double squared = 0;
  for (const at::Tensor& d : delta) squared += d.to(at::kDouble).square().sum().item<double>();
  return std::sqrt(squared);
}

// Pushes whose headers claim their norm, as clip and centered_clip's norm bound need.
class RobustAggregationTest : public CoordinatorCoreTest {
 protected:
  // A push whose header claims `claimed` (the delta's own norm by default).
  absl::Status PushClaimed(const std::string& id, int64_t tokens, const Tensors& delta, double claimed = -1,
                           int64_t round = 0) {
    PushHeader h = Header(id, round, tokens);
    h.set_claimed_norm(claimed >= 0 ? claimed : NormOf(delta));
    auto ticket = core_->BeginPush(h);
    if (!ticket.ok()) return ticket.status();
    for (size_t i = 0; i < delta.size(); ++i) {
      if (absl::Status s = FoldTensor(*ticket, i, delta[i]); !s.ok()) return s;
    }
    return core_->CommitPush(*ticket);
  }
  // One round, 1000 tokens a push: every header is declared before the fold opens, so each push is tried, the early
  // ones told to retry (UNAVAILABLE), then pushed again; the round then closes.
  void PushRound(const std::map<std::string, Tensors>& deltas, int64_t round) {
    std::vector<std::string> again;
    for (const auto& [id, d] : deltas) {
      const absl::Status s = PushClaimed(id, 1000, d, -1, round);
      if (s.code() == absl::StatusCode::kUnavailable)
        again.push_back(id);
      else
        ASSERT_TRUE(s.ok()) << id << ": " << s;
    }
    for (const std::string& id : again) ASSERT_TRUE(PushClaimed(id, 1000, deltas.at(id), -1, round).ok()) << id;
    core_->Poll();
    ASSERT_EQ(core_->Status().round(), round + 1);
  }
  // Starts the core with `ids` joined (workers.count their number) and pushes round 1, a random delta each; the
  // deltas, and theta_0 and theta_1 as pulled.
  struct FirstRound {
    std::map<std::string, Tensors> deltas;
    Tensors theta0, theta1;
  };
  FirstRound StartWithARandomRound(const std::vector<std::string>& ids) {
    FirstRound first;
    config_.workers.count = static_cast<int64_t>(ids.size());
    Start();
    if (HasFatalFailure()) return first;
    for (const std::string& id : ids) Join(id);
    first.theta0 = Theta();
    for (const std::string& id : ids) first.deltas[id] = RandomDelta();
    PushRound(first.deltas, 0);
    first.theta1 = Theta();
    return first;
  }
};

class ClipAggregationTest : public RobustAggregationTest {
 protected:
  void SetUp() override {
    RobustAggregationTest::SetUp();
    config_.outer.aggregation = Aggregation::kClip;
  }
};

// outer.aggregation clip: the fold opens once every active member's header has declared its norm (the early ones
// are told UNAVAILABLE and retry); each push is scaled to at most clip_factor x the median norm and each token
// weight capped at max_token_weight x the median: delta = sum_i w_i s_i d_i / sum_i w_i.
TEST_F(ClipAggregationTest, TheFoldWaitsForEveryHeaderThenScalesToTheMedianNormAndCapsTokens) {
  Start();
  Join("A");
  Join("B");
  Join("C");
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  Tensors dC;
  for (const at::Tensor& d : RandomDelta()) dC.push_back(d * -1000);  // sign flip x1000 of an honest-looking delta
  EXPECT_EQ(PushClaimed("A", 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(PushClaimed("B", 1200, dB).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(PushClaimed("C", 1000000, dC).ok());  // the last header: the fold opens
  ASSERT_TRUE(PushClaimed("A", 1000, dA).ok());
  ASSERT_TRUE(PushClaimed("B", 1200, dB).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  const std::vector<double> norms = {NormOf(dA), NormOf(dB), NormOf(dC)};
  std::vector<double> sorted = norms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[1];
  const std::vector<double> weights = {1000, 1200, 2 * 1200.0};  // C's 1e6 tokens capped at 2 x median (1200)
  const std::vector<Tensors> deltas = {dA, dB, dC};
  Tensors want;
  double total = 0;
  for (double w : weights) total += w;
  for (size_t t = 0; t < dA.size(); ++t) {
    at::Tensor sum = at::zeros_like(dA[t]);
    for (size_t i = 0; i < 3; ++i) sum.add_(deltas[i][t], weights[i] * std::min(1.0, median / norms[i]));
    want.push_back(sum / total);
  }
  ExpectAllClose(Theta(), Step(theta0, want));
}

// A round whose outer step is discarded (not finite) is not one of outer.flag_rounds' rounds in a row: the push far
// beyond the clip threshold counts once its round commits, not at every close that is thrown away. Here every push is
// huge (elements 1.1e38, 1.2e38 and A's 3.3e38, 2.75 x the median: far beyond it with the default margin 2) and
// outer.lr 2, so even the clipped average steps theta past float's range.
TEST_F(ClipAggregationTest, ADiscardedRoundDoesNotCountTowardSuspect) {
  config_.outer.flag_rounds = 1;
  config_.outer.lr = 2;
  config_.outer.momentum_bound = 0;
  Start();
  Join("A");
  Join("B");
  Join("C");
  std::map<std::string, Tensors> deltas;
  for (const auto& [id, value] : {std::pair{"A", 3.3e38f}, std::pair{"B", 1.2e38f}, std::pair{"C", 1.1e38f}}) {
    for (const at::Tensor& t : Theta()) deltas[id].push_back(at::full_like(t, value));
  }
  std::vector<std::string> again;
  for (const auto& [id, d] : deltas) {
    if (PushClaimed(id, 1000, d).code() == absl::StatusCode::kUnavailable) again.push_back(id);
  }
  for (const std::string& id : again) ASSERT_TRUE(PushClaimed(id, 1000, deltas.at(id)).ok()) << id;
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 0) << "the step is not finite: discarded";
  const StatusReply status = core_->Status();
  EXPECT_NEAR(Worker(status, "A").last_clip_scale(), 1.2 / 3.3, 1e-4) << "A was clipped far beyond the threshold";
  EXPECT_EQ(Worker(status, "A").clipped_in_a_row(), 0) << "but its round was not committed";
  EXPECT_FALSE(Worker(status, "A").suspect());
}

// comm.topk_average senders (each coordinate over the weights of the pushes that sent it) with clip: a dense push
// counts its own token weight at its coordinates, as a sparse one does, so its clip scale shrinks its values and is
// not divided out again. Before, a dense chunk added its scaled weight w s to W_j: at a coordinate only it sent,
// (w s v) / (w s) = v, unclipped; here, with both pushes dense, the rule was a reweighting that never bounded C.
TEST_F(ClipAggregationTest, ADensePushUnderTopkSendersIsClippedNotDividedBackOut) {
  config_.comm.codec = WireCodec::kTopk;
  config_.comm.topk_average = TopkAverage::kSenders;
  Start();
  Join("A");
  Join("C");
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta();
  Tensors dC;
  for (const at::Tensor& d : RandomDelta()) dC.push_back(d * 1000);
  EXPECT_EQ(PushClaimed("A", 1000, dA).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(PushClaimed("C", 1000, dC).ok());  // the last header: the fold opens
  ASSERT_TRUE(PushClaimed("A", 1000, dA).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  const double median = (NormOf(dA) + NormOf(dC)) / 2;  // of two norms: their mean
  const double sA = std::min(1.0, median / NormOf(dA)), sC = std::min(1.0, median / NormOf(dC));
  Tensors want;
  for (size_t t = 0; t < dA.size(); ++t) want.push_back((dA[t] * (1000 * sA) + dC[t] * (1000 * sC)) / 2000);
  ExpectAllClose(Theta(), Step(theta0, want));
}

// A push whose values' norm differs from its header's claim (beyond 2%) is refused at the end of its stream; the
// round's aggregation restarts (B, already counted, pushes again) and the liar is quarantined for the round.
TEST_F(ClipAggregationTest, AClaimedNormThatDoesNotMatchRefusesThePushAndRestartsTheAggregation) {
  config_.coordinator.min_workers = 1;  // the redo closes with B alone
  Start();
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta();
  Tensors dB;  // twice A's norm or so: the first two headers' median would clip it
  for (const at::Tensor& d : RandomDelta()) dB.push_back(d * 2);
  EXPECT_EQ(PushClaimed("B", 1000, dB).code(), absl::StatusCode::kUnavailable);
  PushHeader h = Header("A", 0, 1000);
  h.set_claimed_norm(NormOf(dA));   // but it sends 100 x dA
  auto liar = core_->BeginPush(h);  // the last header: the fold opens
  ASSERT_TRUE(liar.ok()) << liar.status();
  for (size_t i = 0; i < dA.size(); ++i) ASSERT_TRUE(FoldTensor(*liar, i, dA[i] * 100).ok());
  ASSERT_TRUE(PushClaimed("B", 1000, dB).ok());
  EXPECT_TRUE(Beat("B").pushed());
  const absl::Status lie = core_->CommitPush(*liar);
  EXPECT_EQ(lie.code(), absl::StatusCode::kInvalidArgument) << lie;
  EXPECT_THAT(std::string(lie.message()), HasSubstr("claimed norm"));
  EXPECT_FALSE(Beat("B").pushed()) << "the aggregation restarted: B pushes again";
  EXPECT_GT(Worker(core_->Status(), "A").quarantined_until_round(), 0);
  ASSERT_TRUE(PushClaimed("B", 1000, dB).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  // The restart formed the fold's medians again from the headers that came back: B's alone (A's claim no longer
  // counts), so B is not clipped. Before, the medians of the first two headers stayed, A's claim among them.
  ASSERT_GT(NormOf(dB), 0.5 * (NormOf(dA) + NormOf(dB))) << "the old medians would have clipped B";
  ExpectAllClose(Theta(), Step(theta0, dB));
}

// outer.momentum_bound (coordinator_momentum.cc): in round 2, E pushes a delta that leans on the outer momentum
// (round 1's average, as a stale or replayed delta does). Each push's projection onto the unit momentum, after its
// norm clip, is lowered to at most the median projection + 3 x 1.4826 x their median absolute deviation; the average
// loses the excess along the momentum. The expected theta is computed here from that definition with plain tensor
// ops; without the bound (outer.momentum_bound 0) theta is the plain clip step, which the bound must differ from.
TEST_F(ClipAggregationTest, APushThatLeansOnTheOuterMomentumIsBoundedAlongIt) {
  const std::vector<std::string> ids = {"A", "B", "C", "D", "E"};
  // The clip rule's average (equal tokens): sum_i s_i d_i / k, s_i = min(1, median norm / norm_i).
  auto clip_average = [](const std::map<std::string, Tensors>& deltas, std::vector<double>* scales) {
    std::vector<double> norms;
    for (const auto& [id, d] : deltas) norms.push_back(NormOf(d));
    std::vector<double> sorted = norms;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    Tensors sum;
    size_t i = 0;
    for (const auto& [id, d] : deltas) {
      const double s = std::min(1.0, median / norms[i++]);
      if (scales != nullptr) scales->push_back(s);
      for (size_t t = 0; t < d.size(); ++t) {
        if (sum.size() <= t) sum.push_back(at::zeros_like(d[t]));
        sum[t].add_(d[t], s / static_cast<double>(deltas.size()));
      }
    }
    return sum;
  };
  at::manual_seed(32);
  for (const double bound : {3.0, 0.0}) {
    SCOPED_TRACE(bound);
    config_.outer.momentum_bound = bound;
    const FirstRound first = StartWithARandomRound(ids);
    ASSERT_FALSE(HasFatalFailure());
    const Tensors m = clip_average(first.deltas, nullptr);  // the momentum after the first step: buf = delta
    const Tensors& theta1 = first.theta1;
    ExpectAllClose(theta1, Step(first.theta0, m));
    std::map<std::string, Tensors> round2;
    for (const std::string& id : ids) round2[id] = RandomDelta();
    for (size_t t = 0; t < m.size(); ++t) round2["E"][t] = m[t] * 4 + round2["E"][t] * 0.25;  // leans on m
    std::vector<double> scales;
    Tensors average = clip_average(round2, &scales);
    const double m_norm = NormOf(m);
    std::vector<double> q;  // projections onto m / |m| after the clip
    size_t i = 0;
    for (const auto& [id, d] : round2) {
      double dot = 0;
      for (size_t t = 0; t < d.size(); ++t) dot += (d[t].to(at::kDouble) * m[t].to(at::kDouble)).sum().item<double>();
      q.push_back(scales[i++] * dot / m_norm);
    }
    std::vector<double> sorted = q;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[2];
    std::vector<double> deviations;
    for (double v : q) deviations.push_back(std::fabs(v - median));
    std::sort(deviations.begin(), deviations.end());
    const double half = 3.0 * 1.4826 * deviations[2];
    double excess = 0;
    std::map<std::string, bool> clamped, far;  // by id, as round2 iterates; far: 2 x as far out as the bound
    i = 0;
    for (const auto& [id, d] : round2) {
      ASSERT_GT(scales[i], 0.5) << id << ": not far beyond the norm clip (outer.flag_margin 2)";
      const double v = q[i++];
      excess += v - std::min(v, median + half);
      clamped[id] = v > median + half;
      far[id] = v - median > 2 * half;
    }
    ASSERT_TRUE(clamped["E"]) << "E's projection is an outlier";
    ASSERT_TRUE(far["E"]) << "and twice as far out as the bound";
    Tensors bounded;
    for (size_t t = 0; t < m.size(); ++t) bounded.push_back(average[t] - m[t] * (excess / 5.0 / m_norm));
    PushRound(round2, 1);
    const Tensors plain = Step(theta1, average, m);
    const Tensors with_bound = Step(theta1, bounded, m);
    ExpectAllClose(Theta(), bound > 0 ? with_bound : plain);
    EXPECT_GT((plain[0] - with_bound[0]).abs().max().item<float>(), 1e-3) << "the bound moves theta";
    const StatusReply status = core_->Status();
    for (const std::string& id : ids) {
      EXPECT_EQ(Worker(status, id).momentum_bounded(), bound > 0 && clamped[id]) << id;
      // Round 1's random pushes are clipped by little: the count is this round's (outer.flag_margin 2).
      EXPECT_EQ(Worker(status, id).clipped_in_a_row(), bound > 0 && far[id] ? 1 : 0) << id;
    }
    if (bound > 0) {
      EXPECT_GT(Worker(status, "E").momentum_cosine(), 0.5);
      EXPECT_LT(std::fabs(Worker(status, "A").momentum_cosine()), 0.5);
    }
    core_.reset();
  }
}

// outer.flag_margin: for three rounds B pushes 1.25 x the median norm (clipped by 20% each round, as honest pushes
// are: half of them are clipped a little in any round) and C 10 x (an attack). With outer.flag_rounds 3 and the
// default margin 2 only C counts and becomes suspect; with margin 1 (any clip counts) B becomes suspect too.
TEST_F(ClipAggregationTest, OnlyAPushFarBeyondTheClipThresholdCountsTowardSuspect) {
  const std::map<std::string, double> norms = {{"A1", 0.8}, {"A2", 0.9}, {"A3", 1.0}, {"B", 1.25}, {"C", 10}};
  at::manual_seed(33);
  for (const double margin : {2.0, 1.0}) {
    SCOPED_TRACE(margin);
    config_.outer.flag_margin = margin;
    config_.outer.flag_rounds = 3;
    config_.outer.momentum_bound = 0;  // the norm clip's count alone
    config_.workers.count = 5;
    Start();
    for (const auto& [id, norm] : norms) Join(id);
    for (int64_t round = 0; round < 3; ++round) {
      std::map<std::string, Tensors> deltas;
      for (const auto& [id, norm] : norms) {
        Tensors d = RandomDelta();
        const double scale = norm / NormOf(d);
        for (at::Tensor& t : d) t.mul_(scale);
        deltas[id] = d;
      }
      ASSERT_NO_FATAL_FAILURE(PushRound(deltas, round));
      const StatusReply status = core_->Status();
      EXPECT_NEAR(Worker(status, "B").last_clip_scale(), 0.8, 1e-4);
      EXPECT_NEAR(Worker(status, "C").last_clip_scale(), 0.1, 1e-4);
      EXPECT_EQ(Worker(status, "C").clipped_in_a_row(), round + 1);
      EXPECT_EQ(Worker(status, "B").clipped_in_a_row(), margin > 1.5 ? 0 : round + 1);
      EXPECT_EQ(Worker(status, "C").suspect(), round == 2);
      EXPECT_EQ(Worker(status, "B").suspect(), margin < 1.5 && round == 2);
      for (const char* id : {"A1", "A2", "A3"}) {
        EXPECT_EQ(Worker(status, id).clipped_in_a_row(), 0) << id;
        EXPECT_FALSE(Worker(status, id).suspect()) << id;
      }
    }
    core_.reset();
  }
}

// The duplicate check (CoordinatorCore::CheckDuplicate) under a robust rule: C's push byte-identical to A's counted
// push (a copy) is refused with FAILED_PRECONDITION (the worker goes on to the next round), C counts a duplicate and
// sits out the round, and the aggregation restarts (A pushes again). In round 2, B's push equal to its round-1 push
// (a replay) is refused likewise. Without the check the copy is counted and the round closes at once.
TEST_F(ClipAggregationTest, AByteIdenticalCopyOrReplayIsRefusedAndTheRoundRedoneWithoutIt) {
  config_.coordinator.min_workers = 2;
  Start();
  for (const char* id : {"A", "B", "C"}) Join(id);
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  EXPECT_EQ(PushClaimed("A", 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(PushClaimed("C", 1000, dA).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(PushClaimed("B", 1000, dB).ok());  // the last header: the fold opens
  ASSERT_TRUE(PushClaimed("A", 1000, dA).ok());
  const absl::Status copy = PushClaimed("C", 1000, dA);
  EXPECT_EQ(copy.code(), absl::StatusCode::kFailedPrecondition) << copy;
  EXPECT_THAT(std::string(copy.message()), HasSubstr("byte-identical to worker 'A''s push of this round"));
  EXPECT_FALSE(Beat("A").pushed()) << "the aggregation restarted: A pushes again";
  EXPECT_FALSE(Beat("B").pushed()) << "the aggregation restarted: B pushes again";
  EXPECT_EQ(Worker(core_->Status(), "C").duplicate_pushes(), 1);
  const absl::Status sits_out = PushClaimed("C", 1000, RandomDelta());
  EXPECT_EQ(sits_out.code(), absl::StatusCode::kFailedPrecondition) << "C sits out the round";
  EXPECT_THAT(std::string(sits_out.message()),
              HasSubstr("quarantined through round 1 (its push was a copy or a replay)"));
  // The restart forgot the gate's headers (C's claim among them): the gate opens again once A and B, the members
  // that may push, have declared.
  EXPECT_EQ(PushClaimed("A", 1000, dA).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(PushClaimed("B", 1000, dB).ok());
  ASSERT_TRUE(PushClaimed("A", 1000, dA).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  EXPECT_EQ(Worker(core_->Status(), "A").duplicate_pushes(), 0);
  // Round 2: B replays its round-1 push.
  ASSERT_TRUE(PushClaimed("A", 1000, RandomDelta(), -1, 1).code() == absl::StatusCode::kUnavailable);
  ASSERT_TRUE(PushClaimed("C", 1000, RandomDelta(), -1, 1).code() == absl::StatusCode::kUnavailable);
  const absl::Status replay = PushClaimed("B", 1000, dB, -1, 1);
  EXPECT_EQ(replay.code(), absl::StatusCode::kFailedPrecondition) << replay;
  EXPECT_THAT(std::string(replay.message()), HasSubstr("byte-identical to a push of the previous round"));
  EXPECT_EQ(Worker(core_->Status(), "B").duplicate_pushes(), 1);
}

// outer.aggregation centered_clip with outer.cclip_norm_clip (default): each push is scaled to at most clip_factor x
// the median of the set's claimed norms before it enters the window; per chunk the result is then CenteredClip of
// the scaled rows (aggregation_rule.h, golden-tested against numpy). With the norm clip off, C's x10 push enters
// as is and the result differs.
TEST_F(ClipAggregationTest, CenteredClipBoundsEachPushToTheMedianNormFirst) {
  config_.outer.aggregation = Aggregation::kCenteredClip;
  config_.outer.window_chunks = 1000;  // the pushes here stream one after the other on this thread
  config_.comm.chunk_bytes = 256;      // 64 float32 a chunk: tensors of several chunks
  Start();
  for (const char* id : {"A", "B", "C"}) Join(id);
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  Tensors dC;
  for (const at::Tensor& d : RandomDelta()) dC.push_back(d * 10);
  EXPECT_EQ(PushClaimed("A", 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(PushClaimed("B", 1000, dB).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(PushClaimed("C", 1000, dC).ok());  // the last header: the set is fixed
  ASSERT_TRUE(PushClaimed("A", 1000, dA).ok());
  ASSERT_TRUE(PushClaimed("B", 1000, dB).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  std::vector<double> norms = {NormOf(dA), NormOf(dB), NormOf(dC)};
  std::sort(norms.begin(), norms.end());
  const double scale_c = std::min(1.0, norms[1] / NormOf(dC));
  ASSERT_LT(scale_c, 0.5) << "C's push is the one far out";
  Tensors want;
  for (size_t t = 0; t < dA.size(); ++t) {  // FoldTensor's chunks: the coordinator's, 64 elements
    const at::Tensor a = dA[t].reshape({-1}), b = dB[t].reshape({-1}), c = dC[t].reshape({-1}) * scale_c;
    std::vector<at::Tensor> parts;
    for (auto [from, n] : ChunksOf(t)) {
      const at::Tensor rows = at::stack({a.narrow(0, from, n), b.narrow(0, from, n), c.narrow(0, from, n)});
      parts.push_back(CenteredClip(rows, CenteredClipTau(rows), config_.outer.cclip_iterations));
    }
    want.push_back(at::cat(parts).to(at::kFloat).reshape(dA[t].sizes()));
  }
  ExpectAllClose(Theta(), Step(theta0, want));
}

// Under outer.aggregation mean (no defence by design) two equal pushes both count.
TEST_F(CoordinatorCoreTest, MeanCountsByteIdenticalPushes) {
  Start();
  Join("A");
  Join("B");
  const Tensors d = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 1000, d).ok());
  ASSERT_TRUE(Push("B", 0, 1000, d).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 1);
  EXPECT_EQ(Worker(core_->Status(), "B").duplicate_pushes(), 0);
}

// outer.aggregation trimmed_mean (coordinate_window.h): the round's set is fixed once every active member's header
// has come (the early ones are told UNAVAILABLE and retry); each coordinate is the mean of the pushes' values after
// dropping the smallest and the largest, whatever their token counts (a x-1000 push with 1e6 tokens moves nothing).
TEST_F(CoordinatorCoreTest, TrimmedMeanWaitsForTheSetThenTrimsEachCoordinate) {
  StartTrimmedMean(1, {"A", "B", "C", "D"});
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dB = RandomDelta(), dC = RandomDelta();
  Tensors dD;
  for (const at::Tensor& d : RandomDelta()) dD.push_back(d * -1000);
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("B", 0, 1000, dB).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("C", 0, 1000, dC).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(Push("D", 0, 1000000, dD).ok());  // the last header: the set is fixed
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 0) << "A, B and C are in the set: the round waits for them";
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  Tensors want;
  for (size_t t = 0; t < dA.size(); ++t) {
    const at::Tensor sorted = std::get<0>(at::stack({dA[t], dB[t], dC[t], dD[t]}).to(at::kDouble).sort(0));
    want.push_back(sorted.narrow(0, 1, 2).mean(0).to(at::kFloat));
  }
  ExpectAllClose(Theta(), Step(theta0, want));
}

// A member that joins after a coordinate-wise rule fixed the round's set cannot push in that round (it is told
// UNAVAILABLE until the round closes): the round closes once the set's pushes are in, and does not wait
// coordinator.round_timeout_s for the latecomer (it did: on a loaded machine the eight workers of an attack run joined
// over 20 ms, six had declared, and the round waited for the last two).
TEST_F(CoordinatorCoreTest, TrimmedMeanClosesWithoutAMemberThatJoinedAfterTheSetWasFixed) {
  config_.coordinator.min_workers = 3;
  StartTrimmedMean(1, {"A", "B", "C"});
  const Tensors dA = RandomDelta(), dB = RandomDelta(), dC = RandomDelta(), dD = RandomDelta();
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("B", 0, 1000, dB).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());  // the last header of the three: the set is fixed
  Join("D");
  const absl::Status late = Push("D", 0, 1000, dD);
  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  EXPECT_THAT(std::string(late.message()), HasSubstr("fixed without worker 'D'"));
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 1) << "the set's three pushes are in; D cannot push in this round";
}

// The coordinator's chunking is the reference (coordinate_window.h): M, whose header fixes the set, sends a chunk 0
// of one element before the honest pushes send theirs. M's push is refused (INVALID_ARGUMENT) and struck, and A's
// chunk, cut as the coordinator cuts it, is not: before, the push that sent its chunk 0 second was the one refused
// (its worker exits on INVALID_ARGUMENT) and struck, so a member could remove honest members one attempt at a time.
TEST_F(CoordinatorCoreTest, CoordinateWiseRulesRefuseThePushCutOtherwiseNotTheOneAfterIt) {
  StartTrimmedMean(1, {"A", "B", "M"});
  const Tensors dA = RandomDelta(), dB = RandomDelta(), dM = RandomDelta();
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("B", 0, 1000, dB).code(), absl::StatusCode::kUnavailable);
  auto m = core_->BeginPush(Header("M", 0, 1000));  // the last header: the set is fixed
  ASSERT_TRUE(m.ok()) << m.status();
  const absl::Status cut = core_->FoldChunk(*m, 0, 0, dM[0].reshape({-1}).narrow(0, 0, 1));
  EXPECT_EQ(cut.code(), absl::StatusCode::kInvalidArgument) << cut;
  EXPECT_THAT(std::string(cut.message()), HasSubstr("not cut as the coordinator's comm.codec and comm.chunk_bytes"));
  core_->AbortPush(*m, std::string(cut.message()));  // as PushSession does after a refused chunk
  EXPECT_EQ(Worker(core_->Status(), "M").broken_pushes(), 1);
  // The set forms again from the headers that come back; A's push, cut as the coordinator cuts, goes in.
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("B", 0, 1000, dB).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(Push("M", 0, 1000, dM).ok());
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 1);
  EXPECT_EQ(Worker(core_->Status(), "A").broken_pushes(), 0);
  EXPECT_EQ(Worker(core_->Status(), "B").broken_pushes(), 0);
}

// Under a coordinate-wise rule a worker whose comm.codec and comm.chunk_bytes would cut its pushes into other chunks
// than the coordinator's is refused at Join, before it trains a round (before, only its first push was refused), and
// is not made a member. The coordinator cuts fp32 chunks of 256 bytes: 64 elements. fp16 in 128-byte chunks cuts the
// same 64 and joins; a worker that does not say (chunk_bytes 0: an older client) joins and is checked at its push.
TEST_F(CoordinatorCoreTest, CoordinateWiseRulesRefuseAtJoinAWorkerWhoseChunksWouldNotLineUp) {
  StartTrimmedMean(1, {});
  auto join = [&](const std::string& id, Codec codec, int64_t chunk_bytes) {
    JoinRequest r = JoinReq(id);
    r.set_push_codec(codec);
    r.set_chunk_bytes(chunk_bytes);
    return core_->Join(r).status();
  };
  const absl::Status larger = join("A", CODEC_RAW, 512);
  EXPECT_EQ(larger.code(), absl::StatusCode::kFailedPrecondition) << larger;
  EXPECT_THAT(std::string(larger.message()),
              HasSubstr("into chunks of 128 elements where the coordinator's (fp32, 256) cut 64"));
  const absl::Status int8 = join("B", CODEC_INT8, 256);  // 256 one-byte values a chunk
  EXPECT_EQ(int8.code(), absl::StatusCode::kFailedPrecondition) << int8;
  EXPECT_THAT(std::string(int8.message()), HasSubstr("comm.codec int8 with comm.chunk_bytes 256"));
  const absl::Status topk = join("C", CODEC_TOPK, 256);
  EXPECT_EQ(topk.code(), absl::StatusCode::kFailedPrecondition) << topk;
  EXPECT_THAT(std::string(topk.message()), HasSubstr("needs pushes in a dense comm.codec; the worker's is topk"));
  EXPECT_EQ(join("D", static_cast<Codec>(99), 256).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(core_->Status().workers().empty()) << "a refused join must not add a member";
  EXPECT_TRUE(join("E", CODEC_RAW, 256).ok());
  EXPECT_TRUE(join("F", CODEC_FP16, 128).ok()) << "other codec, the same chunks";
  EXPECT_TRUE(join("G", CODEC_INT8, 64).ok()) << "other codec, the same chunks";
  EXPECT_TRUE(join("H", CODEC_RAW, 0).ok()) << "not said: checked at its first push";
}

// A worker whose token ids mean other pieces (another tokenizer: another vocabulary digest) or that splits the data
// another way (data.split) is refused at Join with one line naming each; what one side did not say (an older client,
// data.format tokens, a coordinator that set no data) is not checked.
TEST_F(CoordinatorCoreTest, AWorkerWithAnotherTokenizerOrDataSplitIsRefusedAtJoin) {
  Start();
  DataSpec mine;
  mine.set_vocab_digest("0123456789abcdef");
  mine.set_split("iid");
  core_->set_data(mine);
  auto join = [&](const std::string& id, const std::string& digest, const std::string& split) {
    JoinRequest r = JoinReq(id);
    r.mutable_data()->set_vocab_digest(digest);
    r.mutable_data()->set_split(split);
    return core_->Join(r).status();
  };
  const absl::Status tokenizer = join("A", "fedcba9876543210", "iid");
  EXPECT_EQ(tokenizer.code(), absl::StatusCode::kFailedPrecondition) << tokenizer;
  EXPECT_THAT(std::string(tokenizer.message()),
              HasSubstr("data differs from the coordinator's: the tokenizer: worker's vocabulary digest is "
                        "fedcba9876543210, coordinator's 0123456789abcdef"));
  const absl::Status split = join("B", "0123456789abcdef", "contiguous");
  EXPECT_EQ(split.code(), absl::StatusCode::kFailedPrecondition) << split;
  EXPECT_THAT(std::string(split.message()), HasSubstr("data.split: worker has contiguous, coordinator has iid"));
  const absl::Status both = join("C", "fedcba9876543210", "contiguous");
  EXPECT_THAT(std::string(both.message()), HasSubstr("coordinator's 0123456789abcdef"));
  EXPECT_THAT(std::string(both.message()), HasSubstr("; data.split: worker has contiguous"));
  EXPECT_TRUE(core_->Status().workers().empty()) << "a refused join must not add a member";
  EXPECT_TRUE(join("D", "0123456789abcdef", "iid").ok());
  EXPECT_TRUE(join("E", "", "").ok()) << "not said";
  EXPECT_TRUE(join("F", "", "iid").ok()) << "no tokenizer (data.format tokens)";
  core_->set_data(DataSpec());  // a coordinator that says nothing checks nothing
  EXPECT_TRUE(join("G", "fedcba9876543210", "contiguous").ok());
}

// Under mean (and clip) each push is folded where its chunks say: any chunking joins.
TEST_F(CoordinatorCoreTest, MeanTakesAWorkerOfAnyChunking) {
  Start();
  JoinRequest r = JoinReq("A");
  r.set_push_codec(CODEC_INT8);
  r.set_chunk_bytes(12345);
  EXPECT_TRUE(core_->Join(r).ok());
}

// The set holds only the members that may still push: A declares and is then lost (no heartbeat for lease_s); B's
// push alone is the set and the round closes on it. Before, the set was every id that had declared: it held A, and
// the round waited another lease_s for A's push, then cut A and made B push again.
TEST_F(CoordinatorCoreTest, CoordinateWiseSetLeavesOutAMemberLostAfterItsHeader) {
  config_.coordinator.lease_s = 10;
  config_.coordinator.min_workers = 1;
  StartTrimmedMean(1, {"A", "B"});
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  now_ = 11;
  Beat("B");
  core_->Poll();  // A is lost
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1) << "the round closes on B's push, without waiting for lost A";
  ExpectAllClose(Theta("B"), Step(theta0, dB));
}

// A member of a fixed set that leaves (or is lost, or joins again: its process restarted) before its push finished
// will never finish it: the aggregation restarts at once, without waiting lease_s for the window, and the set forms
// again without it. And a member that joins again before the set is fixed declares anew: its old header does not
// count.
TEST_F(CoordinatorCoreTest, CoordinateWiseSetRestartsAtOnceWhenAMemberLeavesOrRejoinsUnfinished) {
  StartTrimmedMean(1, {"A", "B", "C"});
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dB = RandomDelta(), dC = RandomDelta();
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  Join("A");  // A's process restarted: its header is forgotten
  EXPECT_EQ(Push("B", 0, 1000, dB).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("C", 0, 1000, dC).code(), absl::StatusCode::kUnavailable) << "A has not declared again";
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kOk) << "the last header: the set is fixed";
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  Join("C");  // C restarted with its push unfinished (it never streamed)
  EXPECT_FALSE(Beat("A").pushed()) << "the aggregation restarted";
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("B", 0, 1000, dB).code(), absl::StatusCode::kUnavailable);
  LeaveRequest leave;
  *leave.mutable_meta() = Meta("C");
  ASSERT_TRUE(core_->Leave(leave).ok());
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok()) << "the set of A and B is fixed now that C has left";
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  // Round 2: C joins and declares, then leaves with the set fixed and its push unfinished; the round loop restarts.
  Join("C");
  const Tensors eA = RandomDelta(), eB = RandomDelta(), eC = RandomDelta();
  EXPECT_EQ(Push("A", 1, 1000, eA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("B", 1, 1000, eB).code(), absl::StatusCode::kUnavailable);
  auto c = core_->BeginPush(Header("C", 1, 1000));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(core_->Leave(leave).ok());
  core_->Poll();
  EXPECT_EQ(Push("A", 1, 1000, eA).code(), absl::StatusCode::kUnavailable) << "the set forms again without C";
  ASSERT_TRUE(Push("B", 1, 1000, eB).ok());
  ASSERT_TRUE(Push("A", 1, 1000, eA).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 2);
  EXPECT_EQ(core_->CommitPush(*c).code(), absl::StatusCode::kFailedPrecondition) << "C's old push is refused";
}

// coordinator.min_workers 3 with 3 members, one of whom is quarantined for the round (its push was a copy): past
// round_timeout_s the other two are enough (before it, a member still joining could make up the three). Before, the
// round needed 3 pushes that could never come (the quarantine lasts until the round closes) and hung forever,
// under every rule.
TEST_F(CoordinatorCoreTest, AMemberQuarantinedForTheRoundIsExcusedFromMinWorkersPastTheTimeout) {
  config_.coordinator.min_workers = 3;
  config_.coordinator.round_timeout_s = 100;
  StartTrimmedMean(1, {"A", "B", "C"});
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dC = RandomDelta();
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("B", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  EXPECT_EQ(Push("B", 0, 1000, dA).code(), absl::StatusCode::kFailedPrecondition) << "B's copy of A's push";
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("C", 0, 1000, dC).code(), absl::StatusCode::kUnavailable) << "before the timeout: 3 are needed";
  now_ = 150;
  for (const char* id : {"A", "B", "C"}) Beat(id);
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 0);
  EXPECT_THAT(core_->Status().phase_reason(), HasSubstr("of min_workers 3 less 1 quarantined"));
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok()) << "A and C are the set: B may not push in this round";
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  Tensors mean;  // trimmed_mean of two pushes trims nothing
  for (size_t i = 0; i < dA.size(); ++i) mean.push_back((dA[i] + dC[i]) / 2);
  ExpectAllClose(Theta(), Step(theta0, mean));
}

// A push that breaks after coordinator.round_timeout_s restarts the aggregation; the set forms again from every
// member that may push (min(lease_s, round_timeout_s) for them to come back), not from the first headers to arrive:
// C, back first, is not the set alone. Before, the timed-out round fixed the set from the first min_workers headers.
TEST_F(CoordinatorCoreTest, ARestartAfterTheRoundTimeoutWaitsForThePushesItDropped) {
  config_.coordinator.round_timeout_s = 100;
  StartTrimmedMean(1, {"A", "B", "C"});
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dB = RandomDelta(), dC = RandomDelta();
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Push("B", 0, 1000, dB).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  now_ = 150;
  for (const char* id : {"A", "B", "C"}) Beat(id);
  auto b = core_->BeginPush(Header("B", 0, 1000));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(FoldTensor(*b, 0, dB[0], /*only_first_half=*/true).ok());
  core_->AbortPush(*b, "connection reset");
  EXPECT_EQ(Push("C", 0, 1000, dC).code(), absl::StatusCode::kUnavailable) << "not the set alone";
  EXPECT_EQ(Push("A", 0, 1000, dA).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  ASSERT_TRUE(Push("C", 0, 1000, dC).ok());
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  Tensors median;  // trimmed_mean with trim 1 of three pushes: the coordinate-wise median
  for (size_t i = 0; i < dA.size(); ++i) median.push_back(std::get<0>(at::stack({dA[i], dB[i], dC[i]}).median(0)));
  ExpectAllClose(Theta(), Step(theta0, median));
}

// trimmed_mean's suspect count (issue 32 item 3): each member's trimmed share is the share of its push's coordinates
// the trim dropped (2 of 4 values of every coordinate, so the shares add up to 2); D, pushing -1000 x a random delta,
// is dropped almost everywhere, far beyond an even trim (kept scale under 1 / outer.flag_margin), and is suspect after
// outer.flag_rounds 2 rounds; A, B and C, dropped about a third of the time each, never count.
TEST_F(CoordinatorCoreTest, TrimmedMeanFlagsAPushTheTrimDropsAlmostEverywhere) {
  config_.outer.flag_rounds = 2;
  StartTrimmedMean(1, {"A", "B", "C", "D"});
  for (int64_t round = 0; round < 2; ++round) {
    std::map<std::string, Tensors> deltas{{"A", RandomDelta()}, {"B", RandomDelta()}, {"C", RandomDelta()}};
    for (const at::Tensor& d : RandomDelta()) deltas["D"].push_back(d * -1000);
    for (const char* id : {"A", "B", "C"})
      EXPECT_EQ(Push(id, round, 1000, deltas[id]).code(), absl::StatusCode::kUnavailable);
    for (const char* id : {"D", "A", "B", "C"}) ASSERT_TRUE(Push(id, round, 1000, deltas[id]).ok()) << id;
    core_->Poll();
    ASSERT_EQ(core_->Status().round(), round + 1);
    const StatusReply status = core_->Status();
    double sum = 0;
    for (const char* id : {"A", "B", "C", "D"}) sum += Worker(status, id).trimmed_share();
    EXPECT_NEAR(sum, 2.0, 1e-12) << "two of the four values of every coordinate are dropped";
    EXPECT_GT(Worker(status, "D").trimmed_share(), 0.95);
    EXPECT_EQ(Worker(status, "D").clipped_in_a_row(), round + 1);
    EXPECT_EQ(Worker(status, "D").suspect(), round + 1 >= 2);
    for (const char* id : {"A", "B", "C"}) {
      EXPECT_GT(Worker(status, id).trimmed_share(), 0.2) << id;
      EXPECT_LT(Worker(status, id).trimmed_share(), 0.5) << id;
      EXPECT_EQ(Worker(status, id).clipped_in_a_row(), 0) << id;
      EXPECT_FALSE(Worker(status, id).suspect()) << id;
    }
  }
}

// trimmed_mean with a trim too small for its attackers (outer.trim 1, two of five push -1000 x the same delta, E a
// little larger): at each coordinate E is dropped as the extreme and D, next to it, is kept, so D is dropped less than
// evenly; what gives D away is its norm, 1000 x the round's median (nothing scaled it, as clip would): with
// outer.flag_rounds 1 both are suspect at once; the honest members are not.
TEST_F(CoordinatorCoreTest, TrimmedMeanFlagsByNormAPushTheTrimCannotDrop) {
  config_.outer.flag_rounds = 1;
  StartTrimmedMean(1, {"A", "B", "C", "D", "E"});
  std::map<std::string, Tensors> deltas{{"A", RandomDelta()}, {"B", RandomDelta()}, {"C", RandomDelta()}};
  for (const at::Tensor& d : RandomDelta()) {
    deltas["D"].push_back(d * -1000);
    deltas["E"].push_back(d * -1000 * (1 + 1e-3));  // not byte-identical (the duplicate check)
  }
  for (const char* id : {"A", "B", "C", "D"})
    EXPECT_EQ(Push(id, 0, 1000, deltas[id]).code(), absl::StatusCode::kUnavailable);
  for (const char* id : {"E", "A", "B", "C", "D"}) ASSERT_TRUE(Push(id, 0, 1000, deltas[id]).ok()) << id;
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  const StatusReply status = core_->Status();
  EXPECT_GT(Worker(status, "E").trimmed_share(), 0.9);
  EXPECT_LT(Worker(status, "D").trimmed_share(), 0.1) << "kept behind E at nearly every coordinate";
  for (const char* id : {"D", "E"}) EXPECT_TRUE(Worker(status, id).suspect()) << id;
  for (const char* id : {"A", "B", "C"}) EXPECT_FALSE(Worker(status, id).suspect()) << id;
}

// outer.momentum_bound under the coordinate-wise rules: judged, not applied. In round 2, E pushes round 1's outer
// momentum (as a stale or replayed delta leans on it) plus a fresh random delta: its norm and its coordinates pass as
// honest (trimmed share and norm within the flag margin), its projection on the momentum does not. With
// outer.flag_rounds 1 E is suspect at once under both rules, its cosine with the momentum shown, nothing bounded
// (theta is trimmed_mean's plain step); with outer.momentum_bound 0 the momentum is not watched and E passes.
TEST_F(RobustAggregationTest, CoordinateWiseRulesFlagAPushThatLeansOnTheOuterMomentum) {
  const std::vector<std::string> ids = {"A", "B", "C", "D", "E"};
  struct Case {
    Aggregation rule;
    double bound;
  };
  for (const Case c : {Case{Aggregation::kTrimmedMean, 1.5}, Case{Aggregation::kCenteredClip, 1.5},
                       Case{Aggregation::kTrimmedMean, 0.0}}) {
    SCOPED_TRACE(absl::StrCat(std::string(EnumName(c.rule)), " momentum_bound ", c.bound));
    at::manual_seed(33);
    config_.outer.aggregation = c.rule;
    config_.outer.momentum_bound = c.bound;
    config_.outer.flag_rounds = 1;
    config_.outer.trim = 1;
    config_.outer.window_chunks = 1000;
    const FirstRound first = StartWithARandomRound(ids);
    ASSERT_FALSE(HasFatalFailure());
    const Tensors& theta1 = first.theta1;
    Tensors m;  // the first step's momentum is its delta: theta_1 = theta_0 - lr (1 + mu) delta
    for (size_t t = 0; t < theta1.size(); ++t) m.push_back((first.theta0[t] - theta1[t]) / (kLr * (1 + kMu)));
    std::map<std::string, Tensors> round2;
    for (const std::string& id : ids) round2[id] = RandomDelta();
    for (size_t t = 0; t < m.size(); ++t) round2["E"][t] = round2["E"][t] + m[t];
    PushRound(round2, 1);
    const StatusReply status = core_->Status();
    std::vector<double> norms;
    for (const std::string& id : ids) norms.push_back(Worker(status, id).last_push_norm());
    std::sort(norms.begin(), norms.end());
    const WorkerStatus e = Worker(status, "E");
    EXPECT_LT(e.last_push_norm(), 2 * norms[2]) << "not far by its norm";
    if (c.rule == Aggregation::kTrimmedMean) EXPECT_LT(e.trimmed_share(), 0.7) << "not far by the trim";
    EXPECT_FALSE(e.momentum_bounded()) << "a coordinate-wise rule's result is not bounded along the momentum";
    EXPECT_EQ(e.suspect(), c.bound > 0);
    if (c.bound > 0) EXPECT_GT(e.momentum_cosine(), 0.3);
    for (const char* id : {"A", "B", "C", "D"}) {
      EXPECT_FALSE(Worker(status, id).suspect()) << id;
      EXPECT_LT(std::fabs(Worker(status, id).momentum_cosine()), 0.1) << id;
    }
    if (c.rule == Aggregation::kTrimmedMean) {
      Tensors want;
      for (size_t t = 0; t < m.size(); ++t) {
        std::vector<at::Tensor> column;
        for (const std::string& id : ids) column.push_back(round2[id][t]);
        const at::Tensor sorted = std::get<0>(at::stack(column).to(at::kDouble).sort(0));
        want.push_back(sorted.narrow(0, 1, 3).mean(0).to(at::kFloat));
      }
      ExpectAllClose(Theta(), Step(theta1, want, m));
    }
  }
}

}  // namespace
}  // namespace diloco

namespace diloco {
namespace {

// A fake evaluation that overflows as a model's logits do: NaN once some |theta| passes 1e6, else the mean square.
class OverflowingEvaluator : public Evaluator {
 public:
  double Evaluate(const NamedTensors& theta) override {
    double sum = 0;
    for (const auto& [name, t] : theta) {
      if (t.abs().max().item<float>() > 1e6f) return std::numeric_limits<double>::quiet_NaN();
      sum += t.to(at::kDouble).pow(2).mean().item<double>();
    }
    return sum;
  }
};

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The non-finite guard's evaluation half (issue 32 item 4): A's push is finite and so is the step it makes, but the
// stepped theta evaluates to NaN. The round is not committed: a checkpoint written after it holds the same bytes as
// one written before (theta and the momentum bit for bit, and the evals), the pushes are logged with their norms, A
// is quarantined at once, and the redo with B alone is exactly B's step from theta_1 and its momentum.
TEST_F(CoordinatorCoreTest, ARoundWhoseEvaluationIsNotFiniteIsDiscardedWithThetaAndMomentumBitForBit) {
  config_.coordinator.eval_every = 1;
  config_.coordinator.min_workers = 1;  // the redo runs without the quarantined A
  auto created = CoordinatorCore::Create(config_, TinyTheta0(config_.model), std::make_unique<OverflowingEvaluator>(),
                                         false, [this] { return now_.load(); });
  ASSERT_TRUE(created.ok()) << created.status();
  core_ = std::move(*created);
  Join("A");
  Join("B");
  const Tensors theta0 = Theta();
  const Tensors dA = RandomDelta(), dB = RandomDelta();
  ASSERT_TRUE(Push("A", 0, 1000, dA).ok());
  ASSERT_TRUE(Push("B", 0, 1000, dB).ok());
  core_->Poll();
  ASSERT_EQ(core_->Status().round(), 1);
  const Tensors buf1 = Average({dA, dB}, {1000, 1000});
  const Tensors theta1 = Theta();
  absl::StatusOr<WrittenCheckpoint> before = core_->CheckpointNow();
  ASSERT_TRUE(before.ok()) << before.status();
  const std::string before_bytes = FileBytes(before->path);
  ASSERT_FALSE(before_bytes.empty());

  Tensors big;  // finite, and so is the step (|theta| ~ 1e8), but the evaluation overflows
  for (const at::Tensor& d : dA) big.push_back(at::full_like(d, 1.0e8f));
  const Tensors dB2 = RandomDelta();
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(200);
  spdlog::default_logger()->sinks().push_back(log);
  ASSERT_TRUE(Push("A", 1, 1000, big).ok());
  ASSERT_TRUE(Push("B", 1, 1000, dB2).ok());
  core_->Poll();
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(core_->Status().round(), 1);
  EXPECT_EQ(core_->Status().evals_size(), 2) << "theta_0's and round 1's; none for the refused round";
  absl::StatusOr<WrittenCheckpoint> after = core_->CheckpointNow();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->round, 1);
  EXPECT_TRUE(FileBytes(after->path) == before_bytes) << "theta, the momentum and the evals must be as they were";
  std::string logged;
  for (const std::string& line : log->last_formatted()) logged += line;
  EXPECT_THAT(logged, HasSubstr("round 2 discarded: the evaluation of its stepped theta is not finite"));
  EXPECT_THAT(logged, HasSubstr("A norm "));
  EXPECT_THAT(logged, HasSubstr("quarantined: worker A"));
  EXPECT_FALSE(Beat("B").pushed()) << "B's push was discarded with the round: it must push again";
  EXPECT_EQ(Push("A", 1, 1000, big).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Push("B", 1, 1000, dB2).ok());
  core_->Poll();
  EXPECT_EQ(core_->Status().round(), 2);
  ExpectAllClose(Theta("B"), Step(theta1, dB2, buf1));
  EXPECT_EQ(core_->Status().evals_size(), 3);
}

}  // namespace
}  // namespace diloco
