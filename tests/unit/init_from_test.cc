// worker/lm/init_from.h: theta_0 from our checkpoint (fingerprint checked) or from a Hugging Face directory (a llama
// written as BF16 safetensors here: the values arrive as float32, rounded as stored; a missing tensor is one line).
#include "worker/lm/init_from.h"

#include <gtest/gtest.h>

#include <fstream>

#include "config/hf_model_config.h"
#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"
#include "tests/unit/scratch_dir_test.h"
#include "tests/unit/tiny_models.h"
#include "worker/lm/safetensors.h"

namespace diloco {
namespace {

class InitFromTest : public ScratchDirTest {
 protected:
  // The parameters of `m` (seed 5) as a Hugging Face directory in BF16, less the tensors named in `skip`.
  std::vector<std::pair<std::string, torch::Tensor>> WriteHfDir(const ModelConfig& m, const std::string& skip = "") {
    LanguageModelPtr source = MakeLanguageModel(m, 5);
    std::vector<std::pair<std::string, torch::Tensor>> stored;
    std::vector<SafetensorsEntry> entries;
    for (const auto& [name, p] : NamedParameters(*source)) {
      if (name == skip) continue;
      stored.emplace_back(name, p.detach().to(torch::kBFloat16).contiguous());
      entries.push_back({name, p.sizes().vec(), stored.back().second.data_ptr(), SafetensorsDtype::kBF16});
    }
    EXPECT_TRUE(WriteSafetensors(Path("model.safetensors"), entries, {{"format", "pt"}}).ok());
    std::ofstream(Path("config.json")) << HfConfigJson(m, "bfloat16").dump();
    return stored;
  }
};

TEST_F(InitFromTest, HuggingFaceDirectoryInBf16BecomesFloat32Parameters) {
  ModelConfig m = TinyLlama(/*tied=*/false);
  const auto stored = WriteHfDir(m);
  m.init_from = dir_.string();
  LanguageModelPtr model = MakeLanguageModel(m, 9);  // another init: the load must overwrite every tensor
  std::string source;
  absl::Status s = LoadInitFrom(m, *model, &source);
  ASSERT_TRUE(s.ok()) << s;
  const auto params = NamedParameters(*model);
  ASSERT_EQ(params.size(), stored.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].second.scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(params[i].second, stored[i].second.to(torch::kFloat))) << params[i].first;
  }
  EXPECT_NE(source.find("Hugging Face llama"), std::string::npos) << source;
}

TEST_F(InitFromTest, MissingTensorIsOneLineNamingIt) {
  ModelConfig m = TinyLlama(/*tied=*/false);
  WriteHfDir(m, "model.layers.1.mlp.down_proj.weight");
  m.init_from = dir_.string();
  LanguageModelPtr model = MakeLanguageModel(m, 9);
  absl::Status s = LoadInitFrom(m, *model);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.init_from: "), std::string::npos) << s;
  EXPECT_NE(s.message().find("model.layers.1.mlp.down_proj.weight"), std::string::npos) << s;
  EXPECT_EQ(std::string(s.message()).find('\n'), std::string::npos);
}

TEST_F(InitFromTest, DirectoryWithoutWeightsIsNotFound) {
  ModelConfig m = TinyLlama(/*tied=*/false);
  std::ofstream(Path("config.json")) << HfConfigJson(m, "float32").dump();
  m.init_from = dir_.string();
  LanguageModelPtr model = MakeLanguageModel(m, 9);
  absl::Status s = LoadInitFrom(m, *model);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  // Weights as a pickle only (an older save): named, with how to convert them.
  std::ofstream(Path("pytorch_model.bin")) << "not read";
  s = LoadInitFrom(m, *model);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(std::string(s.message()).find("the weights are in pytorch_model.bin, which is not read"), std::string::npos)
      << s;
}

// config.json's GPT-2 dropouts are not applied: the theta_0 line says so.
TEST_F(InitFromTest, TheSourceLineSaysWhichDropoutIsNotApplied) {
  const ModelConfig m = TinyLlama(/*tied=*/false);
  WriteHfDir(m);
  auto j = HfConfigJson(m, "bfloat16");
  j["attention_dropout"] = 0.1;
  std::ofstream(Path("config.json")) << j.dump();
  ModelConfig with = m;
  with.init_from = dir_.string();
  LanguageModelPtr model = MakeLanguageModel(with, 9);
  std::string source;
  ASSERT_TRUE(LoadInitFrom(with, *model, &source).ok());
  EXPECT_NE(source.find("; config.json's attention_dropout 0.1 not applied: training runs without dropout"),
            std::string::npos)
      << source;
}

TEST_F(InitFromTest, OurCheckpointOfTheSameModelOnly) {
  ModelConfig m;  // gpt
  LanguageModelPtr trained = MakeLanguageModel(m, 3);
  CheckpointData data;
  data.round = 7;
  for (const auto& [name, p] : NamedParameters(*trained)) data.params.emplace_back(name, p.detach().clone());
  data.fingerprint = Fingerprint(SpecsOf(data.params));
  ASSERT_TRUE(SaveCheckpoint(Path("c.bin"), data).ok());
  m.init_from = Path("c.bin");
  LanguageModelPtr model = MakeLanguageModel(m, 4);
  std::string source;
  ASSERT_TRUE(LoadInitFrom(m, *model, &source).ok());
  EXPECT_TRUE(torch::equal(NamedParameters(*model)[0].second, data.params[0].second));
  EXPECT_NE(source.find("round-7"), std::string::npos);

  ModelConfig wider = m;
  wider.d_model = 64;
  LanguageModelPtr other = MakeLanguageModel(wider, 4);
  absl::Status s = LoadInitFrom(wider, *other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("does not match model:"), std::string::npos) << s;
}

}  // namespace
}  // namespace diloco
