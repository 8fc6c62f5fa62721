// worker/lm/init_from.h: the Hugging Face half (copy by name, bf16/fp16 -> fp32, missing and misshapen tensors) and
// our checkpoint half (fingerprint check).
#include "worker/lm/init_from.h"

#include <gtest/gtest.h>

#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"
#include "tests/unit/scratch_dir_test.h"

namespace diloco {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

Named Theta() { return {{"a.weight", at::zeros({2, 3})}, {"b.bias", at::zeros({3})}}; }

TEST(InitFrom, CopiesByNameAndConvertsToFloat32) {
  Named theta = Theta();
  std::unordered_map<std::string, at::Tensor> stored = {
      {"b.bias", at::tensor({0.5, -1.25, 3.0}).to(at::kHalf)},
      {"a.weight", at::arange(6, at::kFloat).reshape({2, 3}).to(at::kBFloat16)},
      {"lm_head.weight", at::ones({3, 2})}};  // a tied head the model does not hold: ignored
  ASSERT_TRUE(CopyHfWeights("d", stored, theta).ok());
  EXPECT_EQ(theta[0].first, "a.weight");
  EXPECT_EQ(theta[0].second.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(theta[0].second, at::arange(6, at::kFloat).reshape({2, 3})));
  EXPECT_TRUE(at::equal(theta[1].second, at::tensor({0.5f, -1.25f, 3.0f})));
}

TEST(InitFrom, MissingOrMisshapenTensorIsOneLine) {
  Named theta = Theta();
  absl::Status s = CopyHfWeights("hf", {{"a.weight", at::zeros({2, 3})}}, theta);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "model.init_from hf: tensor 'b.bias' [3] is missing from the checkpoint's safetensors");
  s = CopyHfWeights("hf", {{"a.weight", at::zeros({3, 2})}, {"b.bias", at::zeros({3})}}, theta);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("'a.weight' is [3, 2] in the checkpoint, the model wants [2, 3]"), std::string::npos);
  s = CopyHfWeights("hf", {{"a.weight", at::zeros({2, 3}, at::kLong)}, {"b.bias", at::zeros({3})}}, theta);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

class InitFromCheckpoint : public ScratchDirTest {};

TEST_F(InitFromCheckpoint, LoadsOurCheckpointOfTheSameModel) {
  CheckpointData data;
  data.round = 7;
  data.params = {{"a.weight", at::full({2, 3}, 2.5f)}, {"b.bias", at::full({3}, -1.0f)}};
  data.fingerprint = Fingerprint(SpecsOf(data.params));
  ASSERT_TRUE(SaveCheckpoint(Path("c.bin"), data).ok());
  ModelConfig model;
  model.init_from = Path("c.bin");
  Named theta = Theta();
  std::string source;
  ASSERT_TRUE(LoadInitFrom(model, theta, &source).ok());
  EXPECT_TRUE(at::equal(theta[0].second, at::full({2, 3}, 2.5f)));
  EXPECT_NE(source.find("round-7"), std::string::npos);

  Named other = {{"a.weight", at::zeros({3, 3})}, {"b.bias", at::zeros({3})}};
  absl::Status s = LoadInitFrom(model, other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("does not match model:"), std::string::npos) << s;
}

}  // namespace
}  // namespace diloco
