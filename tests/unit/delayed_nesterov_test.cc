// Delayed Nesterov (coordinator/delayed_nesterov.h) against golden values from PyTorch
// (tests/golden/make_dn_golden.py: arXiv 2401.09135 Algorithm 3, c = 0), and N = 1 against the sync outer step.
#include "coordinator/delayed_nesterov.h"

#include <gtest/gtest.h>

#include <vector>

#include "coordinator/outer_optimizer.h"

namespace diloco {
namespace {

at::Tensor T(std::vector<float> v) { return at::tensor(v, at::kFloat); }

TEST(DelayedNesterovTest, FiveArrivalsWithDelayTwoFollowThePyTorchTrajectory) {
  const std::vector<std::vector<float>> g = {{0.1f, -0.2f, 0.3f, 0.05f},
                                             {0.2f, 0.1f, -0.1f, 0.0f},
                                             {-0.3f, 0.4f, 0.2f, 0.1f},
                                             {0.05f, 0.05f, 0.05f, -0.2f},
                                             {0.15f, -0.25f, 0.35f, 0.45f}};
  const std::vector<std::vector<float>> golden = {
      {0.465000004f, -1.17999995f, 1.89499998f, 0.107500002f},
      {0.300500005f, -1.18349993f, 1.86699998f, 0.0917500034f},
      {0.405499995f, -1.32349992f, 1.79699993f, 0.0567500032f},
      {0.381699979f, -1.45439994f, 1.64404988f, 0.144075006f},
      {0.32919997f, -1.36689997f, 1.52154994f, -0.013424987f},
  };
  DelayedNesterov dn(0.7, 0.9, 2);
  std::vector<at::Tensor> theta = {T({0.5f, -1.25f, 2.0f, 0.125f})};
  for (size_t t = 0; t < g.size(); ++t) {
    const at::Tensor before = theta[0].clone();
    std::vector<at::Tensor> next = dn.Step(theta, {T(g[t])});
    EXPECT_TRUE(theta[0].equal(before)) << "theta must be left untouched";
    theta = next;
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_NEAR(theta[0][j].item<float>(), golden[t][static_cast<size_t>(j)], 1e-6) << "arrival " << t + 1;
    }
    // The momentum moves only on even arrivals.
    EXPECT_EQ(dn.arrivals(), static_cast<int64_t>(t + 1));
  }
}

TEST(DelayedNesterovTest, DelayOneIsTheSynchronousNesterovStep) {
  DelayedNesterov dn(0.7, 0.9, 1);
  OuterOptimizer sync(OuterOptimizer::Kind::kNesterov, 0.7, 0.9);
  std::vector<at::Tensor> a = {T({1.0f, 2.0f, -3.0f})}, b = a;
  for (int t = 0; t < 4; ++t) {
    const std::vector<at::Tensor> g = {T({0.1f * static_cast<float>(t + 1), -0.2f, 0.05f})};
    a = dn.Step(a, g);
    b = sync.Step(b, g);
    EXPECT_TRUE(at::allclose(a[0], b[0], 0, 1e-6)) << t << ": " << a[0] << " vs " << b[0];
  }
}

TEST(DelayedNesterovTest, MismatchedShapesThrow) {
  DelayedNesterov dn(0.7, 0.9, 2);
  EXPECT_THROW(dn.Step({T({1.0f, 2.0f})}, {T({1.0f})}), std::invalid_argument);
  EXPECT_THROW(DelayedNesterov(0.7, 0.9, 0), std::invalid_argument);
}

}  // namespace
}  // namespace diloco

namespace diloco {
namespace {

// The non-finite guard (outer_step.h NonFiniteStep): a refused arrival leaves m and acc as they were, so the
// trajectory goes on as if it never came.
TEST(DelayedNesterovTest, AnArrivalThatWouldOverflowIsRefusedAndLeavesNoTrace) {
  DelayedNesterov guarded(0.7, 0.9, 2), clean(0.7, 0.9, 2);
  std::vector<at::Tensor> theta = {T({0.5f, -1.25f, 2.0f, -3.0e38f})};  // finite, near the float32 limit
  std::vector<at::Tensor> theta_clean = theta;
  const std::vector<at::Tensor> g1 = {T({0.1f, -0.2f, 0.3f, 0.05f})}, g2 = {T({0.2f, 0.1f, -0.1f, 0.0f})};
  theta = guarded.Step(theta, g1);
  theta_clean = clean.Step(theta_clean, g1);
  EXPECT_THROW(guarded.Step(theta, {T({0.0f, 0.0f, 0.0f, 3.0e38f})}), NonFiniteStep);  // theta[3] -> -Inf
  theta = guarded.Step(theta, g2);
  theta_clean = clean.Step(theta_clean, g2);
  EXPECT_TRUE(at::equal(theta[0], theta_clean[0]));
  EXPECT_TRUE(at::equal(guarded.momentum_buffers()[0], clean.momentum_buffers()[0]));
}

}  // namespace
}  // namespace diloco
