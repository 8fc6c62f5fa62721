// The robust aggregation rules (coordinator/aggregation_rule.h) against numpy: golden values from
// tests/golden/make_robust_golden.py (odd and even counts, ties at the median, one push, an outlier, inflated tokens).
#include "coordinator/aggregation_rule.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "coordinator/round_accumulator.h"

namespace robust_golden {
#include "tests/unit/robust_golden.inc"
}  // namespace robust_golden

namespace diloco {
namespace {

using robust_golden::Cases;
using robust_golden::RobustCase;

at::Tensor Rows(const RobustCase& c) {  // float32, as pushed
  return at::tensor(c.d, at::kDouble).reshape({c.k, c.n}).to(at::kFloat);
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " [" << i << "]";
  }
}

std::vector<double> Values(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

TEST(AggregationRuleTest, MedianIsNumpys) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({7}), 7);
  EXPECT_EQ(Median({1, 1, 5, 5}), 3);
  EXPECT_THROW(Median({}), std::invalid_argument);
}

// outer.momentum_bound: the projections of the clipped pushes onto the unit momentum (Dot, float64), MomentumBound
// over them, and the clipped mean minus the excess along the momentum, as the coordinator takes it out of the
// round's average (coordinator_momentum.cc), against numpy.
TEST(AggregationRuleTest, TheBoundAlongTheOuterMomentumMatchesNumpy) {
  for (const robust_golden::BoundCase& c : robust_golden::BoundCases()) {
    const at::Tensor rows = at::tensor(c.d, at::kDouble).reshape({c.k, c.n}).to(at::kFloat);
    const at::Tensor m = at::tensor(c.m, at::kDouble).to(at::kFloat);
    const double m_norm = std::sqrt(SquaredNorm(m));
    std::vector<double> norms, q;
    for (int i = 0; i < c.k; ++i) norms.push_back(std::sqrt(SquaredNorm(rows[i])));
    const std::vector<double> scales = ClipScales(norms, robust_golden::kClipFactor);
    const std::vector<double> weights = CappedWeights(c.tokens, robust_golden::kMaxTokenWeight);
    for (int i = 0; i < c.k; ++i) q.push_back(scales[i] * Dot(rows[i], m) / m_norm);
    ExpectNear(q, c.q, 1e-12, c.name);
    const std::vector<double> bounded = MomentumBound(q, c.bound);
    ExpectNear(bounded, c.bounded, 1e-12, c.name);
    RoundAccumulator acc({TensorSpec{"x", {c.n}}});
    double excess = 0;
    for (int i = 0; i < c.k; ++i) {
      acc.Fold(0, 0, rows[i], weights[i] * scales[i]);
      acc.AddContribution(weights[i]);
      excess += weights[i] * (q[i] - bounded[i]);
    }
    at::Tensor average = acc.Average()[0];
    average.sub_(m, excess / acc.total_weight() / m_norm);
    ExpectNear(Values(average), c.out, 1e-6, c.name);  // float32 sums
  }
  EXPECT_EQ(MomentumBound({0.1, 0.1, 0.1, 0.5, -2.0}, 3), std::vector<double>({0.1, 0.1, 0.1, 0.1, -2.0}))
      << "a zero deviation; one-sided";
  EXPECT_THROW(MomentumBound({}, 3), std::invalid_argument);
  EXPECT_EQ(Dot(at::tensor({1.0f, 2.0f, 3.0f}), at::tensor({4.0, 5.0, 6.0}, at::kDouble)), 32.0);
  EXPECT_THROW(Dot(at::ones({2}), at::ones({3})), std::invalid_argument);
}

// outer.flag_margin: a value counts when it lay beyond center + margin x (limit - center), not merely over the limit.
TEST(AggregationRuleTest, FarBeyondIsMarginTimesAsFarFromTheCenterAsTheLimit) {
  EXPECT_FALSE(FarBeyond(1.0, 0.8, 0, 2)) << "a norm clipped by 20%: over the threshold, not twice it";
  EXPECT_TRUE(FarBeyond(1.0, 0.1, 0, 2)) << "clipped to a tenth: ten times the threshold";
  EXPECT_FALSE(FarBeyond(1.0, 0.5, 0, 2)) << "exactly twice: not beyond";
  EXPECT_TRUE(FarBeyond(1.0, 0.8, 0, 1)) << "margin 1: any clip";
  EXPECT_FALSE(FarBeyond(0.5, 0.5, 0, 1)) << "not held";
  EXPECT_TRUE(FarBeyond(0.85, 0.5, 0.42, 2)) << "a stale push's projection: 0.43 past the median, the bound 0.08";
  EXPECT_FALSE(FarBeyond(0.36, 0.355, 0.3, 2)) << "an honest projection just over the bound";
  EXPECT_TRUE(FarBeyond(0.2, 0.1, 0.1, 2)) << "a zero deviation: the bound is the median, any excess is far";
}

// trimmed_mean's suspect measure: 8 pushes trimmed by 2 keep half of each column (an even share: 1/2 of a push's
// coordinates kept); trimmed by 1, three quarters.
TEST(AggregationRuleTest, TrimKeptScaleIsTheKeptShareOverAnEvenTrimsShare) {
  EXPECT_DOUBLE_EQ(TrimKeptScale(0.5, 2, 8), 1.0) << "trimmed evenly";
  EXPECT_DOUBLE_EQ(TrimKeptScale(0.2, 2, 8), 1.0) << "trimmed less than evenly: at most 1";
  EXPECT_DOUBLE_EQ(TrimKeptScale(0.75, 2, 8), 0.5) << "a quarter kept where an even trim keeps half";
  EXPECT_DOUBLE_EQ(TrimKeptScale(1.0, 2, 8), 0.0) << "dropped everywhere (a push far out at every coordinate)";
  EXPECT_DOUBLE_EQ(TrimKeptScale(0.625, 1, 8), 0.5) << "trim 1: 3/8 kept where 3/4 would be even";
  EXPECT_DOUBLE_EQ(TrimKeptScale(0.9, 5, 3), 0.1 / (1.0 / 3.0)) << "trim lowered to 1 of 3 pushes: 1/3 kept evenly";
  EXPECT_DOUBLE_EQ(TrimKeptScale(0.0, 0, 4), 1.0) << "trim 0 drops nothing";
  // Far beyond at outer.flag_margin 2 (as a clip to under 1/2): kept scale under 1/2.
  EXPECT_TRUE(FarBeyond(1.0, TrimKeptScale(0.9, 2, 8), 0, 2));
  EXPECT_FALSE(FarBeyond(1.0, TrimKeptScale(0.7, 2, 8), 0, 2));
}

// The column sort of the coordinate-wise rules: Batcher's network sorts every input of 1..20 values as std::sort does,
// by the 0-1 principle (a comparator network that sorts every 0/1 input sorts every input) for k <= 12, and on random
// values with ties for every k; 8 values take Batcher's 19 compare-exchanges.
TEST(AggregationRuleTest, SortingNetworkSortsAnyInputOfUpToTwentyValues) {
  std::mt19937 rng(32);
  for (int64_t k = 1; k <= 20; ++k) {
    const SortingNetwork network = MakeSortingNetwork(k);
    for (const auto& [a, b] : network) ASSERT_TRUE(a < b && b < k) << k;
    if (k <= 12) {
      for (uint32_t bits = 0; bits < (1u << k); ++bits) {
        std::vector<double> v(static_cast<size_t>(k));
        for (int64_t i = 0; i < k; ++i) v[static_cast<size_t>(i)] = (bits >> i) & 1u;
        SortWithNetwork(network, v.data());
        ASSERT_TRUE(std::is_sorted(v.begin(), v.end())) << "k " << k << " input " << bits;
      }
    }
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<double> v(static_cast<size_t>(k));
      for (double& x : v) x = static_cast<double>(std::uniform_int_distribution<int>(-5, 5)(rng)) * 0.5;
      std::vector<double> want = v;
      std::sort(want.begin(), want.end());
      SortWithNetwork(network, v.data());
      ASSERT_EQ(v, want) << "k " << k;
    }
  }
  EXPECT_EQ(MakeSortingNetwork(8).size(), 19u);
  EXPECT_TRUE(MakeSortingNetwork(1).empty());
}

// Dot's eight-lane loop (lengths past the lanes, a tail) and MomentumDot's two paths (a dense chunk at an offset, a
// topk chunk's positions) against LibTorch's float64 sums of the same products.
TEST(AggregationRuleTest, DotAndMomentumDotMatchFloat64Sums) {
  at::manual_seed(7);
  const at::Tensor a = at::randn({1003}), b = at::randn({1003});
  const double want = (a.to(at::kDouble) * b.to(at::kDouble)).sum().item<double>();
  EXPECT_NEAR(Dot(a, b), want, 1e-12 * (a.to(at::kDouble).abs() * b.to(at::kDouble).abs()).sum().item<double>());
  MomentumAxis axis{{at::randn({4, 5}), at::randn({50})}, 1.0};
  const at::Tensor chunk = at::randn({20});
  const double dense = (axis.tensors[1].narrow(0, 17, 20).to(at::kDouble) * chunk.to(at::kDouble)).sum().item<double>();
  EXPECT_NEAR(MomentumDot(&axis, 1, 17, chunk), dense, 1e-12);
  const at::Tensor positions = at::tensor(std::vector<int64_t>{0, 3, 9}), kept = at::randn({3});
  double sparse = 0;
  for (int64_t i = 0; i < 3; ++i) {
    sparse += static_cast<double>(axis.tensors[0].reshape(-1)[6 + positions[i].item<int64_t>()].item<float>()) *
              static_cast<double>(kept[i].item<float>());
  }
  EXPECT_NEAR(MomentumDot(&axis, 0, 6, kept, positions), sparse, 1e-12);
  EXPECT_EQ(MomentumDot(nullptr, 0, 0, chunk), 0) << "no axis: no bound";
}

TEST(AggregationRuleTest, WeightsScalesAndTheClippedMeanMatchNumpy) {
  for (const RobustCase& c : Cases()) {
    const at::Tensor rows = Rows(c);
    ExpectNear(CappedWeights(c.tokens, robust_golden::kMaxTokenWeight), c.weights, 0, c.name);
    std::vector<double> norms;
    for (int i = 0; i < c.k; ++i) norms.push_back(std::sqrt(SquaredNorm(rows[i])));
    const std::vector<double> scales = ClipScales(norms, robust_golden::kClipFactor);
    ExpectNear(scales, c.scales, 1e-12, c.name);
    // As the coordinator folds: weight w_i s_i into the float32 sums, w_i into the total.
    for (bool clip : {false, true}) {
      RoundAccumulator acc({TensorSpec{"x", {c.n}}});
      for (int i = 0; i < c.k; ++i) {
        acc.Fold(0, 0, rows[i], c.weights[i] * (clip ? scales[i] : 1.0));
        acc.AddContribution(c.weights[i]);
      }
      ExpectNear(Values(acc.Average()[0]), clip ? c.clip : c.mean, 1e-5, std::string(c.name) + (clip ? " clip" : ""));
    }
  }
}

TEST(AggregationRuleTest, TrimmedMeanAndCenteredClipMatchNumpy) {
  for (const RobustCase& c : Cases()) {
    ExpectNear(Values(TrimmedMean(Rows(c), robust_golden::kTrim)), c.trimmed, 1e-12, c.name);
    ExpectNear(Values(CenteredClip(Rows(c), robust_golden::kTau, robust_golden::kIterations)), c.cclip, 1e-12, c.name);
  }
}

// A chunk of many columns (CenteredClip adds each row's distance up per block of 4096 columns, in parallel): each
// golden case tiled m times along its columns is numpy's case with each distance sqrt(m) times as large, so with tau
// sqrt(m) times as large the clip factors and the result are the case's, tiled; the derived tau is sqrt(m) times
// the case's. The same bits on one thread and on two.
TEST(AggregationRuleTest, CenteredClipOverManyColumnsIsTheGoldenCaseTiled) {
  const int64_t m = 4000;  // > 2 blocks of 4096 columns for every case
  const int threads = at::get_num_threads();
  for (const RobustCase& c : Cases()) {
    const at::Tensor tiled = Rows(c).repeat({1, m});
    ASSERT_GT(tiled.size(1), 2 * 4096) << c.name;
    std::vector<double> want;
    for (int64_t r = 0; r < m; ++r) want.insert(want.end(), c.cclip.begin(), c.cclip.end());
    std::vector<at::Tensor> got;
    for (int t : {1, 2}) {
      at::set_num_threads(t);
      got.push_back(
          CenteredClip(tiled, robust_golden::kTau * std::sqrt(static_cast<double>(m)), robust_golden::kIterations));
      EXPECT_NEAR(CenteredClipTau(tiled), CenteredClipTau(Rows(c)) * std::sqrt(static_cast<double>(m)),
                  1e-9 * CenteredClipTau(tiled))
          << c.name;
    }
    at::set_num_threads(threads);
    ExpectNear(Values(got[0]), want, 1e-9, c.name);
    EXPECT_TRUE(at::equal(got[0], got[1])) << c.name << ": one thread and two differ";
  }
}

TEST(AggregationRuleTest, NormsAndTheLargestPush) {
  EXPECT_EQ(SquaredNorm(at::tensor({3.0f, -4.0f})), 25.0);
  EXPECT_EQ(SquaredNorm(at::tensor({3.0f, -4.0f}).to(at::kBFloat16)), 25.0);
  const double big = 1e38f;
  EXPECT_DOUBLE_EQ(SquaredNorm(at::full({2}, 1e38f)), 2 * big * big);  // float64: no overflow
  RoundState::Pushes pushes;
  pushes["a"].squared_norm = 4;
  pushes["b"].squared_norm = 9;
  pushes["c"].squared_norm = 9;
  EXPECT_EQ(LargestNormPush(pushes), "b");  // ties: the first id
  pushes["d"].squared_norm = INFINITY;
  EXPECT_EQ(LargestNormPush(pushes), "d");
  EXPECT_EQ(LargestNormPush({}), "");
  EXPECT_NE(DescribePushNorms(pushes).find("b norm 3 ("), std::string::npos) << DescribePushNorms(pushes);
}

// The clip gate's medians come from the members still expected: a member lost, gone or quarantined after it declared
// its norm no longer moves them nor counts toward the headers needed (before, w3's 0.001 made the median 0.001 x and
// opened the gate with 3 of min_declared 3 where only w1 and w2 could push).
TEST(ClipGateTest, ADeclarationOfAMemberNoLongerExpectedIsForgotten) {
  ClipGate gate(/*clip_factor=*/1.0, /*max_token_weight=*/2.0);
  gate.Declare("w3", 0.001, 100);
  gate.Declare("w1", 2.0, 1000);
  gate.Declare("w2", 4.0, 3000);
  const std::vector<std::string> expected = {"w1", "w2"};  // w3 was lost since
  gate.KeepOnly(expected);
  EXPECT_EQ(gate.declared(), 2u);
  EXPECT_FALSE(gate.TryOpen(expected, /*force=*/true, /*min_declared=*/3)) << "two headers of three needed";
  ASSERT_TRUE(gate.TryOpen(expected, /*force=*/false, /*min_declared=*/2));
  EXPECT_DOUBLE_EQ(gate.median_norm(), 3.0) << "the median of w1 and w2 alone";
  EXPECT_DOUBLE_EQ(gate.median_tokens(), 2000);
  EXPECT_DOUBLE_EQ(gate.Scale(4.0), 0.75);
  gate.KeepOnly({});
  EXPECT_EQ(gate.declared(), 2u) << "once open, the set is fixed";
}

}  // namespace
}  // namespace diloco
