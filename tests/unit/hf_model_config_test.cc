// config/hf_model_config.h and the loader's merge of a Hugging Face config.json (config_loader.h): both layouts of
// config.json transformers writes (literal copies of save_pretrained outputs: 5.25, and 4.46 for the 4.x layout),
// the merge with the YAML, the conflict error, unknown model types, a directory without config.json.
#include "config/hf_model_config.h"

#include <gtest/gtest.h>

#include <cmath>
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
  EXPECT_EQ(hf->keys.size(), 23u);  // with head_dim, the rope scaling keys and sliding_window
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
  // GPT2Config's dropouts are not applied (the theta_0 line says so); summary_first_dropout is the unused head's.
  EXPECT_EQ(hf->not_applied, (std::vector<std::string>{"attn_pdrop 0.1", "embd_pdrop 0.1", "resid_pdrop 0.1"}));
  EXPECT_TRUE(Parse(kLlama4)->not_applied.empty()) << "attention_dropout 0.0 is what we do";
}

// Our export writes both rope dicts alike (4.x rope_scaling with the top-level rope_theta, 5.x rope_parameters with
// its own): read as one rope. transformers 5 reads rope_scaling alone with the top-level rope_theta (10000 when
// absent), so a 5.x config with rope_scaling added by hand means theta 10000 there and 1e6 in rope_parameters:
// refused, naming the difference, instead of one of the two silently.
TEST(HfModelConfig, BothRopeDictsMustDescribeTheSameRope) {
  auto j = nlohmann::json::parse(kLlama5);
  const nlohmann::json llama3 = {{"rope_type", "llama3"},
                                 {"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 64}};
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = llama3;
  j["rope_parameters"] = llama3;
  j["rope_parameters"]["rope_theta"] = 500000.0;
  auto hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.rope_type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(hf->model.rope_theta, 500000.0);
  EXPECT_EQ(hf->model.RopeOriginalMaxPositions(), 64);

  j = nlohmann::json::parse(kLlama5);
  j["rope_parameters"] = {
      {"rope_type", "yarn"}, {"rope_theta", 1000000.0}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(std::string(hf.status().message()),
            "d/config.json: rope_scaling and rope_parameters describe different ropes (rope_theta 10000 against "
            "1e+06); transformers 5 reads rope_scaling with the top-level rope_theta (10000 when absent): keep one "
            "of the two");
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}, {"rope_theta", 1000000.0}};
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("(rope type linear against yarn)"), std::string::npos) << hf.status();
}

// A top-level original_max_position_embeddings (Phi-3's layout) wins over the rope dict's for llama3 and yarn, as in
// transformers 5 (standardize_rope_params); the golden family llama_llama3_toplevel checks the logits.
TEST(HfModelConfig, TopLevelOriginalMaxPositionsWinsForLlama3AndYarn) {
  auto j = nlohmann::json::parse(kLlama5);
  j["rope_parameters"] = {
      {"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  j["original_max_position_embeddings"] = 16;
  auto hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.RopeOriginalMaxPositions(), 16);
  j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.RopeOriginalMaxPositions(), 128);  // linear does not read it: max_position_embeddings
}

TEST(HfModelConfig, RefusesWhatWeDoNotImplement) {
  auto j = nlohmann::json::parse(kLlama5);
  j["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 500000.0}, {"factor", 8.0}};
  auto hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(),
            "d/config.json: rope type 'longrope' is not supported (supported: default, linear, llama3, yarn, dynamic)");

  j = nlohmann::json::parse(kLlama4);
  j["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}};
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("rope type 'longrope'"), std::string::npos) << hf.status();

  j = nlohmann::json::parse(kLlama5);
  j["attention_bias"] = true;
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("d/config.json: attention_bias is true"), std::string::npos) << hf.status();

  j = nlohmann::json::parse(kLlama5);
  j["model_type"] = "qwen2";
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 1;  // Qwen2Config: layer 1 of 2 is "sliding_attention"
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_FALSE(hf.ok());
  EXPECT_NE(hf.status().message().find("d/config.json: 1 of 2 layers use sliding-window attention"), std::string::npos)
      << hf.status();
  j.erase("max_window_layers");  // default 28: both layers full attention
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_FALSE(ParseHfModelConfig(j, "d/config.json").ok());

  j = nlohmann::json::parse(kGpt2);
  j["activation_function"] = "relu";
  EXPECT_FALSE(ParseHfModelConfig(j, "d/config.json").ok());
}

// Llama 3.1's rope_scaling as its config.json has it (4.x layout), and yarn in the 5.x layout with transformers'
// defaults (original_max_position_embeddings = max_position_embeddings, betas 32 / 1; attention factor from
// mscale / mscale_all_dim when both are given).
TEST(HfModelConfig, ReadsRopeScalingOfBothLayouts) {
  auto j = nlohmann::json::parse(kLlama4);
  j["rope_scaling"] = {{"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 64},
                       {"rope_type", "llama3"}};
  auto hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.rope_type, RopeType::kLlama3);
  EXPECT_EQ(hf->model.rope_factor, 8.0);
  EXPECT_EQ(hf->model.rope_high_freq_factor, 4.0);
  EXPECT_EQ(hf->model.RopeOriginalMaxPositions(), 64);
  EXPECT_EQ(hf->model.rope_theta, 50000.0);

  j = nlohmann::json::parse(kLlama5);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0}};
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.rope_type, RopeType::kYarn);
  EXPECT_EQ(hf->model.RopeOriginalMaxPositions(), 128);
  EXPECT_EQ(hf->model.rope_beta_fast, 32.0);
  EXPECT_EQ(hf->model.rope_attention_factor, 0.0);  // derived at run time: 0.1 ln(4) + 1
  j["rope_parameters"]["mscale"] = 2.0;
  j["rope_parameters"]["mscale_all_dim"] = 1.0;
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_DOUBLE_EQ(hf->model.rope_attention_factor, (0.2 * std::log(4.0) + 1) / (0.1 * std::log(4.0) + 1));
}

// What transformers 5.25 itself ignores or lays out as full attention is read, not refused: mistral with
// attention_bias / mlp_bias true (MistralForCausalLM builds no biases whatever they say), qwen2 / qwen3 with
// mlp_bias true (no MLP biases either); qwen2 with use_sliding_window when max_window_layers (default 28) is at least
// the number of layers, or sliding_window is null (Qwen2Config.layer_types: all "full_attention"). Absent
// num_key_value_heads is 8 for mistral and 32 for qwen2 / qwen3 (their configs' defaults); null is
// num_attention_heads (as 5.25 does for llama / qwen2 / qwen3 and 4.x for mistral; 5.25's MistralConfig refuses it).
TEST(HfModelConfig, ReadsWhatTransformersIgnoresOrLaysOutAsFullAttention) {
  auto j = nlohmann::json::parse(kLlama5);
  j["model_type"] = "mistral";
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  auto hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.arch, ModelArch::kMistral);

  j = nlohmann::json::parse(kLlama5);
  j["model_type"] = "qwen2";
  j["mlp_bias"] = true;
  j["use_sliding_window"] = true;
  ASSERT_TRUE(ParseHfModelConfig(j, "d/config.json").ok());  // 2 layers < max_window_layers 28
  j["max_window_layers"] = 2;
  ASSERT_TRUE(ParseHfModelConfig(j, "d/config.json").ok());
  j["max_window_layers"] = 0;
  j["sliding_window"] = nullptr;
  ASSERT_TRUE(ParseHfModelConfig(j, "d/config.json").ok());
  j.erase("use_sliding_window");
  j.erase("sliding_window");
  j["layer_types"] = {"full_attention", "full_attention"};
  ASSERT_TRUE(ParseHfModelConfig(j, "d/config.json").ok());

  j = nlohmann::json::parse(kLlama5);
  j["num_attention_heads"] = 32;
  j["hidden_size"] = 256;
  j.erase("num_key_value_heads");
  for (const auto& [type, kv] :
       std::vector<std::pair<std::string, int64_t>>{{"llama", 32}, {"mistral", 8}, {"qwen2", 32}, {"qwen3", 32}}) {
    j["model_type"] = type;
    hf = ParseHfModelConfig(j, "d/config.json");
    ASSERT_TRUE(hf.ok()) << hf.status();
    EXPECT_EQ(hf->model.n_kv_head, kv) << type;
  }
  j["num_attention_heads"] = 4;
  j["model_type"] = "qwen2";
  j["num_key_value_heads"] = nullptr;
  EXPECT_EQ(ParseHfModelConfig(j, "d/config.json")->model.n_kv_head, 4);
  j["model_type"] = "mistral";
  EXPECT_EQ(ParseHfModelConfig(j, "d/config.json")->model.n_kv_head, 4);
}

// Qwen3's explicit head_dim (128 with hidden 64 / 4 heads would be 16) and mistral's window (null: none).
TEST(HfModelConfig, ReadsFamiliesHeadDimAndWindow) {
  auto j = nlohmann::json::parse(kLlama5);
  j["model_type"] = "qwen3";
  j["head_dim"] = 32;
  auto hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.arch, ModelArch::kQwen3);
  EXPECT_EQ(hf->model.HeadDim(), 32);
  j.erase("head_dim");
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.HeadDim(), 128);  // Qwen3Config's default

  j["model_type"] = "mistral";
  j["sliding_window"] = 32;
  hf = ParseHfModelConfig(j, "d/config.json");
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->model.sliding_window, 32);
  EXPECT_EQ(hf->model.HeadDim(), 16);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(ParseHfModelConfig(j, "d/config.json")->model.sliding_window, 0);
}

TEST(HfModelConfig, UnknownModelTypeNamesTheSupportedOnes) {
  auto hf = Parse(R"({"model_type": "gemma"})");
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().message(),
            "dir/config.json: model_type 'gemma' is not supported (supported: 'llama' for LlamaForCausalLM, "
            "'mistral' for MistralForCausalLM, 'qwen2' for Qwen2ForCausalLM, 'qwen3' for Qwen3ForCausalLM, "
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

// Every family and rope type survives export -> import (the fields worker/lm/rope.h and llama_family.h read).
TEST(HfModelConfig, FamiliesAndRopeScalingReadBack) {
  auto base = Parse(kLlama5);
  ASSERT_TRUE(base.ok());
  for (ModelArch arch : {ModelArch::kLlama, ModelArch::kMistral, ModelArch::kQwen2, ModelArch::kQwen3}) {
    for (RopeType rope : {RopeType::kDefault, RopeType::kLinear, RopeType::kLlama3, RopeType::kYarn}) {
      ModelConfig m = base->model;
      m.arch = arch;
      m.head_dim = 24;
      m.rope_type = rope;
      m.rope_factor = 3;
      m.rope_low_freq_factor = 2;
      m.rope_high_freq_factor = 5;
      m.rope_original_max_positions = rope == RopeType::kLlama3 || rope == RopeType::kYarn ? 32 : 0;
      m.rope_attention_factor = rope == RopeType::kYarn ? 1.5 : 0;
      m.rope_beta_fast = rope == RopeType::kYarn ? 16 : 32;
      m.sliding_window = arch == ModelArch::kMistral ? 16 : 0;
      const nlohmann::ordered_json written = HfConfigJson(m, "float32");
      auto back = ParseHfModelConfig(nlohmann::json::parse(written.dump()), "x");
      ASSERT_TRUE(back.ok()) << back.status() << "\n" << written.dump();
      const ModelConfig& b = back->model;
      const std::string what = std::string(EnumName(arch)) + " " + std::string(EnumName(rope));
      EXPECT_EQ(b.arch, arch) << what;
      EXPECT_EQ(b.HeadDim(), 24) << what;
      EXPECT_EQ(b.rope_type, rope) << what;
      EXPECT_EQ(b.rope_factor, rope == RopeType::kDefault ? 1.0 : 3.0) << what;
      EXPECT_EQ(b.RopeOriginalMaxPositions(), m.RopeOriginalMaxPositions()) << what;
      if (rope == RopeType::kLlama3) EXPECT_EQ(b.rope_low_freq_factor, 2.0) << what;
      if (rope == RopeType::kYarn) EXPECT_EQ(b.rope_attention_factor, 1.5) << what;
      if (rope == RopeType::kYarn) EXPECT_EQ(b.rope_beta_fast, 16.0) << what;
      EXPECT_EQ(b.sliding_window, m.sliding_window) << what;
    }
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

// The directory's EOS ids as transformers 5.25's generate() reads them: generation_config.json's when that file exists
// (even without eos_token_id: then none; config.json's are not read), else config.json's; each below vocab_size.
// Written back as lists (config.json and generation_config.json), a single id as before.
TEST_F(HfMergeTest, StopTokenIdsComeFromGenerationConfigWhenItExistsAndAreWrittenBackAsAList) {
  std::ofstream(Path("config.json")) << R"({"model_type": "llama", "vocab_size": 100, "eos_token_id": [2, 7, 9]})";
  EXPECT_EQ(HfStopTokenIds(dir_.string(), 100), (std::vector<int64_t>{2, 7, 9}));
  std::ofstream(Path("generation_config.json")) << R"({"eos_token_id": [9, 11, 500]})";
  EXPECT_EQ(HfStopTokenIds(dir_.string(), 100), (std::vector<int64_t>{9, 11}));
  std::ofstream(Path("generation_config.json")) << R"({"eos_token_id": 12})";
  EXPECT_EQ(HfStopTokenIds(dir_.string(), 100), (std::vector<int64_t>{12}));
  std::ofstream(Path("generation_config.json")) << R"({"temperature": 0.7})";
  EXPECT_TRUE(HfStopTokenIds(dir_.string(), 100).empty());
  EXPECT_TRUE(HfStopTokenIds(Path("nothing-here"), 100).empty());
  ModelConfig m;
  m.arch = ModelArch::kLlama;
  m.eos_token_id = 2;
  EXPECT_EQ(HfConfigJson(m, "float32", "4.46.0", {2, 7, 9})["eos_token_id"].dump(), "[2,7,9]");
  EXPECT_EQ(HfGenerationConfigJson(m, "4.46.0", {2, 7, 9})["eos_token_id"].dump(), "[2,7,9]");
  EXPECT_EQ(HfConfigJson(m, "float32", "4.46.0", {2})["eos_token_id"].dump(), "2");
  m.eos_token_id = 5;  // a run that set its own EOS: it stays first (read back as model.eos_token_id)
  EXPECT_EQ(HfConfigJson(m, "float32", "4.46.0", {2, 7, 9})["eos_token_id"].dump(), "[5,2,7,9]");
  m.eos_token_id = 2;
  EXPECT_EQ(HfGenerationConfigJson(m)["eos_token_id"].dump(), "2");
}

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

// A YAML value that means what config.json implies agrees, though the importer keeps the derived ones as 0:
// head_dim 16 = hidden 64 / 4 heads (Llama 3.2 writes it explicitly), sliding_window at least max_position_embeddings
// (no window). Before, "model.head_dim: the YAML says 16, .../config.json says 0". A different one is refused.
TEST_F(HfMergeTest, YamlValuesThatMeanWhatConfigJsonImpliesAgree) {
  WriteConfig(kLlama5);
  auto c = Load("  head_dim: 16\n  n_kv_head: 2\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.HeadDim(), 16);
  c = Load("  head_dim: 32\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.head_dim: the YAML says 32"), std::string::npos) << c.status();
  auto j = nlohmann::json::parse(kLlama5);
  j["model_type"] = "mistral";
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = nullptr;
  WriteConfig(j.dump());
  c = Load("  sliding_window: 4096\n");
  ASSERT_TRUE(c.ok()) << c.status();
  c = Load("  sliding_window: 64\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.sliding_window: the YAML says 64"), std::string::npos) << c.status();
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

namespace diloco {
namespace {

// config/model_rules.cc for the llama-shaped keys: each refusal names its key.
TEST(ModelRules, LlamaShapedKeys) {
  auto parse = [](const std::string& model) { return ParseConfig("model:\n" + model, "run.yaml", {}); };
  auto ok = parse("  arch: qwen3\n  d_model: 32\n  n_head: 3\n  head_dim: 16\n");
  EXPECT_TRUE(ok.ok()) << ok.status();
  auto c = parse("  arch: qwen3\n  d_model: 32\n  n_head: 3\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("unless model.head_dim is set"), std::string::npos) << c.status();
  c = parse("  arch: mistral\n  head_dim: 15\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("must be even"), std::string::npos) << c.status();
  c = parse("  arch: llama\n  sliding_window: 8\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.sliding_window: only arch mistral"), std::string::npos) << c.status();
  c = parse("  arch: gpt2\n  rope_type: yarn\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("arch gpt2 has no rotary attention"), std::string::npos) << c.status();
  c = parse("  arch: llama\n  rope_type: llama3\n  rope_low_freq_factor: 4\n  rope_high_freq_factor: 4\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.rope_high_freq_factor (4) must exceed"), std::string::npos) << c.status();
  c = parse("  arch: llama\n  rope_type: dynamic\n");
  ASSERT_TRUE(c.ok()) << c.status();
  c = parse("  arch: llama\n  rope_type: longrope\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("model.rope_type"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace diloco
