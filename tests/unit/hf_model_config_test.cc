// config/hf_model_config.h and the loader's merge of a Hugging Face config.json (config_loader.h): both layouts of
// config.json transformers writes (literal copies of save_pretrained outputs: 5.25, and 4.46 for the 4.x layout),
// the merge with the YAML, the conflict error, unknown model types, a directory without config.json.
#include "config/hf_model_config.h"

#include <gtest/gtest.h>

#include <fstream>

#include "config/config_loader.h"
#include "tests/unit/scratch_dir_test.h"

namespace diloco {
namespace {

// LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
// num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=50000.0,
// tie_word_embeddings=False)).save_pretrained(...) with transformers 5.25.
constexpr char kLlama5[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1,
  "dtype": "float32", "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 64,
  "initializer_range": 0.02, "intermediate_size": 160, "max_position_embeddings": 128, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "pad_token_id": null, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 50000.0, "rope_type": "default"},
  "tie_word_embeddings": false, "transformers_version": "5.25.0", "use_cache": true, "vocab_size": 256})";

// The same model as transformers 4.46 writes it (top-level rope_theta and rope_scaling, torch_dtype), with a
// Llama-3 style list of eos ids and bf16 weights.
constexpr char kLlama4[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": [2, 7, 9], "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
  "intermediate_size": 160, "max_position_embeddings": 128, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pretraining_tp": 1,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 50000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.46.0", "use_cache": true, "vocab_size": 256})";

// GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128)) with 5.25.
constexpr char kGpt2[] = R"({
  "activation_function": "gelu_new", "add_cross_attention": false, "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1, "bos_token_id": 50256, "dtype": "float32", "embd_pdrop": 0.1, "eos_token_id": 50256,
  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_embd": 64, "n_head": 4,
  "n_inner": null, "n_layer": 2, "n_positions": 128, "pad_token_id": null, "reorder_and_upcast_attn": false,
  "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": false, "scale_attn_weights": true,
  "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
  "summary_type": "cls_index", "summary_use_proj": true, "tie_word_embeddings": true,
  "transformers_version": "5.25.0", "use_cache": true, "vocab_size": 256})";

absl::StatusOr<HfModelConfig> Parse(const std::string& text) {
  return ParseHfModelConfig(nlohmann::json::parse(text), "dir/config.json");
}

void ExpectTinyLlama(const ModelConfig& m) {
  EXPECT_EQ(m.arch, ModelArch::kLlama);
  EXPECT_EQ(m.vocab_size, 256);
  EXPECT_EQ(m.d_model, 64);
  EXPECT_EQ(m.n_layer, 2);
  EXPECT_EQ(m.n_head, 4);
  EXPECT_EQ(m.n_kv_head, 2);
  EXPECT_EQ(m.ffn_hidden, 160);
  EXPECT_EQ(m.max_positions, 128);
  EXPECT_DOUBLE_EQ(m.rope_theta, 50000.0);
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-6);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(m.bos_token_id, 1);
  EXPECT_EQ(m.eos_token_id, 2);
}

TEST(HfModelConfig, ReadsTransformers5Llama) {
  auto hf = Parse(kLlama5);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ExpectTinyLlama(hf->model);
  EXPECT_EQ(hf->dtype, "float32");
  EXPECT_EQ(hf->keys.front(), "model.arch");
  EXPECT_EQ(hf->keys.size(), 13u);
}

TEST(HfModelConfig, ReadsTransformers4LlamaWithEosList) {
  auto hf = Parse(kLlama4);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ExpectTinyLlama(hf->model);  // eos [2, 7, 9]: the first
  EXPECT_EQ(hf->dtype, "bfloat16");
}

TEST(HfModelConfig, LlamaDefaultsForAbsentKeys) {
  auto hf = Parse(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100})");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.n_kv_head, 4);  // absent: num_attention_heads
  EXPECT_FALSE(hf->model.tie_embeddings);
  EXPECT_DOUBLE_EQ(hf->model.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(hf->model.norm_eps, 1e-6);
  EXPECT_EQ(hf->model.max_positions, 2048);
}

TEST(HfModelConfig, ReadsGpt2) {
  auto hf = Parse(kGpt2);
  ASSERT_TRUE(hf.ok()) << hf.status();
  const ModelConfig& m = hf->model;
  EXPECT_EQ(m.arch, ModelArch::kGpt2);
  EXPECT_EQ(m.d_model, 64);
  EXPECT_EQ(m.n_layer, 2);
  EXPECT_EQ(m.n_head, 4);
  EXPECT_EQ(m.ffn_hidden, 256);  // n_inner null: 4 x n_embd
  EXPECT_EQ(m.max_positions, 128);
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-5);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_EQ(m.bos_token_id, -1);  // 50256 is outside a 256-token vocabulary
  EXPECT_EQ(m.eos_token_id, -1);
}

TEST(HfModelConfig, RefusesWhatWeDoNotImplement) {
  auto j = nlohmann::json::parse(kLlama5);
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0}};
  auto hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("rope type 'llama3'"), std::string::npos) << hf.status();

  j = nlohmann::json::parse(kLlama4);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_FALSE(ParseHfModelConfig(j, "d/config.json").ok());

  j = nlohmann::json::parse(kLlama5);
  j["attention_bias"] = true;
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("d/config.json: attention_bias is true"), std::string::npos) << hf.status();

  j = nlohmann::json::parse(kLlama5);
  j["head_dim"] = 32;
  EXPECT_FALSE(ParseHfModelConfig(j, "d/config.json").ok());

  j = nlohmann::json::parse(kGpt2);
  j["activation_function"] = "relu";
  EXPECT_FALSE(ParseHfModelConfig(j, "d/config.json").ok());
}

TEST(HfModelConfig, UnknownModelTypeNamesTheSupportedOnes) {
  auto hf = Parse(R"({"model_type": "mistral"})");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(),
            "dir/config.json: model_type 'mistral' is not supported (supported: 'llama' for LlamaForCausalLM, "
            "'gpt2' for GPT2LMHeadModel)");
}

TEST(HfModelConfig, WrittenConfigReadsBack) {
  for (const char* text : {kLlama5, kGpt2}) {
    auto hf = Parse(text);
    ASSERT_TRUE(hf.ok());
    hf->model.bos_token_id = 3;
    auto back = ParseHfModelConfig(nlohmann::json::parse(HfConfigJson(hf->model, "bfloat16").dump()), "x");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->dtype, "bfloat16");
    EXPECT_EQ(back->model.bos_token_id, 3);
    EXPECT_EQ(back->model.n_kv_head, hf->model.n_kv_head);
    EXPECT_EQ(back->model.ffn_hidden, hf->model.ffn_hidden);
    EXPECT_EQ(back->model.max_positions, hf->model.max_positions);
    EXPECT_EQ(back->model.rope_theta, hf->model.rope_theta);
    EXPECT_EQ(back->model.norm_eps, hf->model.norm_eps);
    EXPECT_EQ(back->model.tie_embeddings, hf->model.tie_embeddings);
  }
}

TEST(HfModelConfig, OurGptIsWrittenAsGpt2WithExactGelu) {
  ModelConfig gpt;  // arch gpt, seq_len 64
  const auto j = HfConfigJson(gpt, "float32");
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["activation_function"], "gelu");
  EXPECT_EQ(j["n_positions"], 64);
  EXPECT_EQ(j["n_inner"], 4 * gpt.d_model);
  EXPECT_FALSE(ParseHfModelConfig(nlohmann::json::parse(j.dump()), "x").ok());  // not read back as gpt2
}

class HfMergeTest : public ScratchDirTest {
 protected:
  void WriteConfig(const std::string& text) { std::ofstream(dir_ / "config.json") << text; }
  absl::StatusOr<Config> Load(const std::string& model_yaml, const std::vector<std::string>& overrides = {}) {
    return ParseConfig("model:\n  init_from: " + dir_.string() + "\n" + model_yaml, "run.yaml", overrides);
  }
};

TEST_F(HfMergeTest, UnsetKeysComeFromConfigJson) {
  WriteConfig(kLlama5);
  auto c = Load("");
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectTinyLlama(c->model);
  EXPECT_EQ(c->model.seq_len, 64);  // our default, below max_positions 128
  EXPECT_EQ(c->data.tokenizer, "");
}

TEST_F(HfMergeTest, SameValuesAgreeAndSeqLenIsCapped) {
  auto j = nlohmann::json::parse(kLlama5);
  j["max_position_embeddings"] = 32;
  WriteConfig(j.dump());
  auto c = Load("  arch: llama\n  n_layer: 2\n  rope_theta: 50000\n  tie_embeddings: false\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.seq_len, 32);  // unset: min(64, max_position_embeddings)
  auto too_long = Load("  seq_len: 48\n");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("model.seq_len (48) exceeds"), std::string::npos) << too_long.status();
}

TEST_F(HfMergeTest, ConflictNamesBothValues) {
  WriteConfig(kLlama5);
  auto c = Load("  n_layer: 4\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "run.yaml: model.n_layer: the YAML says 4, " + dir_.string() + "/config.json says 2");
  c = Load("", {"model.arch=gpt2"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.arch: the YAML says gpt2"), std::string::npos) << c.status();
}

TEST_F(HfMergeTest, TokenizerModelBecomesDataTokenizer) {
  WriteConfig(kGpt2);
  std::ofstream(dir_ / "tokenizer.model") << "not really a model";
  auto c = Load("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.arch, ModelArch::kGpt2);
  EXPECT_EQ(c->data.tokenizer, (dir_ / "tokenizer.model").string());
  auto other = Load("data:\n  tokenizer: /no/such/tok.model\n");
  ASSERT_FALSE(other.ok());  // the YAML's own choice wins, and must exist
  EXPECT_NE(other.status().message().find("data.tokenizer: '/no/such/tok.model'"), std::string::npos);
}

TEST_F(HfMergeTest, TokenizerJsonBecomesDataTokenizerWhenThereIsNoTokenizerModel) {
  WriteConfig(kGpt2);
  std::ofstream(dir_ / "tokenizer.json") << "{}";
  auto c = Load("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.tokenizer, (dir_ / "tokenizer.json").string());
  std::ofstream(dir_ / "tokenizer.model") << "not really a model";  // both: the SentencePiece model, as before
  c = Load("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data.tokenizer, (dir_ / "tokenizer.model").string());
}

TEST_F(HfMergeTest, DirectoryWithoutConfigJson) {
  auto c = Load("");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.init_from: " + dir_.string() + "/config.json: cannot be read"),
            std::string::npos)
      << c.status();
}

TEST_F(HfMergeTest, UnknownModelType) {
  WriteConfig(R"({"model_type": "bert"})");
  auto c = Load("");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model_type 'bert' is not supported"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace diloco
