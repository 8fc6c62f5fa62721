// The model host (coordinator/model_host.h), the one coordinator part that knows the model: theta_0 from model: and
// run.seed or from model.init_from, and the Evaluator over the validation shard, alone and as the core's evaluator.
// The core's own tests (coordinator_core_test.cc) build it from plain tensors; this is where the real model is used.
#include "coordinator/model_host.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"
#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_coordinator_config.h"
#include "worker/data/token_data.h"
#include "worker/data/token_manifest.h"
#include "worker/data/token_shard.h"
#include "worker/lm/evaluate.h"
#include "worker/lm/language_model.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class ModelHostTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_ = TinyCoordinatorConfig(dir_);
    config_.run.seed = 7;
    cache_ = TokenCache{dir_.string()};
    std::vector<uint32_t> ids(5000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>((i * 7919 + i / 13) % 64);
    std::string error;
    ASSERT_TRUE(WriteTokenShard(cache_.val_path(), ids, 64, &error)) << error;
    TokenManifest manifest;  // the validation split; the model host reads no training data
    manifest.vocab_size = 64;
    manifest.val = manifest.train = {{cache_.val_path(), 24, 2, ids.size()}};
    ASSERT_TRUE(WriteTokenManifest(cache_.meta_path(), manifest, &error)) << error;
  }
  // The validation loss computed directly with worker/lm, for `theta`.
  double DirectLoss(const NamedTensors& theta) const {
    LanguageModelPtr model = MakeLanguageModel(config_.model, config_.run.seed);
    LoadParameters(*model, theta);
    auto val = TokenData::Load(cache_.meta_path(), TokenSplit::kVal, config_.model.seq_len);
    EXPECT_TRUE(val.ok()) << val.status();
    return EvaluateLoss(model, *val, config_.coordinator.eval_batches, config_.inner.batch_size);
  }
  static NamedTensors Scaled(const NamedTensors& theta, double factor) {
    NamedTensors out;
    for (const auto& [name, t] : theta) out.emplace_back(name, t * factor);
    return out;
  }

  Config config_;
  TokenCache cache_;
};

TEST_F(ModelHostTest, Theta0IsTheSeededModelAndTheEvaluatorUsesTheValidationShard) {
  auto hosted = HostModel(config_, cache_);
  ASSERT_TRUE(hosted.ok()) << hosted.status();
  LanguageModelPtr model = MakeLanguageModel(config_.model, config_.run.seed);
  const auto expected = NamedParameters(*model);
  ASSERT_EQ(hosted->theta_0.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(hosted->theta_0[i].first, expected[i].first);
    EXPECT_TRUE(hosted->theta_0[i].second.equal(expected[i].second)) << expected[i].first;
  }
  // The core's tests stand in a plain-tensor theta_0 of the same layout: same fingerprint as the real model.
  EXPECT_EQ(Fingerprint(SpecsOf(hosted->theta_0)), Fingerprint(SpecsOf(TinyTheta0(config_.model))));
  const double loss0 = hosted->evaluator->Evaluate(hosted->theta_0);
  EXPECT_DOUBLE_EQ(loss0, DirectLoss(hosted->theta_0));
  // It evaluates the theta it is given, not the one it was built with.
  const NamedTensors other = Scaled(hosted->theta_0, 30.0);
  const double loss_other = hosted->evaluator->Evaluate(other);
  EXPECT_DOUBLE_EQ(loss_other, DirectLoss(other));
  EXPECT_GT(std::abs(loss_other - loss0), 1e-3);
}

TEST_F(ModelHostTest, InitFromLoadsTheCheckpointAndRefusesAnotherModel) {
  auto seeded = HostModel(config_, cache_);
  ASSERT_TRUE(seeded.ok()) << seeded.status();
  CheckpointData data;
  data.round = 4;
  data.params = Scaled(seeded->theta_0, 2.0);
  data.fingerprint = Fingerprint(SpecsOf(data.params));
  ASSERT_TRUE(SaveCheckpoint(Path("good.bin"), data).ok());
  data.fingerprint = "0123456789abcdef";
  ASSERT_TRUE(SaveCheckpoint(Path("other.bin"), data).ok());

  config_.model.init_from = Path("good.bin");
  auto loaded = HostModel(config_, cache_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->theta_0.size(), seeded->theta_0.size());
  for (size_t i = 0; i < seeded->theta_0.size(); ++i) {
    EXPECT_TRUE(loaded->theta_0[i].second.equal(seeded->theta_0[i].second * 2.0)) << i;
  }
  config_.model.init_from = Path("other.bin");
  auto other = HostModel(config_, cache_);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.status().message()), StartsWith("model.init_from "));
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("use a checkpoint of the same model"));
  config_.model.init_from = Path("missing.bin");
  auto missing = HostModel(config_, cache_);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), StartsWith("model.init_from: "));
}

// The core evaluates theta_0 once at creation with the evaluator it was handed (coordinator.eval_every > 0).
TEST_F(ModelHostTest, CoreEvaluatesTheta0WithTheHostedEvaluator) {
  config_.coordinator.eval_every = 1;
  auto hosted = HostModel(config_, cache_);
  ASSERT_TRUE(hosted.ok()) << hosted.status();
  const double want = DirectLoss(hosted->theta_0);
  auto core = CoordinatorCore::Create(config_, std::move(hosted->theta_0), std::move(hosted->evaluator));
  ASSERT_TRUE(core.ok()) << core.status();
  const StatusReply s = (*core)->Status();
  ASSERT_EQ(s.evals_size(), 1);
  EXPECT_EQ(s.evals(0).round(), 0);
  EXPECT_DOUBLE_EQ(s.evals(0).val_loss(), want);
}

TEST_F(ModelHostTest, CreateRefusesAMissingEvaluatorWhenEvaluationIsOn) {
  config_.coordinator.eval_every = 1;
  auto core = CoordinatorCore::Create(config_, TinyTheta0(config_.model), nullptr);
  ASSERT_FALSE(core.ok());
  EXPECT_THAT(std::string(core.status().message()), HasSubstr("eval_every"));
  NamedTensors doubles = {{"w", at::zeros({2}, at::kDouble)}};
  config_.coordinator.eval_every = 0;
  auto wrong = CoordinatorCore::Create(config_, doubles, nullptr);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("'w' is not a float32 tensor"));
}

}  // namespace
}  // namespace diloco
