// RoundAccumulator: the token-weighted average of pseudo-gradients, folded chunk by chunk.
#include "coordinator/round_accumulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace diloco {
namespace {

const std::vector<TensorSpec> kSpecs = {{"w", {2, 3}, at::kFloat}, {"b", {5}, at::kFloat}};

// One contribution: a tensor per spec, filled from a seeded generator.
std::vector<at::Tensor> Contribution(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> out;
  for (const TensorSpec& s : kSpecs) out.push_back(at::randn(s.shape, gen, at::kFloat));
  return out;
}

// Folds a contribution in chunks of `chunk` elements, as pushes arrive over the wire.
void FoldChunked(RoundAccumulator& acc, const std::vector<at::Tensor>& delta, double weight, int64_t chunk) {
  for (size_t i = 0; i < delta.size(); ++i) {
    at::Tensor flat = delta[i].reshape({-1});
    for (int64_t off = 0; off < flat.numel(); off += chunk) {
      acc.Fold(i, off, flat.narrow(0, off, std::min(chunk, flat.numel() - off)), weight);
    }
  }
  acc.AddContribution(weight);
}

void ExpectWeightedAverage(const std::vector<at::Tensor>& avg, const std::vector<std::vector<at::Tensor>>& deltas,
                           const std::vector<double>& weights) {
  ASSERT_EQ(avg.size(), kSpecs.size());
  double total = 0;
  for (double w : weights) total += w;
  for (size_t t = 0; t < kSpecs.size(); ++t) {
    EXPECT_EQ(avg[t].sizes().vec(), kSpecs[t].shape);
    EXPECT_EQ(avg[t].scalar_type(), at::kFloat);
    at::Tensor got = avg[t].contiguous().view({-1});
    for (int64_t e = 0; e < got.numel(); ++e) {
      double expected = 0;
      for (size_t i = 0; i < deltas.size(); ++i) {
        expected += weights[i] * static_cast<double>(deltas[i][t].reshape({-1})[e].item<float>());
      }
      expected /= total;
      EXPECT_NEAR(got[e].item<float>(), expected, 1e-6 * std::max(1.0, std::fabs(expected)))
          << kSpecs[t].name << "[" << e << "]";
    }
  }
}

TEST(RoundAccumulatorTest, ChunkwiseTokenWeightedAverage) {
  RoundAccumulator acc(kSpecs);
  const std::vector<std::vector<at::Tensor>> deltas = {Contribution(1), Contribution(2), Contribution(3)};
  const std::vector<double> weights = {3, 1, 4};
  FoldChunked(acc, deltas[0], weights[0], 2);
  FoldChunked(acc, deltas[1], weights[1], 4);
  FoldChunked(acc, deltas[2], weights[2], 1);
  EXPECT_EQ(acc.contributions(), 3);
  EXPECT_DOUBLE_EQ(acc.total_weight(), 8);
  ExpectWeightedAverage(acc.Average(), deltas, weights);
}

TEST(RoundAccumulatorTest, InterleavedChunksFromTwoWorkers) {
  // Two pushes in flight at once: their chunks interleave; the sum does not care about arrival order.
  RoundAccumulator acc(kSpecs);
  const std::vector<std::vector<at::Tensor>> deltas = {Contribution(4), Contribution(5)};
  const std::vector<double> weights = {1000, 250};
  for (size_t t = 0; t < kSpecs.size(); ++t) {
    at::Tensor a = deltas[0][t].reshape({-1}), b = deltas[1][t].reshape({-1});
    for (int64_t off = a.numel() - 1; off >= 0; --off) {  // back to front, alternating workers
      acc.Fold(t, off, b.narrow(0, off, 1), weights[1]);
      acc.Fold(t, off, a.narrow(0, off, 1), weights[0]);
    }
  }
  acc.AddContribution(weights[0]);
  acc.AddContribution(weights[1]);
  ExpectWeightedAverage(acc.Average(), deltas, weights);
}

TEST(RoundAccumulatorTest, HalfPrecisionChunksAreWidened) {
  RoundAccumulator acc(kSpecs);
  std::vector<at::Tensor> delta = Contribution(6);
  std::vector<at::Tensor> as_half;
  for (const at::Tensor& d : delta) as_half.push_back(d.to(at::kHalf));
  FoldChunked(acc, as_half, 2.0, 3);
  std::vector<at::Tensor> widened;
  for (const at::Tensor& h : as_half) widened.push_back(h.to(at::kFloat));
  ExpectWeightedAverage(acc.Average(), {widened}, {2.0});
}

TEST(RoundAccumulatorTest, AverageDoesNotAliasTheSums) {
  RoundAccumulator acc(kSpecs);
  const std::vector<at::Tensor> delta = Contribution(7);
  FoldChunked(acc, delta, 1.0, 6);
  std::vector<at::Tensor> first = acc.Average();
  first[0].fill_(123.0);
  ExpectWeightedAverage(acc.Average(), {delta}, {1.0});
}

TEST(RoundAccumulatorTest, ResetZeroes) {
  RoundAccumulator acc(kSpecs);
  FoldChunked(acc, Contribution(8), 3.0, 2);
  acc.Reset();
  EXPECT_EQ(acc.contributions(), 0);
  EXPECT_EQ(acc.total_weight(), 0);
  EXPECT_THROW(acc.Average(), std::logic_error);
  // After Reset only the new contribution counts: its average is itself.
  const std::vector<at::Tensor> fresh = Contribution(9);
  FoldChunked(acc, fresh, 5.0, 2);
  EXPECT_EQ(acc.contributions(), 1);
  ExpectWeightedAverage(acc.Average(), {fresh}, {5.0});
}

TEST(RoundAccumulatorTest, AverageWithoutContributionThrows) {
  RoundAccumulator acc(kSpecs);
  EXPECT_THROW(acc.Average(), std::logic_error);
}

// TakeAverage hands out the divided sums themselves and Restore takes them back: one copy, no allocation per round.
TEST(RoundAccumulatorTest, TakeAverageHandsOutTheSumsAndRestoreTakesThemBack) {
  RoundAccumulator acc({TensorSpec{"w", {4}, at::kFloat}});
  acc.Fold(0, 0, at::tensor({1.0f, 2.0f, 3.0f, 4.0f}), 3.0);
  acc.AddContribution(3.0);
  acc.Fold(0, 0, at::tensor({5.0f, 6.0f, 7.0f, 8.0f}), 1.0);
  acc.AddContribution(1.0);
  std::vector<at::Tensor> delta = acc.TakeAverage();
  EXPECT_TRUE(delta[0].allclose(at::tensor({2.0f, 3.0f, 4.0f, 5.0f})));
  EXPECT_EQ(acc.total_weight(), 0);
  EXPECT_EQ(acc.contributions(), 0);
  EXPECT_THROW(acc.Fold(0, 0, at::ones({4}), 1.0), std::out_of_range) << "no sums while the round steps";
  acc.Reset();  // does nothing without sums
  void* sums_ptr = delta[0].data_ptr();
  delta[0].zero_();
  acc.Restore(std::move(delta));
  EXPECT_THROW(acc.Restore({at::zeros({4})}), std::logic_error);
  acc.Fold(0, 0, at::ones({4}), 2.0);
  acc.AddContribution(2.0);
  EXPECT_TRUE(acc.Average()[0].allclose(at::ones({4}))) << "the next round starts from the restored zeros";
  std::vector<at::Tensor> again = acc.TakeAverage();
  EXPECT_EQ(again[0].data_ptr(), sums_ptr);
}

TEST(AllFiniteTest, FindsEveryKindOfNonFiniteValueAnywhere) {
  at::Tensor v = at::randn({1000});
  v[3] = std::numeric_limits<float>::max();
  v[4] = -std::numeric_limits<float>::max();
  v[5] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(AllFinite(v));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()}) {
    for (int64_t at : {int64_t{0}, int64_t{517}, int64_t{999}}) {
      at::Tensor w = v.clone();
      w[at] = bad;
      EXPECT_FALSE(AllFinite(w)) << bad << " at " << at;
      EXPECT_FALSE(AllFinite(w.view({10, 100}).t())) << "non-contiguous, " << bad << " at " << at;
    }
  }
  EXPECT_TRUE(AllFinite(at::zeros({0})));
}

}  // namespace
}  // namespace diloco
