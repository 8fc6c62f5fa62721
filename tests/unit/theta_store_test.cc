// ThetaStore (coordinator/theta_store.h): the synchronous store steps theta in place (snapshots of the old round
// read as stale, the step waits for a steady read) and the asynchronous one publishes immutable versions, keeps
// theta_{t-1} for pulls and reuses its memory once no pull holds it, and snapshots the momentum per version.
#include "coordinator/theta_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

namespace diloco {
namespace {

constexpr double kLr = 0.5;
constexpr double kMu = 0.9;

Config StoreConfig(OuterMode mode, OuterOptimizerKind optimizer) {
  Config config;
  config.outer.mode = mode;
  config.outer.optimizer = optimizer;
  config.outer.lr = kLr;
  config.outer.momentum = kMu;
  config.outer.rounds = 3;
  config.workers.count = 1;
  return config;
}

std::shared_ptr<ParamSnapshot> Theta0() {
  auto theta = std::make_shared<ParamSnapshot>();
  theta->params.emplace_back("a", at::arange(6, at::kFloat).view({2, 3}));
  theta->params.emplace_back("b", at::full({4}, 2.0f));
  return theta;
}

std::vector<at::Tensor> Delta(float v) { return {at::full({2, 3}, v), at::full({4}, v)}; }

TEST(ThetaStoreTest, SyncStepsInPlaceAndOldSnapshotsReadAsStale) {
  std::unique_ptr<ThetaStore> store =
      ThetaStore::Create(StoreConfig(OuterMode::kSync, OuterOptimizerKind::kNesterov), Theta0(), {});
  const std::shared_ptr<const ParamSnapshot> before = store->current();
  ASSERT_NE(before->guard, nullptr) << "synchronous snapshots are guarded";
  const at::Tensor b0 = before->params[1].second.clone();
  std::shared_ptr<ParamSnapshot> next = store->Step(Delta(1.0f), nullptr);
  EXPECT_EQ(next->round, 1);
  EXPECT_FALSE(next->complete);
  EXPECT_EQ(next->params[0].second.data_ptr(), before->params[0].second.data_ptr()) << "one copy of theta";
  EXPECT_FALSE(ReadSnapshot(*before, [] {})) << "a pull of round 0 finds theta moved on";
  EXPECT_EQ(store->round(), 0) << "stepped, not yet published";
  store->Publish(next);
  EXPECT_EQ(store->round(), 1);
  EXPECT_TRUE(ReadSnapshot(*store->current(), [] {}));
  // Nesterov's first step: buf = delta; theta -= lr * (delta + mu * buf).
  const at::Tensor expected = b0 - kLr * (1.0 + kMu);
  EXPECT_TRUE(at::allclose(store->current()->params[1].second, expected));
  absl::Status read = store->ReadSteady([&](const SteadyTheta& theta) {
    EXPECT_EQ(theta.round, 1);
    EXPECT_EQ(theta.params[1].second.data_ptr(), next->params[1].second.data_ptr());
    EXPECT_EQ(theta.momentum.size(), 2u);
    EXPECT_TRUE(at::allclose(theta.momentum[1], at::full({4}, 1.0f)));
    return absl::OkStatus();
  });
  EXPECT_TRUE(read.ok());
}

TEST(ThetaStoreTest, SyncStepWaitsForASteadyRead) {
  std::unique_ptr<ThetaStore> store =
      ThetaStore::Create(StoreConfig(OuterMode::kSync, OuterOptimizerKind::kNesterov), Theta0(), {});
  std::atomic<bool> reading{false}, stepped{false};
  std::thread step;
  absl::Status read = store->ReadSteady([&](const SteadyTheta& theta) {
    reading = true;
    step = std::thread([&] {
      store->Publish(store->Step(Delta(1.0f), nullptr));
      stepped = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(stepped) << "the step must wait while a checkpoint reads theta";
    EXPECT_EQ(theta.round, 0);
    return absl::OkStatus();
  });
  step.join();
  EXPECT_TRUE(read.ok());
  EXPECT_TRUE(stepped);
  EXPECT_EQ(store->round(), 1);
}

TEST(ThetaStoreTest, AsyncKeepsVersionsAndRecyclesTheOldestWhenNoPullHoldsIt) {
  std::unique_ptr<ThetaStore> store =
      ThetaStore::Create(StoreConfig(OuterMode::kAsync, OuterOptimizerKind::kSgd), Theta0(), {});
  std::shared_ptr<const ParamSnapshot> v0 = store->current();
  EXPECT_EQ(v0->guard, nullptr) << "asynchronous snapshots are immutable";
  const at::Tensor a0 = v0->params[0].second.clone();
  const void* v0_memory = v0->params[0].second.data_ptr();
  store->Publish(store->Step(Delta(1.0f), nullptr));
  EXPECT_TRUE(ReadSnapshot(*v0, [] {})) << "version 0 stays readable";
  EXPECT_TRUE(v0->params[0].second.equal(a0)) << "and unchanged";
  EXPECT_NE(store->current()->params[0].second.data_ptr(), v0_memory);
  absl::Status read = store->ReadSteady([&](const SteadyTheta& theta) {
    EXPECT_EQ(theta.round, 1);
    EXPECT_TRUE(at::allclose(theta.momentum[0], at::full({2, 3}, 1.0f))) << "the momentum after version 1's step";
    return absl::OkStatus();
  });
  EXPECT_TRUE(read.ok());
  v0.reset();  // no pull holds version 0 any more: version 2 is written into its memory
  std::shared_ptr<ParamSnapshot> v2 = store->Step(Delta(1.0f), nullptr);
  EXPECT_EQ(v2->round, 2);
  EXPECT_EQ(v2->params[0].second.data_ptr(), v0_memory);
  // SGD with momentum (no nesterov): buf1 = 1, buf2 = mu + 1; theta2 = theta0 - lr * (1 + mu + 1).
  EXPECT_TRUE(at::allclose(v2->params[0].second, a0 - kLr * (2.0 + kMu)));
}

TEST(ThetaStoreTest, AsyncDoesNotRecycleAVersionAPullHolds) {
  std::unique_ptr<ThetaStore> store =
      ThetaStore::Create(StoreConfig(OuterMode::kAsync, OuterOptimizerKind::kSgd), Theta0(), {});
  const std::shared_ptr<const ParamSnapshot> v0 = store->current();
  const at::Tensor a0 = v0->params[0].second.clone();
  store->Publish(store->Step(Delta(1.0f), nullptr));
  store->Publish(store->Step(Delta(1.0f), nullptr));
  EXPECT_TRUE(v0->params[0].second.equal(a0)) << "a pull still reading version 0 sees it unchanged";
  EXPECT_EQ(store->round(), 2);
  EXPECT_FALSE(store->current()->complete);
}

TEST(ThetaStoreTest, TheLastRoundIsComplete) {
  std::unique_ptr<ThetaStore> store =
      ThetaStore::Create(StoreConfig(OuterMode::kSync, OuterOptimizerKind::kSgd), Theta0(), {});
  for (int i = 0; i < 3; ++i) store->Publish(store->Step(Delta(0.1f), nullptr));
  EXPECT_EQ(store->round(), 3);
  EXPECT_TRUE(store->current()->complete);
}

// A steady read (a checkpoint) sees the tensors with the round they hold: a synchronous step without an evaluation
// check moved the tensors to theta_{t+1} and then, in a second critical section, the round, so a checkpoint read in
// between saved theta_{t+1} as round t (a resume steps that round again). With SGD without momentum, lr 0.5 and deltas
// of 1, "b" holds 2 - 0.5 t in round t. The reader runs while the store steps; the gap is short, so it runs for 2000
// steps.
TEST(ThetaStoreTest, ASteadyReadSeesTheRoundTheTensorsHold) {
  Config config = StoreConfig(OuterMode::kSync, OuterOptimizerKind::kSgd);
  config.outer.rounds = 1000000;
  config.outer.momentum = 0;
  std::unique_ptr<ThetaStore> store = ThetaStore::Create(config, Theta0(), {});
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, mismatched{0};
  std::thread reader([&] {
    while (!done) {
      ASSERT_TRUE(store
                      ->ReadSteady([&](const SteadyTheta& theta) {
                        const float b = theta.params[1].second[0].item<float>();
                        if (b != 2.0f - 0.5f * static_cast<float>(theta.round)) ++mismatched;
                        ++reads;
                        return absl::OkStatus();
                      })
                      .ok());
    }
  });
  // At least 2000 steps, and on until the reader has read 100 times (a loaded machine may start it late).
  for (int t = 0; t < 2000 || (reads < 100 && t < 500000); ++t) store->Publish(store->Step(Delta(1.0f), nullptr));
  done = true;
  reader.join();
  EXPECT_GE(reads.load(), 100);
  EXPECT_EQ(mismatched.load(), 0) << "of " << reads.load() << " steady reads, some saw theta_{t+1} as round t";
}

// The evaluation guard (issue 32 item 4): a check that refuses the stepped theta (ThetaStore::Step's `check`) leaves
// theta and the optimizer state as they were, bit for bit: the store then steps exactly as one that never saw the
// refused deltas. Refused at the first step (no momentum yet) and at a later one, in both modes (the asynchronous one
// with Delayed Nesterov's m, acc and arrival count).
class CheckedStepTest : public ::testing::TestWithParam<OuterMode> {};

std::vector<at::Tensor> Momentum(ThetaStore& store) {
  std::vector<at::Tensor> out;
  EXPECT_TRUE(store
                  .ReadSteady([&](const SteadyTheta& theta) {
                    for (const at::Tensor& m : theta.momentum) out.push_back(m.clone());
                    return absl::OkStatus();
                  })
                  .ok());
  return out;
}

void ExpectSameBits(ThetaStore& store, ThetaStore& reference) {
  const std::shared_ptr<const ParamSnapshot> a = store.current(), b = reference.current();
  ASSERT_EQ(a->round, b->round);
  for (size_t i = 0; i < a->params.size(); ++i) EXPECT_TRUE(a->params[i].second.equal(b->params[i].second)) << i;
  const std::vector<at::Tensor> ma = Momentum(store), mb = Momentum(reference);
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) EXPECT_TRUE(ma[i].equal(mb[i])) << "momentum " << i;
}

TEST_P(CheckedStepTest, ARefusedStepLeavesThetaAndTheMomentumBitForBit) {
  Config config = StoreConfig(GetParam(), OuterOptimizerKind::kNesterov);
  config.outer.rounds = 10;
  config.coordinator.checkpoint_dir = ::testing::TempDir() + "/checked_step_spill";
  std::unique_ptr<ThetaStore> store = ThetaStore::Create(config, Theta0(), {});
  std::unique_ptr<ThetaStore> reference = ThetaStore::Create(config, Theta0(), {});
  const bool sync = GetParam() == OuterMode::kSync;
  int checks = 0;
  const auto refuse = [&](const ParamSnapshot& candidate) {
    ++checks;
    EXPECT_EQ(candidate.round, store->round() + 1) << "the stepped theta, not yet published";
    // Synchronous: the published tensors hold the candidate meanwhile, so a reader of theta_t is refused; asynchronous:
    // theta_t is untouched and stays readable.
    EXPECT_EQ(ReadSnapshot(*store->current(), [] {}), !sync);
    throw NonFiniteStep("refused");
  };
  const auto refused_step = [&](float v) {
    const std::shared_ptr<const ParamSnapshot> before = store->current();
    EXPECT_THROW(store->Step(Delta(v), nullptr, refuse), NonFiniteStep);
    EXPECT_EQ(store->round(), before->round);
    if (sync) {
      EXPECT_FALSE(ReadSnapshot(*before, [] {})) << "a pull that may have read the candidate's bytes starts over";
      EXPECT_NE(store->current().get(), before.get());
    }
    EXPECT_TRUE(ReadSnapshot(*store->current(), [] {}));
    ExpectSameBits(*store, *reference);
  };
  const auto accepted_step = [&](float v) {
    int accepted = 0;
    store->Publish(store->Step(Delta(v), nullptr, [&](const ParamSnapshot&) { ++accepted; }));
    reference->Publish(reference->Step(Delta(v), nullptr));
    EXPECT_EQ(accepted, 1);
    ExpectSameBits(*store, *reference);
  };
  refused_step(1000.0f);  // the first step: no momentum yet
  accepted_step(0.25f);
  refused_step(-7.0f);  // with momentum
  accepted_step(0.5f);
  accepted_step(-0.125f);
  EXPECT_EQ(checks, 2);
  EXPECT_EQ(store->round(), 3);
}

// A synchronous checked step whose spill file cannot be written (checkpoint_dir under a regular file here; a full
// disk alike) steps without the guard: it commits as an unchecked step would, and the check still runs, its refusal
// logged instead of thrown. Before, the step threw: the round was discarded and its redo failed the same way,
// forever.
TEST(ThetaStoreTest, ASyncStepThatCannotSpillCommitsAndStillRunsTheCheck) {
  Config config = StoreConfig(OuterMode::kSync, OuterOptimizerKind::kNesterov);
  config.outer.rounds = 10;
  const std::string file = ::testing::TempDir() + "/spill_dir_is_a_file";
  { std::ofstream(file) << "not a directory"; }
  config.coordinator.checkpoint_dir = file + "/checkpoints";
  std::unique_ptr<ThetaStore> store = ThetaStore::Create(config, Theta0(), {});
  std::unique_ptr<ThetaStore> reference = ThetaStore::Create(config, Theta0(), {});
  int checks = 0;
  std::shared_ptr<ParamSnapshot> next;
  ASSERT_NO_THROW(next = store->Step(Delta(0.5f), nullptr, [&](const ParamSnapshot& candidate) {
    ++checks;
    EXPECT_EQ(candidate.round, 1);
    throw NonFiniteStep("refused");
  }));
  store->Publish(next);
  reference->Publish(reference->Step(Delta(0.5f), nullptr));
  EXPECT_EQ(checks, 1);
  EXPECT_EQ(store->round(), 1);
  ExpectSameBits(*store, *reference);
}

INSTANTIATE_TEST_SUITE_P(Modes, CheckedStepTest, ::testing::Values(OuterMode::kSync, OuterMode::kAsync));

}  // namespace
}  // namespace diloco
