// GroupedCausalAttention (worker/lm/causal_attention.h): the fused kernel reading a llama-family q|k|v projection with
// grouped key/value heads and rotary positions, against the composite ops (rotation, repeat_interleave of the key/value
// heads, matmul, mask, softmax) computed in float64, forward and the gradient of the projection, with both builds of
// the kernels; the gradient's independence from the thread count (the key/value heads' gradients are summed over
// their query heads); and the shapes it refuses. Also the fused RMSNorm (worker/lm/rms_norm.h) against its composite
// ops in float64.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "worker/lm/causal_attention.h"
#include "worker/lm/kernel_dispatch.h"
#include "worker/lm/rms_norm.h"

namespace diloco {
namespace {

struct GroupedCase {
  int64_t B, T, n_head, n_kv_head, hd;
  bool rotary;
};

void PrintTo(const GroupedCase& c, std::ostream* os) {
  *os << "B" << c.B << " T" << c.T << " heads" << c.n_head << "/" << c.n_kv_head << " hd" << c.hd
      << (c.rotary ? " rotary" : "");
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// cos, sin [T, hd] of the default rope (theta 10000): angle t x [inv_freq, inv_freq].
std::pair<torch::Tensor, torch::Tensor> Tables(int64_t T, int64_t hd) {
  auto inv_freq = 1.0 / torch::pow(10000.0, torch::arange(0, hd, 2, torch::kDouble) / hd);
  auto angle = torch::outer(torch::arange(T, torch::kDouble), inv_freq);
  angle = torch::cat({angle, angle}, -1);
  return {angle.cos(), angle.sin()};
}

class GroupedAttentionTest : public ::testing::TestWithParam<GroupedCase> {};

void CheckAgainstDouble(const GroupedCase& c) {
  torch::manual_seed(11);
  const int64_t width = (c.n_head + 2 * c.n_kv_head) * c.hd;
  const torch::Tensor input = torch::randn({c.B, c.T, width});
  const torch::Tensor upstream = torch::randn({c.B, c.T, c.n_head * c.hd});
  torch::Tensor cos64, sin64;
  if (c.rotary) std::tie(cos64, sin64) = Tables(c.T, c.hd);
  const torch::Tensor cos = c.rotary ? cos64.to(torch::kFloat) : cos64,
                      sin = c.rotary ? sin64.to(torch::kFloat) : sin64;

  torch::Tensor qkv = input.clone().requires_grad_(true);
  torch::Tensor out = GroupedCausalAttention(qkv, c.n_head, c.n_kv_head, cos, sin);
  (out * upstream).sum().backward();

  torch::Tensor qkv64 = input.to(torch::kDouble).requires_grad_(true);
  torch::Tensor out64 = GroupedCausalAttentionReference(qkv64, c.n_head, c.n_kv_head, cos64, sin64);
  (out64 * upstream.to(torch::kDouble)).sum().backward();

  ASSERT_EQ(out.sizes(), out64.sizes());
  const double out_scale = out64.abs().max().item<double>();
  const double grad_scale = qkv64.grad().abs().max().item<double>();
  EXPECT_LT(MaxAbsDiff(out, out64), 2e-6 * out_scale + 1e-7);
  EXPECT_LT(MaxAbsDiff(qkv.grad(), qkv64.grad()), 1e-5 * grad_scale + 1e-7);
}

TEST_P(GroupedAttentionTest, MatchesCompositeOpsInDoubleForwardAndBackward) {
  for (const bool avx2 : {true, false}) {
    SCOPED_TRACE(avx2 ? "AVX2+FMA build (if the CPU has it)" : "baseline build");
    AllowAvx2Kernels(avx2);
    CheckAgainstDouble(GetParam());
  }
  AllowAvx2Kernels(true);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GroupedAttentionTest,
                         ::testing::Values(GroupedCase{4, 64, 4, 2, 32, true},   // config/llama-demo.yaml's layer
                                           GroupedCase{2, 37, 6, 2, 24, true},   // group 3, T off the 16 grid
                                           GroupedCase{2, 33, 8, 1, 16, true},   // one key/value head
                                           GroupedCase{3, 20, 4, 4, 12, true},   // no grouping, hd 12
                                           GroupedCase{2, 29, 4, 2, 20, false},  // grouped, no rotation
                                           GroupedCase{2, 1, 2, 1, 8, true}));   // one position

TEST(GroupedAttention, SameBitsWithOneOrTwoThreads) {
  torch::manual_seed(5);
  const int64_t T = 33, hd = 16;
  const torch::Tensor input = torch::randn({3, T, (6 + 2 * 2) * hd});
  const torch::Tensor upstream = torch::randn({3, T, 6 * hd});
  auto [cos, sin] = Tables(T, hd);
  cos = cos.to(torch::kFloat);
  sin = sin.to(torch::kFloat);
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    torch::Tensor qkv = input.clone().requires_grad_(true);
    torch::Tensor out = GroupedCausalAttention(qkv, 6, 2, cos, sin);
    (out * upstream).sum().backward();
    return std::make_pair(out.detach(), qkv.grad());
  };
  const int before = at::get_num_threads();
  auto [out1, grad1] = run(1);
  auto [out2, grad2] = run(2);
  at::set_num_threads(before);
  EXPECT_TRUE(torch::equal(out1, out2));
  EXPECT_TRUE(torch::equal(grad1, grad2));
}

TEST(GroupedAttention, RefusesShapesItCannotSplit) {
  const torch::Tensor qkv = torch::zeros({2, 4, (4 + 2 * 2) * 8});
  EXPECT_THROW(GroupedCausalAttention(qkv, 4, 3, {}, {}), std::invalid_argument);  // 4 heads, 3 key/value heads
  EXPECT_THROW(GroupedCausalAttention(torch::zeros({2, 4, 60}), 4, 2, {}, {}), std::invalid_argument);  // 60 % 8
  const torch::Tensor table = torch::zeros({5, 8});                                                     // T is 4
  EXPECT_THROW(GroupedCausalAttention(qkv, 4, 2, table, table), std::invalid_argument);
  const torch::Tensor odd = torch::zeros({4, 7});  // hd 7 cannot be rotated in halves
  EXPECT_THROW(GroupedCausalAttention(torch::zeros({2, 4, 8 * 7}), 4, 2, odd, odd), std::invalid_argument);
}

// x [rows, D] (and a non-contiguous [B, T, heads, hd] view, as qwen3's q_norm gets): the output and the gradients of
// x and the weight, on 1 and 2 threads.
TEST(RmsNorm, MatchesCompositeOpsInDoubleForwardAndBackward) {
  torch::manual_seed(13);
  const torch::Tensor base = torch::randn({3, 37, 2 * 48}) * 3.0;
  const torch::Tensor upstream = torch::randn({3, 37, 48});
  const torch::Tensor gain = 1.0 + 0.3 * torch::randn({48});
  for (const bool strided : {false, true}) {
    const torch::Tensor input = strided ? base.narrow(-1, 48, 48) : base.narrow(-1, 0, 48).contiguous();
    torch::Tensor x64 = input.to(torch::kDouble).requires_grad_(true),
                  w64 = gain.to(torch::kDouble).requires_grad_(true);
    const torch::Tensor out64 = RmsNormReference(x64, w64, 1e-5);
    (out64 * upstream.to(torch::kDouble)).sum().backward();
    const int before = at::get_num_threads();
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(std::to_string(threads) + " thread(s), strided " + std::to_string(strided));
      at::set_num_threads(threads);
      torch::Tensor x = input.detach().requires_grad_(true), w = gain.clone().requires_grad_(true);
      const torch::Tensor out = RmsNormForward(x, w, 1e-5);
      (out * upstream).sum().backward();
      EXPECT_LT(MaxAbsDiff(out, out64), 1e-6 * out64.abs().max().item<double>());
      EXPECT_LT(MaxAbsDiff(x.grad(), x64.grad()), 1e-5 * x64.grad().abs().max().item<double>());
      EXPECT_LT(MaxAbsDiff(w.grad(), w64.grad()), 1e-5 * w64.grad().abs().max().item<double>());
    }
    at::set_num_threads(before);
  }
}

}  // namespace
}  // namespace diloco
