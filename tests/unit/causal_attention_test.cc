// The fused causal attention (worker/lm/causal_attention.h) against the composite LibTorch ops computed in float64,
// forward and backward, with both builds of the kernels, on the demo's shapes and on awkward ones (T and head_dim
// not multiples of the kernel's 16, one position, large scores); causality; thread-count independence; and the whole
// model in float32 (fused) against the same model in float64 (composite ops).
#include "worker/lm/causal_attention.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "config/config.h"
#include "worker/lm/kernel_dispatch.h"
#include "worker/lm/language_model.h"

namespace diloco {
namespace {

struct Case {
  int64_t B, T, D, n_head;
  double input_scale;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << " T" << c.T << " D" << c.D << " heads" << c.n_head << " scale" << c.input_scale;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

class CausalAttentionTest : public ::testing::TestWithParam<Case> {};

void CheckAgainstDouble(const Case& c) {
  torch::manual_seed(7);
  const torch::Tensor input = torch::randn({c.B, c.T, 3 * c.D}) * c.input_scale;
  const torch::Tensor upstream = torch::randn({c.B, c.T, c.D});

  torch::Tensor qkv = input.clone().requires_grad_(true);
  torch::Tensor out = CausalSelfAttention(qkv, c.n_head);
  (out * upstream).sum().backward();

  torch::Tensor qkv64 = input.to(torch::kDouble).requires_grad_(true);
  torch::Tensor out64 = CausalSelfAttentionReference(qkv64, c.n_head);
  (out64 * upstream.to(torch::kDouble)).sum().backward();

  ASSERT_EQ(out.sizes(), out64.sizes());
  ASSERT_EQ(out.scalar_type(), torch::kFloat);
  // float32 rounding of sums over at most T terms of unit-sized values, relative to the values' scale.
  const double out_scale = out64.abs().max().item<double>();
  const double grad_scale = qkv64.grad().abs().max().item<double>();
  EXPECT_LT(MaxAbsDiff(out, out64), 2e-6 * out_scale + 1e-7);
  EXPECT_LT(MaxAbsDiff(qkv.grad(), qkv64.grad()), 1e-5 * grad_scale + 1e-7);
  // And no worse than the composite ops in float32 by more than a small factor (a kernel bug would be far worse).
  torch::Tensor qkv32 = input.clone().requires_grad_(true);
  (CausalSelfAttentionReference(qkv32, c.n_head) * upstream).sum().backward();
  EXPECT_LT(MaxAbsDiff(qkv.grad(), qkv64.grad()), 10 * MaxAbsDiff(qkv32.grad(), qkv64.grad()) + 1e-7 * grad_scale);
}

// Both builds of the kernels: the AVX2+FMA one (where this CPU has it) and the baseline x86-64 one.
TEST_P(CausalAttentionTest, MatchesCompositeOpsInDoubleForwardAndBackward) {
  for (const bool avx2 : {true, false}) {
    SCOPED_TRACE(avx2 ? "AVX2+FMA build (if the CPU has it)" : "baseline build");
    AllowAvx2Kernels(avx2);
    CheckAgainstDouble(GetParam());
  }
  AllowAvx2Kernels(true);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CausalAttentionTest,
                         ::testing::Values(Case{4, 64, 128, 4, 1.0},   // the demo model's layer
                                           Case{3, 37, 72, 3, 1.0},    // T and head_dim (24) off the 16 grid
                                           Case{2, 100, 80, 2, 1.0},   // head_dim 40
                                           Case{2, 19, 60, 5, 4.0},    // head_dim 12: not even a multiple of 8
                                           Case{2, 1, 16, 1, 1.0},     // one position
                                           Case{2, 21, 64, 4, 8.0}));  // scores in the hundreds: peaked softmax

TEST(CausalAttention, LaterPositionsDoNotChangeEarlierOutputs) {
  torch::manual_seed(3);
  const int64_t T = 40, D = 64;
  torch::Tensor a = torch::randn({2, T, 3 * D});
  torch::Tensor b = a.clone();
  b.narrow(1, 25, T - 25).normal_();
  const torch::Tensor out_a = CausalSelfAttention(a, 4), out_b = CausalSelfAttention(b, 4);
  EXPECT_TRUE(torch::equal(out_a.narrow(1, 0, 25), out_b.narrow(1, 0, 25)));
  EXPECT_FALSE(torch::equal(out_a.narrow(1, 25, 1), out_b.narrow(1, 25, 1)));
}

TEST(CausalAttention, TakesANonContiguousInputAndRefusesDoubleBackward) {
  torch::manual_seed(8);
  const torch::Tensor leaf = torch::randn({20, 3, 3 * 32}).requires_grad_(true);  // [T, B, 3D]
  const torch::Tensor qkv = leaf.transpose(0, 1);                                 // [B, T, 3D], not contiguous
  ASSERT_FALSE(qkv.is_contiguous());
  const torch::Tensor out = CausalSelfAttention(qkv, 2);
  const torch::Tensor out64 = CausalSelfAttentionReference(leaf.detach().to(torch::kDouble).transpose(0, 1), 2);
  EXPECT_LT(MaxAbsDiff(out, out64), 2e-6 * out64.abs().max().item<double>());
  EXPECT_THROW(torch::autograd::grad({out.sum()}, {leaf}, {}, /*retain_graph=*/true, /*create_graph=*/true),
               c10::Error);
}

TEST(CausalAttention, SameBitsWithOneOrTwoThreads) {
  torch::manual_seed(5);
  const torch::Tensor input = torch::randn({4, 33, 3 * 48});
  const torch::Tensor upstream = torch::randn({4, 33, 48});
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    torch::Tensor qkv = input.clone().requires_grad_(true);
    (CausalSelfAttention(qkv, 3) * upstream).sum().backward();
    return std::make_pair(CausalSelfAttention(input, 3), qkv.grad());
  };
  const int before = at::get_num_threads();
  auto [out1, grad1] = run(1);
  auto [out2, grad2] = run(2);
  at::set_num_threads(before);
  EXPECT_TRUE(torch::equal(out1, out2));
  EXPECT_TRUE(torch::equal(grad1, grad2));
}

TEST(CausalAttention, RefusesShapesItCannotSplit) {
  EXPECT_THROW(CausalSelfAttention(torch::zeros({2, 4, 10}), 2), std::invalid_argument);  // 10 not 3 x D
  EXPECT_THROW(CausalSelfAttention(torch::zeros({2, 4, 30}), 4), std::invalid_argument);  // D = 10, 4 heads
  EXPECT_THROW(CausalSelfAttention(torch::zeros({4, 30}), 2), std::invalid_argument);     // no batch dimension
}

// The language model in float32 (fused attention) against the same parameters in float64 (composite ops): the loss
// and every parameter's gradient.
TEST(CausalAttention, LanguageModelMatchesTheCompositeModelInDouble) {
  ModelConfig m;
  m.vocab_size = 64;
  m.seq_len = 24;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 32;
  LanguageModelPtr model32 = MakeLanguageModel(m, 11);
  LanguageModelPtr model64 = MakeLanguageModel(m, 11);
  model64->to(torch::kDouble);
  torch::manual_seed(2);
  const torch::Tensor tokens = torch::randint(0, m.vocab_size, {3, m.seq_len}, torch::kLong);
  const torch::Tensor targets = torch::randint(0, m.vocab_size, {3, m.seq_len}, torch::kLong);
  torch::Tensor loss32 = model32->Loss(tokens, targets);
  torch::Tensor loss64 = model64->Loss(tokens, targets);
  loss32.backward();
  loss64.backward();
  EXPECT_NEAR(loss32.item<double>(), loss64.item<double>(), 1e-5);
  const auto p32 = NamedParameters(*model32), p64 = NamedParameters(*model64);
  ASSERT_EQ(p32.size(), p64.size());
  for (size_t i = 0; i < p32.size(); ++i) {
    const double scale = p64[i].second.grad().abs().max().item<double>();
    EXPECT_LT(MaxAbsDiff(p32[i].second.grad(), p64[i].second.grad()), 1e-4 * scale + 1e-7) << p32[i].first;
  }
}

}  // namespace
}  // namespace diloco

namespace diloco {
namespace {

// Inputs the CPU float32 kernel does not take (here float64) go to at::scaled_dot_product_attention on LibTorch 2.x
// (the path CUDA and bf16 take) and to the composite ops on 1.13: forward and backward equal the composite ops.
TEST(CausalAttention, OtherDtypesTakeSdpaOn2xAndMatchTheCompositeOps) {
  torch::manual_seed(11);
  const torch::Tensor input = torch::randn({2, 29, 3 * 48}, torch::kDouble);
  const torch::Tensor upstream = torch::randn({2, 29, 48}, torch::kDouble);
  torch::Tensor a = input.clone().requires_grad_(true), b = input.clone().requires_grad_(true);
  torch::Tensor out = CausalSelfAttention(a, 3);
  torch::Tensor ref = CausalSelfAttentionReference(b, 3);
  (out * upstream).sum().backward();
  (ref * upstream).sum().backward();
  EXPECT_LT(MaxAbsDiff(out, ref), 1e-12);
  EXPECT_LT(MaxAbsDiff(a.grad(), b.grad()), 1e-12);
}

}  // namespace
}  // namespace diloco
