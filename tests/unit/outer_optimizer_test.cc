// OuterOptimizer against PyTorch's torch.optim.SGD: golden values from tests/golden/make_outer_golden.py.
#include "coordinator/outer_optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace outer_golden {
#include "tests/unit/outer_golden.inc"
}  // namespace outer_golden

namespace diloco {
namespace {

using outer_golden::GoldenCase;
using outer_golden::kSteps;

at::Tensor FromFloats(const float* values, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return at::from_blob(const_cast<float*>(values), {n}, at::kFloat).clone().reshape(shape);
}

// Every element within 1e-6 relative (1e-6 absolute near zero) of the golden values.
void ExpectClose(const at::Tensor& actual, const float* expected, const std::string& what) {
  at::Tensor flat = actual.contiguous().view({-1});
  ASSERT_EQ(flat.scalar_type(), at::kFloat) << what;
  const float* a = flat.data_ptr<float>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const double tol = 1e-6 * std::max(1.0, std::fabs(static_cast<double>(expected[i])));
    EXPECT_NEAR(a[i], expected[i], tol) << what << " element " << i;
  }
}

// Three outer steps of case `c`, every theta and the final momentum buffers against torch.optim.SGD.
void ExpectMatchesTorch(const GoldenCase& c) {
  OuterOptimizer opt(OuterOptimizer::KindFromName(c.optimizer), c.lr, c.momentum);
  EXPECT_TRUE(opt.momentum_buffers().empty());
  std::vector<at::Tensor> theta = {FromFloats(outer_golden::kTheta0A, {3}), FromFloats(outer_golden::kTheta0B, {2, 2})};
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<at::Tensor> before = {theta[0].clone(), theta[1].clone()};
    const std::vector<at::Tensor> delta = {FromFloats(outer_golden::kDeltaA[step], {3}),
                                           FromFloats(outer_golden::kDeltaB[step], {2, 2})};
    std::vector<at::Tensor> next = opt.Step(theta, delta);
    ASSERT_EQ(next.size(), 2u);
    // Step returns new tensors; theta (which pulls in flight may still read) is left untouched.
    EXPECT_TRUE(theta[0].equal(before[0])) << "step " << step + 1 << " modified theta[0] in place";
    EXPECT_TRUE(theta[1].equal(before[1])) << "step " << step + 1 << " modified theta[1] in place";
    EXPECT_EQ(next[1].sizes(), theta[1].sizes());
    ExpectClose(next[0], c.theta_a[step], std::string(c.name) + " theta_a after step " + std::to_string(step + 1));
    ExpectClose(next[1], c.theta_b[step], std::string(c.name) + " theta_b after step " + std::to_string(step + 1));
    theta = next;
  }
  if (c.has_buffers) {
    ASSERT_EQ(opt.momentum_buffers().size(), 2u);
    ExpectClose(opt.momentum_buffers()[0], c.buffer_a, std::string(c.name) + " momentum buffer a");
    ExpectClose(opt.momentum_buffers()[1], c.buffer_b, std::string(c.name) + " momentum buffer b");
  } else {
    EXPECT_TRUE(opt.momentum_buffers().empty()) << "momentum 0 keeps no buffers, like PyTorch";
  }
}

TEST(OuterOptimizerGoldenTest, NesterovMatchesTorch) { ExpectMatchesTorch(outer_golden::kCases[0]); }
TEST(OuterOptimizerGoldenTest, SgdMomentumMatchesTorch) { ExpectMatchesTorch(outer_golden::kCases[1]); }
TEST(OuterOptimizerGoldenTest, FedAvgMatchesTorch) { ExpectMatchesTorch(outer_golden::kCases[2]); }

// StepInPlace (the synchronous coordinator's step: one copy of theta) against the same torch.optim.SGD goldens, with
// and without Reserve's buffers, writing over theta and the momentum and allocating nothing after the first step.
void ExpectInPlaceMatchesTorch(const GoldenCase& c, bool reserve) {
  const std::string what = std::string(c.name) + (reserve ? " (reserved)" : "");
  OuterOptimizer opt(OuterOptimizer::KindFromName(c.optimizer), c.lr, c.momentum);
  std::vector<at::Tensor> theta = {FromFloats(outer_golden::kTheta0A, {3}), FromFloats(outer_golden::kTheta0B, {2, 2})};
  if (reserve) opt.Reserve(theta);
  EXPECT_TRUE(opt.momentum_buffers().empty()) << what << ": Reserve does not make a momentum";
  const void* theta_a = theta[0].data_ptr();
  const void* buffer_a = nullptr;
  for (int step = 0; step < kSteps; ++step) {
    opt.StepInPlace(theta,
                    {FromFloats(outer_golden::kDeltaA[step], {3}), FromFloats(outer_golden::kDeltaB[step], {2, 2})});
    EXPECT_EQ(theta[0].data_ptr(), theta_a) << what;
    ExpectClose(theta[0], c.theta_a[step], what + " theta_a after step " + std::to_string(step + 1));
    ExpectClose(theta[1], c.theta_b[step], what + " theta_b after step " + std::to_string(step + 1));
    if (!c.has_buffers) continue;
    if (step == 0) buffer_a = opt.momentum_buffers()[0].data_ptr();
    EXPECT_EQ(opt.momentum_buffers()[0].data_ptr(), buffer_a) << what << ": the momentum is updated in place";
  }
  if (c.has_buffers) {
    ASSERT_EQ(opt.momentum_buffers().size(), 2u);
    ExpectClose(opt.momentum_buffers()[0], c.buffer_a, what + " momentum buffer a");
    ExpectClose(opt.momentum_buffers()[1], c.buffer_b, what + " momentum buffer b");
  } else {
    EXPECT_TRUE(opt.momentum_buffers().empty()) << what;
  }
}

TEST(OuterOptimizerGoldenTest, InPlaceStepsMatchTorch) {
  for (const GoldenCase& c : outer_golden::kCases) {
    ExpectInPlaceMatchesTorch(c, /*reserve=*/false);
    ExpectInPlaceMatchesTorch(c, /*reserve=*/true);
  }
}

// In place and into new tensors give the same bits, fragment by fragment too; a refused step writes nothing.
TEST(OuterOptimizerTest, InPlaceEqualsStepBitForBitAndARefusalWritesNothing) {
  at::manual_seed(11);
  std::vector<at::Tensor> a = {at::randn({1000}), at::randn({37, 5})};
  std::vector<at::Tensor> b = {a[0].clone(), a[1].clone()};
  OuterOptimizer stepping(OuterOptimizer::Kind::kNesterov, 0.7, 0.9),
      in_place(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
  in_place.Reserve(b);
  const std::vector<size_t> first = {0}, second = {1};
  for (int round = 0; round < 6; ++round) {
    const std::vector<at::Tensor> delta = {at::randn({1000}) * 0.01, at::randn({37, 5}) * 0.01};
    const std::vector<size_t>* only = round < 2 ? nullptr : (round % 2 == 0 ? &first : &second);
    a = stepping.Step(a, delta, {}, only);
    in_place.StepInPlace(b, delta, only);
    EXPECT_TRUE(a[0].equal(b[0]) && a[1].equal(b[1])) << "round " << round;
    EXPECT_TRUE(stepping.momentum_buffers()[1].equal(in_place.momentum_buffers()[1])) << "round " << round;
  }
  const at::Tensor before = b[0].clone(), momentum_before = in_place.momentum_buffers()[0].clone();
  EXPECT_THROW(in_place.StepInPlace(b, {at::randn({1000}), at::randn({5, 37})}), std::invalid_argument);
  EXPECT_TRUE(b[0].equal(before)) << "the first tensor was written before the second was refused";
  EXPECT_TRUE(in_place.momentum_buffers()[0].equal(momentum_before));
}

// The first in-place step's momentum is the delta bit for bit (torch.optim.SGD: buf = clone(grad)), signed zeros
// included, whether its buffers are Reserve's or new, and also after Step() left non-zero spares and the momentum was
// reset (a checkpoint without one): the first step's kernel reads the buffer it writes, so it must be handed zeros.
TEST(OuterOptimizerTest, FirstInPlaceStepsMomentumIsTheDeltaBitForBit) {
  auto bits_equal = [](const at::Tensor& a, const at::Tensor& b) {
    return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * sizeof(float)) == 0;
  };
  const float delta_values[] = {-0.0f, 0.0f, 1e-40f, -3.5f, 0.25f, -0.0f};
  const float theta_values[] = {0.0f, -0.0f, 1.0f, -0.0f, 2.0f, 0.0f};
  const at::Tensor delta = FromFloats(delta_values, {6}), theta0 = FromFloats(theta_values, {6});
  for (int setup = 0; setup < 3; ++setup) {
    OuterOptimizer in_place(OuterOptimizer::Kind::kNesterov, 0.7, 0.9),
        stepping(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
    std::vector<at::Tensor> theta = {theta0.clone()};
    if (setup == 1) in_place.Reserve(theta);
    if (setup == 2) {  // spares left by Step(), then the momentum reset
      for (int i = 0; i < 3; ++i) in_place.Step({theta0.clone()}, {at::full({6}, -1.0f)}, {}, nullptr);
      in_place.set_momentum_buffers({});
    }
    in_place.StepInPlace(theta, {delta});
    const std::vector<at::Tensor> expected = stepping.Step({theta0.clone()}, {delta}, {}, nullptr);
    ASSERT_EQ(in_place.momentum_buffers().size(), 1u);
    EXPECT_TRUE(bits_equal(in_place.momentum_buffers()[0], delta)) << "setup " << setup;
    EXPECT_TRUE(bits_equal(theta[0], expected[0])) << "setup " << setup;
  }
}

TEST(OuterOptimizerGoldenTest, CasesAreTheOnesNamed) {
  ASSERT_EQ(std::size(outer_golden::kCases), 3u);
  EXPECT_STREQ(outer_golden::kCases[0].name, "kNesterov");
  EXPECT_STREQ(outer_golden::kCases[1].name, "kSgdMomentum");
  EXPECT_STREQ(outer_golden::kCases[2].name, "kFedAvg");
}

// Restoring the momentum buffers (as a checkpoint load does) continues the trajectory exactly: step 3 from restored
// buffers equals step 3 of an uninterrupted run.
// Streaming DiLoCo steps one fragment at a time: stepping A, then B, then A... with each tensor's golden deltas
// must give each tensor exactly its own torch.optim.SGD trajectory (its momentum untouched while the other steps),
// and a tensor outside `only` comes back as the same tensor whatever its delta says.
TEST(OuterOptimizerGoldenTest, FragmentwiseStepsFollowEachTensorsTorchTrajectory) {
  const GoldenCase& c = outer_golden::kCases[0];  // nesterov
  OuterOptimizer opt(OuterOptimizer::KindFromName(c.optimizer), c.lr, c.momentum);
  std::vector<at::Tensor> theta = {FromFloats(outer_golden::kTheta0A, {3}), FromFloats(outer_golden::kTheta0B, {2, 2})};
  const std::vector<size_t> only_a = {0}, only_b = {1};
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor garbage_a = at::full({3}, 1e6f), garbage_b = at::full({2, 2}, 1e6f);
    std::vector<at::Tensor> next =
        opt.Step(theta, {FromFloats(outer_golden::kDeltaA[step], {3}), garbage_b}, {}, &only_a);
    EXPECT_TRUE(next[1].is_same(theta[1])) << "step " << step + 1;
    theta = next;
    next = opt.Step(theta, {garbage_a, FromFloats(outer_golden::kDeltaB[step], {2, 2})}, {}, &only_b);
    EXPECT_TRUE(next[0].is_same(theta[0])) << "step " << step + 1;
    theta = next;
    ExpectClose(theta[0], c.theta_a[step], "fragment-wise theta_a after step " + std::to_string(step + 1));
    ExpectClose(theta[1], c.theta_b[step], "fragment-wise theta_b after step " + std::to_string(step + 1));
  }
  ASSERT_EQ(opt.momentum_buffers().size(), 2u);
  ExpectClose(opt.momentum_buffers()[0], c.buffer_a, "fragment-wise momentum buffer a");
  ExpectClose(opt.momentum_buffers()[1], c.buffer_b, "fragment-wise momentum buffer b");
}

TEST(OuterOptimizerTest, RestoredMomentumContinuesTrajectory) {
  const GoldenCase& c = outer_golden::kCases[0];
  OuterOptimizer first(OuterOptimizer::KindFromName(c.optimizer), c.lr, c.momentum);
  std::vector<at::Tensor> theta = {FromFloats(outer_golden::kTheta0A, {3}), FromFloats(outer_golden::kTheta0B, {2, 2})};
  for (int step = 0; step < 2; ++step) {
    theta = first.Step(theta,
                       {FromFloats(outer_golden::kDeltaA[step], {3}), FromFloats(outer_golden::kDeltaB[step], {2, 2})});
  }
  OuterOptimizer resumed(OuterOptimizer::Kind::kNesterov, c.lr, c.momentum);
  resumed.set_momentum_buffers({first.momentum_buffers()[0].clone(), first.momentum_buffers()[1].clone()});
  std::vector<at::Tensor> next =
      resumed.Step(theta, {FromFloats(outer_golden::kDeltaA[2], {3}), FromFloats(outer_golden::kDeltaB[2], {2, 2})});
  ExpectClose(next[0], c.theta_a[2], "resumed theta_a");
  ExpectClose(next[1], c.theta_b[2], "resumed theta_b");
}

// momentum_buffers() may be copied for a checkpoint while the next Step runs: Step must replace the buffers with
// new tensors, not write into the ones already handed out.
TEST(OuterOptimizerTest, PublishedMomentumBuffersStayIntact) {
  OuterOptimizer opt(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
  std::vector<at::Tensor> theta = {FromFloats(outer_golden::kTheta0A, {3})};
  theta = opt.Step(theta, {FromFloats(outer_golden::kDeltaA[0], {3})});
  const std::vector<at::Tensor> published = opt.momentum_buffers();  // shallow copy, shares storage
  const at::Tensor snapshot = published[0].clone();
  opt.Step(theta, {FromFloats(outer_golden::kDeltaA[1], {3})});
  EXPECT_TRUE(published[0].equal(snapshot)) << "Step wrote into a buffer already handed out";
  EXPECT_FALSE(opt.momentum_buffers()[0].equal(snapshot)) << "the optimizer's own buffer did advance";
}

// Step writes into recycled memory only when nobody else holds it, and the results do not depend on it.
TEST(OuterOptimizerTest, RecycledOutputsGiveTheSameResultsAndReuseOnlyUnsharedMemory) {
  at::manual_seed(7);
  const at::Tensor theta0 = at::randn({64});
  std::vector<at::Tensor> deltas;
  for (int i = 0; i < 4; ++i) deltas.push_back(at::randn({64}) * 0.01);
  OuterOptimizer plain(OuterOptimizer::Kind::kNesterov, 0.7, 0.9), recycling(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
  std::vector<at::Tensor> a = {theta0}, b = {theta0}, previous;
  for (const at::Tensor& d : deltas) {
    a = plain.Step(a, {d});
    std::vector<at::Tensor> next = recycling.Step(b, {d}, std::move(previous));
    previous = std::move(b);
    b = std::move(next);
    EXPECT_TRUE(a[0].equal(b[0]));
  }
  // b's memory came back around: theta_{t-2} was overwritten in place when nobody held it.
  std::vector<at::Tensor> unshared = {at::empty({64})};
  void* unshared_ptr = unshared[0].data_ptr();
  std::vector<at::Tensor> out = recycling.Step(b, {deltas[0]}, std::move(unshared));
  EXPECT_EQ(out[0].data_ptr(), unshared_ptr);
  const at::Tensor held = at::empty({64});
  out = recycling.Step(out, {deltas[1]}, {held});
  EXPECT_NE(out[0].data_ptr(), held.data_ptr()) << "a tensor someone still holds must not be overwritten";
}

TEST(OuterOptimizerTest, KindFromName) {
  EXPECT_EQ(OuterOptimizer::KindFromName("nesterov"), OuterOptimizer::Kind::kNesterov);
  EXPECT_EQ(OuterOptimizer::KindFromName("sgd"), OuterOptimizer::Kind::kSgd);
  EXPECT_THROW(OuterOptimizer::KindFromName("adam"), std::invalid_argument);
}

TEST(OuterOptimizerTest, MismatchedTensorCountsThrow) {
  OuterOptimizer opt(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
  EXPECT_THROW(opt.Step({at::zeros({3})}, {at::zeros({3}), at::zeros({2})}), std::invalid_argument);
}

// The kernels read host memory: a tensor on another device (here a meta tensor, which both LibTorch 1.13 and 2.x
// make without a GPU; on a GPU machine it would be cuda:0) is refused with a message naming the tensor and its
// device, before anything is written. Without the check, a meta tensor's null data pointer is read (a crash).
void ExpectRefusedNaming(const std::function<void()>& step, const std::string& expected) {
  try {
    step();
    ADD_FAILURE() << "no error; expected one naming: " << expected;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(expected));
  }
}

TEST(OuterOptimizerTest, TensorsOffTheCpuAreRefusedNamingTheirDevice) {
  const at::Tensor meta = at::empty({4}, at::TensorOptions(at::kFloat).device(at::kMeta));
  OuterOptimizer opt(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
  ExpectRefusedNaming([&] { opt.Step({at::zeros({4})}, {meta}); }, "OuterOptimizer::Step: delta tensor 0 is on meta");
  ExpectRefusedNaming(
      [&] {
        opt.Step({at::zeros({3}), meta}, {at::zeros({3}), at::zeros({4})});
      },
      "theta tensor 1 is on meta");
  ExpectRefusedNaming([&] { opt.StepInPlace({meta}, {at::zeros({4})}); },
                      "OuterOptimizer::StepInPlace: theta tensor 0 is on meta");
  EXPECT_TRUE(opt.momentum_buffers().empty()) << "a refused step leaves no momentum behind";

  const at::Tensor theta = at::ones({4});
  opt.StepInPlace({theta}, {at::full({4}, 0.5f)});  // CPU tensors still step: 1 - 0.7 * (0.5 + 0.9 * 0.5)
  EXPECT_FLOAT_EQ(theta[0].item<float>(), 1.0f - 0.7f * (0.5f + 0.9f * 0.5f));

  OuterOptimizer restored(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
  restored.set_momentum_buffers({meta});
  ExpectRefusedNaming([&] { restored.Step({at::zeros({4})}, {at::zeros({4})}); }, "momentum tensor 0 is on meta");
  ExpectRefusedNaming([&] { restored.StepInPlace({at::zeros({4})}, {at::zeros({4})}); },
                      "momentum tensor 0 is on meta");
}

}  // namespace
}  // namespace diloco

// The non-finite guard (outer_step.h NonFiniteStep, issue 32): a step whose theta or momentum would overflow is
// refused with both as they were, bit for bit, in place and out of place, on the first step and a later one.
namespace diloco {
namespace {

TEST(OuterOptimizerGuardTest, AStepThatWouldOverflowCommitsNothing) {
  const float big = 3.0e38f;  // finite, but theta - lr * (d + mu * b) with d = -big overflows
  for (bool in_place : {true, false}) {
    for (int warm : {0, 1}) {
      OuterOptimizer opt(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
      std::vector<at::Tensor> theta = {at::tensor({0.5f, -1.0f, 2.0f}, at::kFloat), at::tensor({1.0f}, at::kFloat)};
      for (int i = 0; i < warm; ++i) {  // a momentum to keep
        const std::vector<at::Tensor> d = {at::tensor({0.1f, 0.2f, 0.3f}), at::tensor({0.4f})};
        if (in_place) {
          opt.StepInPlace(theta, d);
        } else {
          theta = opt.Step(theta, d);
        }
      }
      const std::vector<at::Tensor> theta_before = {theta[0].clone(), theta[1].clone()};
      std::vector<at::Tensor> momentum_before;
      for (const at::Tensor& b : opt.momentum_buffers()) momentum_before.push_back(b.clone());
      const std::vector<at::Tensor> bad = {at::tensor({0.1f, -big, 0.3f}), at::tensor({0.4f})};
      if (in_place) {
        EXPECT_THROW(opt.StepInPlace(theta, bad), NonFiniteStep);
      } else {
        EXPECT_THROW(opt.Step(theta, bad), NonFiniteStep);
      }
      for (size_t i = 0; i < theta.size(); ++i) EXPECT_TRUE(at::equal(theta[i], theta_before[i])) << i;
      ASSERT_EQ(opt.momentum_buffers().size(), momentum_before.size()) << "in_place " << in_place << " warm " << warm;
      for (size_t i = 0; i < momentum_before.size(); ++i) {
        EXPECT_TRUE(at::equal(opt.momentum_buffers()[i], momentum_before[i])) << i;
      }
      // The next, finite step goes on as if the refused one never happened.
      const std::vector<at::Tensor> d = {at::tensor({0.1f, 0.2f, 0.3f}), at::tensor({0.4f})};
      if (in_place) {
        EXPECT_NO_THROW(opt.StepInPlace(theta, d));
      } else {
        EXPECT_NO_THROW(theta = opt.Step(theta, d));
      }
      EXPECT_TRUE(at::isfinite(theta[0]).all().item<bool>());
    }
  }
}

// Plain SGD without momentum (FedAvg with lr 1) is guarded too.
TEST(OuterOptimizerGuardTest, PlainStepIsGuarded) {
  OuterOptimizer opt(OuterOptimizer::Kind::kSgd, 1.0, 0.0);
  std::vector<at::Tensor> theta = {at::tensor({3.0e38f, 1.0f})};
  EXPECT_THROW(opt.StepInPlace(theta, {at::tensor({-1.0e38f, 0.0f})}), NonFiniteStep);
  EXPECT_EQ(theta[0][0].item<float>(), 3.0e38f);
  EXPECT_NO_THROW(opt.StepInPlace(theta, {at::tensor({1.0e38f, 0.0f})}));
  EXPECT_FLOAT_EQ(theta[0][0].item<float>(), 3.0e38f - 1.0e38f);
}

}  // namespace
}  // namespace diloco
