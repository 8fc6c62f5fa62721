// GPU tests (ctest label `cuda`): the CUDA paths against the CPU ones, on a machine with a GPU; each skips with the
// reason on a machine without one (CI's), so the label can always run. scripts/gpu/check runs them on a GPU machine.
//  - one inner step (forward, backward, clipping, LibTorch's fused AdamW) on cuda:0 equals the same step on the CPU,
//    every tensor at its own scale;
//  - causal attention through at::scaled_dot_product_attention on CUDA equals the composite ops (fp32 and bf16),
//    forward and backward;
//  - a one-rank NCCL group runs; a worker cluster of two ranks on two GPUs (NCCL) averages the flat gradient buffer
//    as the per-tensor mean; the sharded step (workers.sharding optimizer and gradients) of two ranks on two GPUs
//    over NCCL ends with the parameters of the same step of two CPU ranks over Gloo;
//  - a real run: coordinator evaluating on cuda:0, a worker training on cuda:0 and one on the CPU.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "tests/process_harness.h"
#include "worker/cluster.h"
#include "worker/flat_adamw.h"
#include "worker/lm/causal_attention.h"
#include "worker/lm/language_model.h"
#include "worker/lm/torch_compat.h"

namespace diloco::testing {
namespace {

#define SKIP_WITHOUT_GPUS(n)                                                                                \
  if (static_cast<int>(torch::cuda::device_count()) < (n)) {                                                \
    GTEST_SKIP() << "needs " << (n) << " CUDA device(s); this machine has "                                 \
                 << static_cast<int>(torch::cuda::device_count())                                           \
                 << (torch_compat::CudaBuilt() ? " (CUDA build)" : " (this build's LibTorch has no CUDA)"); \
  }

ModelConfig SmallLlama() {
  ModelConfig m;
  m.arch = ModelArch::kLlama;
  m.vocab_size = 128;
  m.seq_len = 32;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 64;
  return m;
}

double MaxRelDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.detach().cpu().to(torch::kDouble), y = b.detach().cpu().to(torch::kDouble);
  return ((x - y).abs().max() / (y.abs().max() + 1e-12)).item<double>();
}

// |a - b| / |b| (L2 norms over the tensor): each tensor is compared at its own scale, so an error in a 0.02-scale
// matrix is not hidden by a larger tensor elsewhere.
double RelNormDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.detach().cpu().to(torch::kDouble), y = b.detach().cpu().to(torch::kDouble);
  return ((x - y).norm() / (y.norm() + 1e-30)).item<double>();
}

// The inner step on cuda:0 against the same step on the CPU, each stage from equal inputs: the loss and every
// parameter's gradient (at that tensor's own scale); then the AdamW step (LibTorch's fused kernel on the GPU, our loop
// on the CPU) from equal parameters and gradients, element by element against the step size lr. With lr 1e-2 and
// weight decay 1.0 the decay moves a 0.02-scale weight by 2e-4 per step, 20x the tolerance, so a decay applied wrongly
// (or not at all) on either side fails; AdamW's division by sqrt(v) would amplify gradient rounding if the two sides
// stepped from their own gradients, hence the copy.
TEST(Cuda, InnerStepOnTheGpuMatchesTheCpu) {
  SKIP_WITHOUT_GPUS(1);
  const torch::Device gpu("cuda:0");
  LanguageModelPtr cpu_model = MakeLanguageModel(SmallLlama(), 3);
  LanguageModelPtr gpu_model = MakeLanguageModel(SmallLlama(), 3);
  gpu_model->to(gpu);
  AdamWSettings settings;
  settings.weight_decay = 1.0;
  FlatAdamW cpu_opt(cpu_model->parameters(), settings);
  FlatAdamW gpu_opt(gpu_model->parameters(), settings);
  EXPECT_EQ(gpu_opt.fused(), torch_compat::kHasFusedAdamW) << "CUDA steps take LibTorch's fused kernel";
  const double lr = 1e-2;
  torch::manual_seed(9);
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor x = torch::randint(0, 128, {4, 32}), y = torch::randint(0, 128, {4, 32});
    cpu_opt.ZeroGrad();
    gpu_opt.ZeroGrad();
    const torch::Tensor cpu_loss = cpu_model->Loss(x, y), gpu_loss = gpu_model->Loss(x.to(gpu), y.to(gpu));
    cpu_loss.backward();
    gpu_loss.backward();
    EXPECT_LT(MaxRelDiff(gpu_loss, cpu_loss), 1e-5) << "step " << step;
    const auto cpu_params = NamedParameters(*cpu_model), gpu_params = NamedParameters(*gpu_model);
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_LT(RelNormDiff(gpu_params[i].second.grad(), cpu_params[i].second.grad()), 1e-4)
          << "step " << step << " gradient of " << cpu_params[i].first;
    }
    torch::NoGradGuard no_grad;
    gpu_opt.flat_gradients().copy_(cpu_opt.flat_gradients());
    const torch::Tensor before = cpu_opt.flat_parameters().clone();
    cpu_opt.Step(lr, cpu_opt.ClipScale(0.5));
    gpu_opt.Step(lr, gpu_opt.ClipScale(0.5));
    const double moved = (cpu_opt.flat_parameters() - before).abs().max().item<double>();
    EXPECT_GT(moved, 0.5 * lr) << "step " << step;
    EXPECT_LT((gpu_opt.flat_parameters().cpu() - cpu_opt.flat_parameters()).abs().max().item<double>(), 1e-5)
        << "step " << step << " (lr " << lr << ")";
    gpu_opt.flat_parameters().copy_(cpu_opt.flat_parameters());  // the next step's forward from equal parameters
  }
}

// Forward and backward: the output and the gradient of qkv through at::scaled_dot_product_attention equal the
// composite ops' (fp32 and bf16), each at its own scale.
TEST(Cuda, SdpaAttentionMatchesTheCompositeOps) {
  SKIP_WITHOUT_GPUS(1);
  torch::manual_seed(4);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const torch::Tensor base = torch::randn({3, 64, 3 * 128}, torch::TensorOptions(dtype).device(torch::kCUDA));
    const torch::Tensor qkv = base.clone().requires_grad_(true);
    const torch::Tensor ref_qkv = base.to(torch::kFloat).clone().requires_grad_(true);
    const torch::Tensor fused = CausalSelfAttention(qkv, 4);
    const torch::Tensor reference = CausalSelfAttentionReference(ref_qkv, 4);
    const double tolerance = dtype == torch::kFloat ? 1e-3 : 5e-2;
    EXPECT_LT(RelNormDiff(fused, reference), tolerance) << dtype;
    const torch::Tensor upstream = torch::randn(reference.sizes(), reference.options());
    fused.backward(upstream.to(dtype));
    reference.backward(upstream);
    EXPECT_LT(RelNormDiff(qkv.grad(), ref_qkv.grad()), tolerance) << dtype << " backward";
  }
}

// A one-rank NCCL group (every GPU machine has one GPU): collective_nccl.cc's all-reduce and broadcast run, and
// leave the tensors as they are (the average over one rank).
TEST(Cuda, OneRankNcclGroupRuns) {
  SKIP_WITHOUT_GPUS(1);
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  auto cluster = WorkerCluster::Connect(0, 1, store, 60, "", torch::Device(torch::kCUDA, 0));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  torch::manual_seed(6);
  const torch::Tensor grads = torch::randn({1000}, torch::TensorOptions().device(torch::kCUDA));
  const torch::Tensor expected = grads.clone();
  EXPECT_TRUE((*cluster)->AverageGradients(grads, true)) << "the one rank's stop wish comes back";
  EXPECT_FALSE((*cluster)->AverageGradients(grads, false));
  std::vector<torch::Tensor> tensors = {torch::randn({7, 3}, torch::TensorOptions().device(torch::kCUDA))};
  const torch::Tensor before = tensors[0].clone();
  (*cluster)->Broadcast(tensors);
  torch::cuda::synchronize(0);
  EXPECT_TRUE(torch::equal(grads.cpu(), expected.cpu()));
  EXPECT_TRUE(torch::equal(tensors[0].cpu(), before.cpu()));
}

TEST(Cuda, NcclClusterAveragesTheFlatGradientBuffer) {
  SKIP_WITHOUT_GPUS(2);
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  std::vector<LanguageModelPtr> models;
  std::vector<std::unique_ptr<FlatAdamW>> optimizers;
  std::vector<std::vector<torch::Tensor>> grads(2);
  for (int r = 0; r < 2; ++r) {
    models.push_back(MakeLanguageModel(SmallLlama(), 5));
    models[r]->to(torch::Device(torch::kCUDA, r));
    optimizers.push_back(std::make_unique<FlatAdamW>(models[r]->parameters(), AdamWSettings{}));
    torch::manual_seed(100 + r);
    for (const torch::Tensor& p : models[r]->parameters()) {
      grads[r].push_back(torch::randn(p.sizes()));
      p.mutable_grad().copy_(grads[r].back());
    }
  }
  std::vector<std::string> errors(2);
  auto run = [&](int r) {
    auto cluster = WorkerCluster::Connect(r, 2, store, 120, "", torch::Device(torch::kCUDA, r));
    if (!cluster.ok()) {
      errors[r] = std::string(cluster.status().message());
      return;
    }
    (*cluster)->AverageGradients(optimizers[r]->flat_gradients(), false);
    torch::cuda::synchronize(r);
  };
  std::thread rank0(run, 0), rank1(run, 1);
  rank0.join();
  rank1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (int r = 0; r < 2; ++r) {
    const auto params = models[r]->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_LT(MaxRelDiff(params[i].grad(), (grads[0][i] + grads[1][i]) / 2), 1e-6) << "rank " << r << " tensor " << i;
    }
  }
}

// Two ranks of a sharded cluster (FlatShard: slices of 256 elements) take kShardedSteps steps from the same
// per-rank gradients (seeded on the CPU): reduce-scatter into the rank's slice, global clipping (max norm 1, so
// the random gradients are clipped), AdamW on the slice, all-gather. Returns each rank's flat parameters (CPU) and
// the number of moments each holds; `device` cuda runs rank r on cuda:r over NCCL, the CPU over Gloo.
constexpr int kShardedSteps = 3;
struct ShardedResult {
  std::vector<torch::Tensor> parameters;  // per rank, flat, on the CPU
  std::vector<int64_t> moments;           // per rank: exp_avg's elements
  std::vector<std::string> errors;
};

ShardedResult RunShardedSteps(torch::DeviceType device, bool own_gradient_slice) {
  const std::string store = "127.0.0.1:" + std::to_string(FreePort());
  ShardedResult out{std::vector<torch::Tensor>(2), std::vector<int64_t>(2), std::vector<std::string>(2)};
  // Models, optimizers and gradients made here, in order (the global generator is not for two threads at once).
  std::vector<torch::Device> on;
  std::vector<LanguageModelPtr> models;
  std::vector<std::unique_ptr<FlatAdamW>> optimizers;
  std::vector<std::vector<std::vector<torch::Tensor>>> grads(2);  // [rank][step][parameter]
  for (int r = 0; r < 2; ++r) {
    on.push_back(device == torch::kCUDA ? torch::Device(torch::kCUDA, r) : torch::Device(torch::kCPU));
    models.push_back(MakeLanguageModel(SmallLlama(), 5));
    models[r]->to(on[r]);
    optimizers.push_back(std::make_unique<FlatAdamW>(models[r]->parameters(), AdamWSettings{},
                                                     FlatShard{r, 2, /*align=*/256, own_gradient_slice}));
    torch::manual_seed(100 + r);
    for (int step = 0; step < kShardedSteps; ++step) {
      grads[r].emplace_back();
      for (const torch::Tensor& p : models[r]->parameters()) grads[r][step].push_back(torch::randn(p.sizes()));
    }
  }
  auto run = [&](int r) {
    auto cluster = WorkerCluster::Connect(r, 2, store, 120, "", on[r]);
    if (!cluster.ok()) {
      out.errors[r] = std::string(cluster.status().message());
      return;
    }
    FlatAdamW& optimizer = *optimizers[r];
    const auto params = models[r]->parameters();
    for (int step = 0; step < kShardedSteps; ++step) {
      optimizer.ZeroGrad();
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad().copy_(grads[r][step][i].to(on[r]));
      (*cluster)->ReduceScatterGradients(optimizer, false);
      const double norm = std::sqrt((*cluster)->squared_gradient_norm().item<double>());
      optimizer.Step(1e-2, std::min(1.0, 1.0 / (norm + 1e-6)));
      (*cluster)->GatherParameters(optimizer);
    }
    if (on[r].is_cuda()) torch::cuda::synchronize(r);
    out.parameters[r] = optimizer.flat_parameters().cpu();
    out.moments[r] = optimizer.exp_avg().numel();
  };
  std::thread rank0(run, 0), rank1(run, 1);
  rank0.join();
  rank1.join();
  return out;
}

// workers.sharding over NCCL (issue 29): the sharded step on cuda:0 and cuda:1 against the same step of two CPU ranks
// over Gloo, for both optimizer and gradients: the same parameters (LibTorch's fused AdamW on the GPU, our loop on
// the CPU: to 1e-5 of a step of lr 1e-2), both GPU ranks equal bit for bit, and each holds its slice's moments only.
TEST(Cuda, ShardedNcclClusterMatchesTheGlooCluster) {
  SKIP_WITHOUT_GPUS(2);
  for (const bool own_gradient_slice : {false, true}) {
    SCOPED_TRACE(own_gradient_slice ? "workers.sharding gradients" : "workers.sharding optimizer");
    const ShardedResult gloo = RunShardedSteps(torch::kCPU, own_gradient_slice);
    const ShardedResult nccl = RunShardedSteps(torch::kCUDA, own_gradient_slice);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(gloo.errors[r], "");
      ASSERT_EQ(nccl.errors[r], "");
      EXPECT_EQ(nccl.moments[r], gloo.moments[r]) << "rank " << r;
      EXPECT_LT(nccl.moments[r], nccl.parameters[r].numel()) << "rank " << r << " holds its slice's moments only";
      EXPECT_LT((nccl.parameters[r] - gloo.parameters[r]).abs().max().item<double>(), 1e-5) << "rank " << r;
    }
    EXPECT_TRUE(torch::equal(nccl.parameters[0], nccl.parameters[1])) << "the all-gather leaves equal replicas";
  }
}

// The heterogeneity claim on one machine: a worker on cuda:0 and a worker on the CPU train the same run, the
// coordinator evaluating on cuda:0; the run completes and its validation loss falls.
TEST(Cuda, GpuAndCpuWorkersTrainOneRun) {
  SKIP_WITHOUT_GPUS(1);
  const std::string dir = ScratchDir("cuda_hetero");
  std::vector<std::string> args = TinyArgs(dir, {"outer.rounds=3", "inner.steps=30", "coordinator.device=cuda:0"});
  args.erase(args.begin());  // the launcher takes the config as a positional argument
  args.insert(args.end(), {"--worker-set", "0:workers.device=cuda:0"});
  RunningProcess launch("diloco-launch", args);
  ASSERT_EQ(launch.Wait(600), 0) << launch.output();
  EXPECT_NE(launch.output().find("device cuda:0"), std::string::npos) << launch.output();
  const std::string out = launch.output();
  const std::regex val_loss("val_loss ([0-9.]+)");
  std::vector<double> losses;
  for (std::sregex_iterator it(out.begin(), out.end(), val_loss), end; it != end; ++it) {
    losses.push_back(std::stod((*it)[1]));
  }
  ASSERT_GE(losses.size(), 2u) << out;
  EXPECT_LT(losses.back(), losses.front() - 0.2) << out;
}

}  // namespace
}  // namespace diloco::testing
