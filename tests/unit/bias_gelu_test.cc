// BiasGelu (worker/lm/bias_gelu.h) against torch::gelu(pre + bias) computed in float64: every element of the output
// and of both gradients, with both builds of the kernels, over inputs from -12 to 12 (the far tails included), for a
// width that is a multiple of the kernel's 8 lanes and one that is not.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "worker/lm/bias_gelu.h"
#include "worker/lm/kernel_dispatch.h"

namespace diloco {
namespace {

class BiasGeluTest : public ::testing::TestWithParam<int64_t> {};

void CheckAgainstDouble(int64_t cols) {
  torch::manual_seed(9);
  const torch::Tensor pre = torch::rand({3, 70, cols}) * 24 - 12;
  const torch::Tensor bias = torch::randn({cols});
  const torch::Tensor upstream = torch::randn({3, 70, cols});

  torch::Tensor p32 = pre.clone().requires_grad_(true), b32 = bias.clone().requires_grad_(true);
  torch::Tensor out32 = BiasGelu(p32, b32);
  (out32 * upstream).sum().backward();
  torch::Tensor p64 = pre.to(torch::kDouble).requires_grad_(true), b64 = bias.to(torch::kDouble).requires_grad_(true);
  torch::Tensor out64 = BiasGeluReference(p64, b64);
  (out64 * upstream.to(torch::kDouble)).sum().backward();

  // Abramowitz-Stegun's erf is within 1.5e-7 of erf; with float rounding, a few 1e-7 of (1 + |x|).
  const torch::Tensor x = (pre + bias).to(torch::kDouble).abs() + 1;
  const double out_error = ((out32.to(torch::kDouble) - out64).abs() / x).max().item<double>();
  const double grad_error =
      ((p32.grad().to(torch::kDouble) - p64.grad()).abs() / (x * (upstream.to(torch::kDouble).abs() + 1e-3)))
          .max()
          .item<double>();
  EXPECT_LT(out_error, 4e-7);
  EXPECT_LT(grad_error, 4e-7);
  const double bias_scale = p64.grad().abs().sum(torch::IntArrayRef{0, 1}).max().item<double>();
  EXPECT_LT((b32.grad().to(torch::kDouble) - b64.grad()).abs().max().item<double>(), 1e-6 * bias_scale);
  // The far negative tail keeps its magnitude (no 1 - (1 - y) cancellation; ATen's float GELU gives 0 at -8):
  // gelu(-8) ~ -4.9e-15, within the few percent of relative error the 7.1.26 form has out there.
  const torch::Tensor far = BiasGelu(torch::full({1, 8}, -8.0f), torch::zeros({8}));
  const double exact = BiasGeluReference(torch::full({1, 1}, -8.0, torch::kDouble), torch::zeros({1}, torch::kDouble))
                           .item<double>();
  EXPECT_NEAR(far[0][3].item<double>() / exact, 1.0, 0.05);
}

// Both builds of the kernels: the AVX2+FMA one (where this CPU has it) and the baseline x86-64 one.
TEST_P(BiasGeluTest, MatchesExactGeluInDoubleForwardAndBackward) {
  for (const bool avx2 : {true, false}) {
    SCOPED_TRACE(avx2 ? "AVX2+FMA build (if the CPU has it)" : "baseline build");
    AllowAvx2Kernels(avx2);
    CheckAgainstDouble(GetParam());
  }
  AllowAvx2Kernels(true);
}

INSTANTIATE_TEST_SUITE_P(Widths, BiasGeluTest, ::testing::Values(512, 13));

TEST(BiasGelu, SameBitsWithOneOrTwoThreads) {
  torch::manual_seed(4);
  const torch::Tensor pre = torch::randn({600, 200}), bias = torch::randn({200});
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    torch::Tensor p = pre.clone().requires_grad_(true);
    torch::Tensor out = BiasGelu(p, bias);
    out.sum().backward();
    return std::make_pair(out.detach(), p.grad());
  };
  const int before = at::get_num_threads();
  auto [out1, grad1] = run(1);
  auto [out2, grad2] = run(2);
  at::set_num_threads(before);
  EXPECT_TRUE(torch::equal(out1, out2));
  EXPECT_TRUE(torch::equal(grad1, grad2));
}

TEST(BiasGelu, RefusesABiasOfTheWrongWidth) {
  EXPECT_THROW(BiasGelu(torch::zeros({4, 8}), torch::zeros({7})), std::invalid_argument);
  EXPECT_THROW(BiasGelu(torch::zeros({4, 8}), torch::zeros({2, 4})), std::invalid_argument);
}

}  // namespace
}  // namespace diloco
