// Where tensors live when training runs on a device other than the CPU, checked without a GPU (docs/operations.md,
// "Two LibTorch builds, GPUs"): meta tensors (which LibTorch 1.13 and 2.x both make with no GPU) stand for a GPU's.
// InnerTrainer::PseudoGradient refuses a theta that is not on the CPU with a message naming its device (not
// LibTorch's "found at least two devices" from deep inside a subtraction), and --mode ddp's evaluation replica
// (EvalReplica, worker/lm/evaluate.h) is moved to the device it is given and evaluates what it was handed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_coordinator_config.h"
#include "tests/unit/token_files.h"
#include "worker/lm/evaluate.h"
#include "worker/trainer.h"

namespace diloco {
namespace {

const torch::Device kMeta(torch::kMeta);

class DevicePlacementTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_ = TinyCoordinatorConfig(dir_);
    std::vector<uint32_t> ids(5000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7 + i * i / 3) % 64);
    std::string error;
    ASSERT_TRUE(WriteTokenShard(Path("t.tok"), ids, 64, &error)) << error;
    manifest_ = WriteManifest(Path("m.json"), {{Path("t.tok"), 24, 2, ids.size()}});
  }

  std::unique_ptr<InnerTrainer> MakeTrainer() {
    auto trainer = InnerTrainer::ForShard(config_, manifest_, 0, 1, 0, 1);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    return trainer.ok() ? std::move(*trainer) : nullptr;
  }

  Config config_;
  std::string manifest_;
};

TEST_F(DevicePlacementTest, PseudoGradientRefusesThetaOffTheCpuNamingItsDevice) {
  std::unique_ptr<InnerTrainer> trainer = MakeTrainer();
  ASSERT_NE(trainer, nullptr);
  NamedTensors theta;
  for (const auto& [name, p] : NamedParameters(*trainer->model())) theta.emplace_back(name, p.detach().clone());
  std::vector<size_t> all(theta.size());
  std::iota(all.begin(), all.end(), size_t{0});
  trainer->TrainSteps(0, 1);
  const NamedTensors delta = trainer->PseudoGradient(theta, all);  // on the CPU: theta_t - local
  ASSERT_EQ(delta.size(), theta.size());
  EXPECT_TRUE(delta[0].second.device().is_cpu());
  EXPECT_GT(delta[0].second.abs().max().item<float>(), 0.0f) << "one AdamW step moved the parameters";

  theta[1].second = at::empty(theta[1].second.sizes(), at::TensorOptions(at::kFloat).device(kMeta));
  try {
    trainer->PseudoGradient(theta, all);
    ADD_FAILURE() << "a theta on the meta device was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("theta tensor '" + theta[1].first + "' is on meta"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the model on cpu"));
  }
}

TEST_F(DevicePlacementTest, EvalReplicaEvaluatesTheTrainedParametersOnItsDevice) {
  std::unique_ptr<InnerTrainer> trainer = MakeTrainer();
  ASSERT_NE(trainer, nullptr);
  trainer->TrainSteps(0, 3);
  auto val = TokenData::Load(manifest_, TokenSplit::kVal, config_.model.seq_len);
  ASSERT_TRUE(val.ok()) << val.status();
  LanguageModelPtr trained = trainer->model();
  const double expected = EvaluateLoss(trained, *val, 2, 4);
  EXPECT_TRUE(trained->is_training()) << "EvaluateLoss restores the training mode";

  EvalReplica replica(config_.model, config_.run.seed, torch::kCPU);
  LanguageModelPtr fresh = replica.model();
  const double untrained = EvaluateLoss(fresh, *val, 2, 4);
  EXPECT_NE(untrained, expected) << "three steps change the loss, so a replica that copied nothing would show";
  EXPECT_EQ(replica.Evaluate(*trained, *val, 2, 4), expected);
  EXPECT_TRUE(trained->is_training());
}

// The replica is moved to the device it is given. LibTorch 1.13's Module::to refuses the meta device (set_data
// between a CPU and a meta tensor): there the move itself throws, where a replica left on the CPU would not; a
// LibTorch that allows it must leave every parameter and buffer on meta.
TEST_F(DevicePlacementTest, EvalReplicaLivesOnTheDeviceItIsGiven) {
  std::unique_ptr<EvalReplica> replica;
  try {
    replica = std::make_unique<EvalReplica>(config_.model, config_.run.seed, kMeta);
  } catch (const c10::Error&) {
    return;  // the move to meta was attempted, and refused
  }
  EXPECT_EQ(replica->device(), kMeta);
  int64_t checked = 0;
  for (const auto& p : replica->model()->parameters()) {
    EXPECT_EQ(p.device(), kMeta);
    ++checked;
  }
  for (const auto& b : replica->model()->buffers()) EXPECT_EQ(b.device(), kMeta);
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace diloco
