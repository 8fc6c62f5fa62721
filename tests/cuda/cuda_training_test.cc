// GPU tests of the inner loop's options (ctest label `cuda`; each skips with the reason where no CUDA device is
// present, as tests/cuda/cuda_test.cc's): on cuda:0, micro-batches leave the whole batch's gradient, activation
// checkpointing the plain model's, bf16 autocast trains near fp32 without being fp32, the pseudo-gradient (copied to
// the host through pinned memory) equals theta - the model's parameters, evaluation gives the CPU's loss, and
// diloco-bench-train --device cuda:0 runs to its report.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "tests/process_harness.h"
#include "tests/unit/token_files.h"
#include "worker/lm/evaluate.h"
#include "worker/lm/torch_compat.h"
#include "worker/trainer.h"

namespace diloco::testing {
namespace {

#define SKIP_WITHOUT_GPU()                                                                                  \
  if (torch::cuda::device_count() < 1) {                                                                    \
    GTEST_SKIP() << "needs a CUDA device; this machine has none"                                            \
                 << (torch_compat::CudaBuilt() ? " (CUDA build)" : " (this build's LibTorch has no CUDA)"); \
  }

// |a - b| / |b| over a whole tensor (L2 norms), in double on the CPU: small when a and b agree element by element
// at b's own scale, whatever the scale of the other tensors of the model.
double RelNormDiff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.detach().cpu().to(torch::kDouble), y = b.detach().cpu().to(torch::kDouble);
  return ((x - y).norm() / (y.norm() + 1e-30)).item<double>();
}

// A llama with grouped-query attention over a 64-token vocabulary, trained on a deterministic token file.
class GpuTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (torch::cuda::device_count() < 1) return;
    dir_ = ScratchDir("cuda_training");
    std::vector<uint32_t> ids(40000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7 + i / 5 + i * i / 3) % 64);
    std::string error;
    ASSERT_TRUE(WriteTokenShard(dir_ + "/t.tok", ids, 64, &error)) << error;
    manifest_ = WriteManifest(dir_ + "/m.json", {{dir_ + "/t.tok", 24, 2, ids.size()}});
    config_.model.arch = ModelArch::kLlama;
    config_.model.vocab_size = 64;
    config_.model.seq_len = 32;
    config_.model.n_layer = 2;
    config_.model.n_head = 4;
    config_.model.n_kv_head = 2;
    config_.model.d_model = 64;
    config_.inner.batch_size = 8;
    config_.inner.warmup_steps = 0;
    config_.workers.device = "cuda:0";
  }

  std::unique_ptr<InnerTrainer> Trainer(const Config& c) {
    auto trainer = InnerTrainer::ForShard(c, manifest_, 0, 1, 0, 1);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    return trainer.ok() ? std::move(*trainer) : nullptr;
  }

  std::string dir_, manifest_;
  Config config_;
};

// Tolerances: the same sums in another order on the GPU (fp32; cuBLAS picks no TF32 by default): measured on the CPU
// for the same comparison 2.6e-7 of the largest gradient (tests/unit/micro_batch_test.cc); 1e-4 of each tensor's norm
// leaves room for GPU reduction orders, while a micro-batch loss left unscaled is off by 3x.
TEST_F(GpuTraining, MicroBatchesLeaveTheWholeBatchsGradient) {
  SKIP_WITHOUT_GPU();
  Config micro = config_;
  micro.inner.micro_batch_size = 2;
  auto whole_trainer = Trainer(config_), micro_trainer = Trainer(micro);
  ASSERT_TRUE(whole_trainer && micro_trainer);
  const StepStats whole = whole_trainer->TrainSteps(0, 2), split = micro_trainer->TrainSteps(0, 2);
  EXPECT_NEAR(split.loss_sum, whole.loss_sum, 1e-5 * whole.loss_sum);
  EXPECT_LT(RelNormDiff(micro_trainer->optimizer().flat_gradients(), whole_trainer->optimizer().flat_gradients()),
            1e-4);
  EXPECT_LT(RelNormDiff(micro_trainer->optimizer().flat_parameters(), whole_trainer->optimizer().flat_parameters()),
            1e-5);
}

TEST_F(GpuTraining, ActivationCheckpointingLeavesThePlainGradient) {
  SKIP_WITHOUT_GPU();
  Config checkpointed = config_;
  checkpointed.model.activation_checkpointing = true;
  auto plain_trainer = Trainer(config_), checkpointed_trainer = Trainer(checkpointed);
  ASSERT_TRUE(plain_trainer && checkpointed_trainer);
  const StepStats plain = plain_trainer->TrainSteps(0, 2), recomputed = checkpointed_trainer->TrainSteps(0, 2);
  EXPECT_NEAR(recomputed.loss_sum, plain.loss_sum, 1e-5 * plain.loss_sum);
  EXPECT_LT(
      RelNormDiff(checkpointed_trainer->optimizer().flat_gradients(), plain_trainer->optimizer().flat_gradients()),
      1e-4);
}

// bf16 autocast on the GPU: with theta_0 x 10 (large logits, as tests/unit/micro_batch_test.cc) the first loss is not
// fp32's (~4e-3 apart there on the CPU), and from theta_0 the mean loss of 30 steps is within 2% of fp32's.
TEST_F(GpuTraining, Bf16TrainsNearFp32AndIsNotFp32) {
  SKIP_WITHOUT_GPU();
  Config bf16 = config_;
  bf16.workers.precision = Precision::kBf16;
  auto fp32_scaled = Trainer(config_), bf16_scaled = Trainer(bf16);
  ASSERT_TRUE(fp32_scaled && bf16_scaled);
  NamedTensors scaled = NamedParameters(*fp32_scaled->model());
  for (auto& [name, t] : scaled) t = t.detach().cpu() * 10;
  fp32_scaled->Load(scaled);
  bf16_scaled->Load(scaled);
  EXPECT_GT(std::abs(bf16_scaled->TrainSteps(0, 1).first_loss - fp32_scaled->TrainSteps(0, 1).first_loss), 1e-4)
      << "bf16 matmuls change the loss";
  auto fp32_trainer = Trainer(config_), bf16_trainer = Trainer(bf16);
  ASSERT_TRUE(fp32_trainer && bf16_trainer);
  const StepStats a = fp32_trainer->TrainSteps(0, 30), b = bf16_trainer->TrainSteps(0, 30);
  EXPECT_NEAR(b.loss_sum / b.steps, a.loss_sum / a.steps, 0.02 * a.loss_sum / a.steps);
  EXPECT_LT(a.loss_sum / a.steps, a.first_loss) << "the loss falls";
}

// The pseudo-gradient of a GPU model: theta - local, with local copied to the host through pinned memory.
TEST_F(GpuTraining, PseudoGradientIsThetaMinusTheGpuParameters) {
  SKIP_WITHOUT_GPU();
  auto trainer = Trainer(config_);
  ASSERT_TRUE(trainer);
  NamedTensors theta = NamedParameters(*trainer->model());
  for (auto& [name, t] : theta) t = t.detach().cpu().clone();
  const auto result = trainer->TrainRound(theta, 0);
  ASSERT_TRUE(result.has_value());
  const NamedTensors local = NamedParameters(*trainer->model());
  ASSERT_EQ(result->pseudo_gradient.size(), theta.size());
  for (size_t i = 0; i < theta.size(); ++i) {
    EXPECT_TRUE(result->pseudo_gradient[i].second.device().is_cpu());
    EXPECT_TRUE(torch::equal(result->pseudo_gradient[i].second, theta[i].second - local[i].second.cpu()))
        << theta[i].first;
  }
  EXPECT_GT(result->pseudo_gradient[0].second.abs().max().item<double>(), 0) << "training moved the parameters";
}

TEST_F(GpuTraining, EvaluationOnTheGpuGivesTheCpusLoss) {
  SKIP_WITHOUT_GPU();
  auto trainer = Trainer(config_);
  ASSERT_TRUE(trainer);
  trainer->TrainSteps(0, 5);
  auto val = TokenData::Load(manifest_, TokenSplit::kVal, config_.model.seq_len);
  ASSERT_TRUE(val.ok()) << val.status();
  EvalReplica on_cpu(config_.model, 1, torch::kCPU), on_gpu(config_.model, 1, torch::Device("cuda:0"));
  const double cpu = on_cpu.Evaluate(*trainer->model(), *val, 4, 8);
  const double gpu = on_gpu.Evaluate(*trainer->model(), *val, 4, 8);
  EXPECT_NEAR(gpu, cpu, 1e-5 * cpu);
}

TEST(GpuBench, BenchTrainRunsOnTheGpuToItsReport) {
  SKIP_WITHOUT_GPU();
  std::vector<std::string> args = TinyArgs(ScratchDir("cuda_bench_train"));
  args.insert(args.end(), {"--steps", "5", "--device", "cuda:0"});
  RunningProcess bench("diloco-bench-train", args);
  ASSERT_EQ(bench.Wait(300), 0) << bench.output();
  const std::string out = bench.output();
  const size_t brace = out.rfind("{\"");
  ASSERT_NE(brace, std::string::npos) << out;
  const nlohmann::json report = nlohmann::json::parse(out.substr(brace, out.find('\n', brace) - brace));
  EXPECT_GT(report.value("tokens_per_s", 0.0), 0.0) << out;
}

}  // namespace
}  // namespace diloco::testing
