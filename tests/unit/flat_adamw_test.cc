// FlatAdamW (worker/flat_adamw.h) against LibTorch's own torch::optim::AdamW, the implementation PyTorch's
// torch.optim.AdamW matches: same parameters, gradients, lr schedule and clipping for 30 steps must give the same
// parameters (to float rounding); the parameters and gradients must stay views into the flat buffers through
// autograd, loads and zeroing.
#include "worker/flat_adamw.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "worker/lm/torch_compat.h"

namespace diloco {
namespace {

// A small real model (a tied-embedding MLP on random tokens) so that gradients come from autograd.
struct Net : torch::nn::Module {
  Net() {
    emb = register_module("emb", torch::nn::Embedding(50, 16));
    fc = register_module("fc", torch::nn::Linear(16, 32));
    out = register_module("out", torch::nn::Linear(32, 16));
  }
  torch::Tensor Loss(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = out->forward(torch::gelu(fc->forward(emb->forward(x))));
    return torch::nn::functional::cross_entropy(torch::matmul(h, emb->weight.t()).view({-1, 50}), y.view({-1}));
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear fc{nullptr}, out{nullptr};
};

// Trains two copies of a net 30 steps, one with FlatAdamW (settings `fused`; the clip scale as a host double or as a
// device tensor), one with torch::optim::AdamW and clip_grad_norm_, and checks they agree.
void CheckAgainstTorchAdamW(AdamWSettings::Fused fused, bool scale_as_tensor) {
  torch::manual_seed(3);
  Net a, b;
  {
    torch::NoGradGuard no_grad;
    auto pa = a.parameters(), pb = b.parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  AdamWSettings s;
  s.beta1 = 0.9;
  s.beta2 = 0.95;
  s.weight_decay = 0.1;
  s.fused = fused;
  std::vector<torch::Tensor> initial;
  for (const auto& p : a.parameters()) initial.push_back(p.detach().clone());
  FlatAdamW flat(a.parameters(), s);
  torch::optim::AdamW reference(b.parameters(), torch::optim::AdamWOptions(1e-3).betas({0.9, 0.95}).weight_decay(0.1));
  const double max_norm = 0.5;  // small enough that some steps clip
  int clipped = 0;
  for (int step = 0; step < 30; ++step) {
    const double lr = 3e-3 * (step + 1) / 30.0;
    auto x = torch::randint(0, 50, {4, 8}, torch::kLong), y = torch::randint(0, 50, {4, 8}, torch::kLong);
    flat.ZeroGrad();
    a.Loss(x, y).backward();
    const double norm = flat.GradNorm();
    const double scale = std::min(1.0, max_norm / (norm + 1e-6));
    clipped += scale < 1.0;
    if (scale_as_tensor) {
      const torch::Tensor on_device = flat.ClipScale(max_norm);
      EXPECT_NEAR(on_device.item<double>(), scale, 1e-6 * scale);
      flat.Step(lr, on_device);
    } else {
      flat.Step(lr, scale);
    }

    reference.zero_grad();
    b.Loss(x, y).backward();
    const double ref_norm = torch::nn::utils::clip_grad_norm_(b.parameters(), max_norm);
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm) << "step " << step;
    for (auto& group : reference.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    reference.step();
  }
  EXPECT_GT(clipped, 0) << "the test must exercise clipping";
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::allclose(pa[i], pb[i], /*rtol=*/1e-5, /*atol=*/1e-6)) << "parameter " << i;
    // Both moved: 30 steps of lr up to 3e-3 move every tensor by more than float noise.
    EXPECT_GT((pa[i] - initial[i]).abs().max().item<double>(), 1e-3) << "parameter " << i;
  }
  EXPECT_EQ(flat.steps(), 30);
}

TEST(FlatAdamWTest, MatchesTorchAdamWWithScheduleAndClipping) {
  CheckAgainstTorchAdamW(AdamWSettings::Fused::kOff, /*scale_as_tensor=*/false);
  CheckAgainstTorchAdamW(AdamWSettings::Fused::kOff, /*scale_as_tensor=*/true);
}

// LibTorch 2.x's fused kernel (what CUDA workers step with), forced on the CPU here, with the clip scale computed on
// the device: the same parameters as torch::optim::AdamW.
TEST(FlatAdamWTest, FusedKernelWithDeviceClipScaleMatchesTorchAdamW) {
  if (!torch_compat::kHasFusedAdamW) GTEST_SKIP() << "LibTorch 1.13 has no fused AdamW kernel (the 2.x build tests it)";
  AdamWSettings fused;
  fused.fused = AdamWSettings::Fused::kOn;
  FlatAdamW probe(std::vector<torch::Tensor>{torch::zeros({2}, torch::kFloat)}, fused);
  EXPECT_TRUE(probe.fused());
  CheckAgainstTorchAdamW(AdamWSettings::Fused::kOn, /*scale_as_tensor=*/true);
}

TEST(FlatAdamWTest, ParametersAndGradientsStayViewsOfTheFlatBuffers) {
  torch::manual_seed(4);
  Net net;
  const auto before = net.parameters();
  std::vector<torch::Tensor> values;
  for (const auto& p : before) values.push_back(p.detach().clone());
  FlatAdamW flat(net.parameters(), AdamWSettings{});
  const float* base = flat.flat_parameters().data_ptr<float>();
  const float* gbase = flat.flat_gradients().data_ptr<float>();
  int64_t offset = 0;
  auto params = net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], values[i])) << "values kept, parameter " << i;
    EXPECT_EQ(params[i].data_ptr<float>(), base + offset) << "parameter " << i;
    offset += params[i].numel();
  }
  EXPECT_EQ(offset, flat.flat_parameters().numel());
  auto x = torch::randint(0, 50, {2, 8}, torch::kLong);
  net.Loss(x, x).backward();
  net.Loss(x, x).backward();  // accumulation must stay in place too
  offset = 0;
  for (auto& p : params) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().data_ptr<float>(), gbase + offset);
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0);
    offset += p.numel();
  }
  flat.ZeroGrad();
  for (auto& p : params) EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  {  // a load through the module writes into the flat buffer
    torch::NoGradGuard no_grad;
    params[0].fill_(2.5f);
  }
  EXPECT_EQ(flat.flat_parameters()[0].item<float>(), 2.5f);
}

}  // namespace
// inner.weight_decay_1d = false: against torch::optim::AdamW with two parameter groups (matrices decayed, 1-D tensors
// with weight_decay 0), as nanoGPT and Hugging Face's Trainer build them. A wrong implementation (decay everywhere, or
// nowhere) moves the biases or the matrices differently.
void CheckOneDimensionalWithoutDecay(AdamWSettings::Fused fused) {
  torch::manual_seed(5);
  Net a, b;
  {
    torch::NoGradGuard no_grad;
    auto pa = a.parameters(), pb = b.parameters();
    for (size_t i = 0; i < pa.size(); ++i) pb[i].copy_(pa[i]);
  }
  AdamWSettings s;
  s.weight_decay = 0.5;  // large, so that decaying a bias shows
  s.decay_1d = false;
  s.fused = fused;
  FlatAdamW flat(a.parameters(), s);
  std::vector<torch::Tensor> matrices, vectors;
  for (const auto& p : b.parameters()) (p.dim() >= 2 ? matrices : vectors).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(matrices,
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.5)));
  groups.emplace_back(vectors,
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.0)));
  torch::optim::AdamW reference(groups, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 20; ++step) {
    auto x = torch::randint(0, 50, {4, 8}, torch::kLong), y = torch::randint(0, 50, {4, 8}, torch::kLong);
    flat.ZeroGrad();
    a.Loss(x, y).backward();
    flat.Step(1e-2);
    reference.zero_grad();
    b.Loss(x, y).backward();
    reference.step();
  }
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::allclose(pa[i], pb[i], /*rtol=*/1e-5, /*atol=*/1e-6)) << "parameter " << i;
  }
  EXPECT_EQ(flat.flat_parameters().numel(), 50 * 16 + 16 * 32 + 32 + 32 * 16 + 16);
}

TEST(FlatAdamWTest, OneDimensionalTensorsWithoutDecayMatchTorchParamGroups) {
  for (const auto fused : {AdamWSettings::Fused::kOff, AdamWSettings::Fused::kOn}) {
    if (fused == AdamWSettings::Fused::kOn && !torch_compat::kHasFusedAdamW) continue;
    SCOPED_TRACE(fused == AdamWSettings::Fused::kOn ? "fused kernel (two segments)" : "our loop");
    CheckOneDimensionalWithoutDecay(fused);
  }
}

// A sharded rank (FlatShard: workers.sharding): the buffers are padded to n x S, the moments cover the slice only, the
// step moves only the slice (with the one-process stand-in for the cluster's reduce-scatter: the piece copied from the
// full gradient), and with its own gradient slice the full gradient buffer can be freed and comes back, still
// aliased by the parameters' gradients, at the next zeroing.
TEST(FlatAdamWTest, ShardedRankStepsItsSliceAndReleasesTheFullGradient) {
  for (const bool own : {false, true}) {
    SCOPED_TRACE(own ? "own gradient slice" : "slice of the full gradient");
    torch::manual_seed(3);
    Net net;
    const int64_t n = 50 * 16 + 16 * 32 + 32 + 32 * 16 + 16;  // 1872
    FlatAdamW flat(net.parameters(), AdamWSettings{}, FlatShard{1, 4, 100, own});
    EXPECT_TRUE(flat.sharded());
    EXPECT_EQ(flat.flat_parameters().numel(), n);
    EXPECT_EQ(flat.padded_parameters().numel(), 4 * 500);  // S = ceil(1872 / 400) x 100
    EXPECT_EQ(flat.exp_avg().numel(), 500);
    EXPECT_EQ(flat.gradient_piece().numel(), 500);
    for (int step = 0; step < 2; ++step) {
      flat.ZeroGrad();
      net.Loss(torch::randint(50, {4, 8}), torch::randint(50, {4, 8})).backward();
      const torch::Tensor full = flat.flat_gradients().clone();
      EXPECT_GT(full.abs().sum().item<double>(), 0);
      if (own) flat.gradient_piece().copy_(flat.padded_gradients().narrow(0, 500, 500));
      flat.ReleaseGradients();
      const torch::Tensor before = flat.flat_parameters().clone();
      flat.Step(1e-2);
      const torch::Tensor moved = (flat.flat_parameters() - before).abs() > 0;
      EXPECT_EQ(moved.narrow(0, 0, 500).sum().item<int64_t>(), 0) << "slice 0 is not this rank's";
      EXPECT_EQ(moved.narrow(0, 1000, n - 1000).sum().item<int64_t>(), 0) << "slices 2 and 3 are not this rank's";
      EXPECT_GT(moved.narrow(0, 500, 500).sum().item<int64_t>(), 400);
      EXPECT_NEAR(flat.SquaredSliceNorm().item<double>(), full.narrow(0, 500, 500).square().sum().item<double>(), 1e-4);
    }
    flat.ZeroGrad();  // after a release: the memory is back and the gradients are views of it again
    EXPECT_EQ(net.fc->weight.grad().data_ptr<float>(), flat.padded_gradients().data_ptr<float>() + 50 * 16);
    EXPECT_EQ(flat.flat_gradients().abs().sum().item<double>(), 0);
  }
}

}  // namespace diloco
