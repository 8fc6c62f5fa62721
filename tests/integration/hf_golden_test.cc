// Our llama-shaped families and gpt2 against Hugging Face transformers (the reference): tests/golden/make_hf_golden.py
// (ctest fixture hf_golden, run with ${DILOCO_PYTHON}) saves tiny random models with save_pretrained plus their logits
// and greedy generations; here we build the same shapes from a ModelConfig set by hand, import the directory with
// LoadHfWeights
// + CopyHfWeights, and compare. Tolerances: logits 1e-4 max abs (float32 with different op orders; observed ~1e-6);
// greedy ids exactly (the script records the smallest top-1/top-2 gap, asserted far above our error); ForwardCached
// against forward() 1e-5. bf16: HF's reference is the bf16 checkpoint loaded in float32, i.e. the very weights our
// import makes (bf16 -> float32 is exact), so the same 1e-4 holds; it would fail for an importer that misread BF16.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "config/config.h"
#include "config/hf_model_config.h"
#include "config/model_rules.h"
#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"
#include "worker/lm/generate.h"
#include "worker/lm/hf_weights.h"
#include "worker/lm/language_model.h"
#include "worker/lm/safetensors.h"

namespace diloco {
namespace {

const std::string kDir = DILOCO_HF_GOLDEN_DIR;

struct Golden {
  torch::Tensor tokens, logits, prompt, generated;
  double margin = 0;
};

Golden ReadGolden(const std::string& name, const std::string& dir = kDir) {
  auto read = ReadSafetensors(dir + "/" + name + "_golden.safetensors");
  if (!read.ok()) throw std::runtime_error(std::string(read.status().message()));
  Golden g;
  for (const auto& [key, t] : *read) {
    if (key == "tokens") g.tokens = t.to(torch::kLong);
    if (key == "logits") g.logits = t;
    if (key == "prompt") g.prompt = t.to(torch::kLong);
    if (key == "generated") g.generated = t.to(torch::kLong);
    if (key == "margin") g.margin = t.item<double>();
  }
  return g;
}

// The shapes make_hf_golden.py gives LlamaConfig / GPT2Config.
ModelConfig LlamaConfig() {
  ModelConfig m;
  m.arch = ModelArch::kLlama;
  m.vocab_size = 256;
  m.seq_len = 64;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_kv_head = 2;
  m.d_model = 64;
  m.ffn_hidden = 96;
  m.max_positions = 128;
  m.rope_theta = 500000;
  m.norm_eps = 1e-5;
  m.tie_embeddings = false;
  return m;
}

ModelConfig Gpt2Config() {
  ModelConfig m;
  m.arch = ModelArch::kGpt2;
  m.vocab_size = 256;
  m.seq_len = 64;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 64;
  m.ffn_hidden = 128;
  m.max_positions = 64;
  m.norm_eps = 1e-5;
  return m;
}

LanguageModelPtr Import(const ModelConfig& config, const std::string& name, const std::string& golden_dir = kDir) {
  auto model = MakeLanguageModel(config, 1);
  const std::string dir = golden_dir + "/" + name;
  auto weights = LoadHfWeights(dir);
  if (!weights.ok()) throw std::runtime_error(std::string(weights.status().message()));
  if (absl::Status s = CopyHfWeights(*weights, dir, *model); !s.ok())
    throw std::runtime_error(std::string(s.message()));
  model->eval();
  return model;
}

double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Greedy decoding with the KV cache: the prompt in one call, then one token per call. Returns the new ids [1, n]
// and every step's logits [1, prompt + n - 1, vocab] (the positions that forward() over the final sequence scores).
std::pair<torch::Tensor, torch::Tensor> Greedy(LanguageModel& model, const torch::Tensor& prompt, int64_t n) {
  torch::NoGradGuard no_grad;
  KvCache cache;
  std::vector<torch::Tensor> logits = {model.ForwardCached(prompt, cache)};
  std::vector<torch::Tensor> ids;
  for (int64_t i = 0; i < n; ++i) {
    ids.push_back(logits.back().select(1, -1).argmax(-1, /*keepdim=*/true));  // [1, 1]
    if (i + 1 < n) logits.push_back(model.ForwardCached(ids.back(), cache));
  }
  return {torch::cat(ids, 1), torch::cat(logits, 1)};
}

class HfGoldenTest : public ::testing::TestWithParam<std::string> {};

ModelConfig ConfigOf(const std::string& name) { return name == "gpt2" ? Gpt2Config() : LlamaConfig(); }

TEST_P(HfGoldenTest, LogitsEqualHuggingFaces) {
  const Golden g = ReadGolden(GetParam());
  auto model = Import(ConfigOf(GetParam()), GetParam());
  torch::NoGradGuard no_grad;
  const torch::Tensor ours = model->forward(g.tokens);
  ASSERT_EQ(ours.sizes(), g.logits.sizes());
  EXPECT_LE(MaxAbsDiff(ours, g.logits), 1e-4);
  EXPECT_GT(g.logits.std().item<double>(), 0.1);  // the models are not degenerate
}

TEST_P(HfGoldenTest, GreedyGenerationWithTheCacheGivesHuggingFacesIds) {
  const Golden g = ReadGolden(GetParam());
  ASSERT_GT(g.margin, 1e-3) << "the golden's greedy path is too close to a tie to compare";
  auto model = Import(ConfigOf(GetParam()), GetParam());
  const auto [ids, cached_logits] = Greedy(*model, g.prompt, 32);
  EXPECT_TRUE(torch::equal(ids, g.generated)) << "ours: " << ids << "\nHugging Face: " << g.generated;

  torch::NoGradGuard no_grad;
  const torch::Tensor full = model->forward(torch::cat({g.prompt, ids}, 1)).narrow(1, 0, cached_logits.size(1));
  EXPECT_LE(MaxAbsDiff(cached_logits, full), 1e-5);
}

// The product's decoder (worker/lm/generate.h, what diloco-ctl generate runs) at temperature 0 gives the same ids.
TEST_P(HfGoldenTest, GenerateGreedyGivesHuggingFacesIds) {
  const Golden g = ReadGolden(GetParam());
  auto model = Import(ConfigOf(GetParam()), GetParam());
  std::vector<int64_t> prompt(g.prompt.data_ptr<int64_t>(), g.prompt.data_ptr<int64_t>() + g.prompt.numel());
  GenerateOptions options;
  options.max_new_tokens = 32;
  auto ids = Generate(*model, prompt, model->config().MaxPositions(), options);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_TRUE(torch::equal(torch::tensor(*ids, torch::kLong).unsqueeze(0), g.generated));
}

// Runs `command` through the shell; its exit code and its stdout + stderr.
std::pair<int, std::string> Shell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  return {pclose(pipe), out};
}

// What `diloco-ctl generate --init-from DIR --prompt-ids ... --max-new-tokens 32 --print-ids` prints (stdout and
// stderr) and its exit code; config.json fills model:.
std::pair<int, std::string> CtlGenerate(const std::string& dir, const std::string& tag, const torch::Tensor& prompt) {
  const std::string yaml = ::testing::TempDir() + "/generate_" + tag + ".yaml";
  std::ofstream(yaml) << "run:\n  name: generate\n  output_dir: " << ::testing::TempDir() << "/generate_run\n";
  std::string ids;
  for (int64_t i = 0; i < prompt.numel(); ++i) ids += (i ? "," : "") + std::to_string(prompt[0][i].item<int64_t>());
  const std::string command = std::string(DILOCO_CTL) + " generate --config " + yaml + " --init-from " + dir +
                              " --prompt-ids " + ids + " --max-new-tokens 32 --print-ids";
  return Shell(command);
}

std::string IdsText(const torch::Tensor& ids) {
  std::string text;
  for (int64_t i = 0; i < ids.numel(); ++i) text += (i ? " " : "") + std::to_string(ids[0][i].item<int64_t>());
  return text + "\n";
}

// diloco-ctl generate end to end: --init-from the Hugging Face directory (config.json fills model:), --prompt-ids,
// --print-ids prints HF's 32 greedy ids.
TEST_P(HfGoldenTest, CtlGeneratePrintsHuggingFacesIds) {
  const Golden g = ReadGolden(GetParam());
  const auto [code, out] = CtlGenerate(kDir + "/" + GetParam(), GetParam(), g.prompt);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, IdsText(g.generated));
}

// A model directory that lists several EOS ids (generation_config.json's eos_token_id as a list, as Llama 3.1 / 3.2
// Instruct and Qwen2.5-Instruct ship it): transformers' generate() stops after the first generated id that is any of
// them, and reads only that file's ids when it exists (transformers 5.25: config.json's eos_token_id then stops
// nothing, nor does it when generation_config.json names none). The directory is the golden one copied, its
// generation_config.json naming two of HF's greedy ids and config.json an id HF generates before either; diloco-ctl
// generate must print HF's ids up to and including the first of the two. Without eos_token_id in
// generation_config.json it prints all 32. Before, config.json's id stopped it too.
TEST_P(HfGoldenTest, CtlGenerateStopsAtAnyOfTheDirectorysEosIds) {
  const Golden g = ReadGolden(GetParam());
  const std::vector<int64_t> hf(g.generated.data_ptr<int64_t>(), g.generated.data_ptr<int64_t>() + g.generated.numel());
  // Listed: the last two ids to appear for the first time (HF stops at whichever comes first); config.json's EOS:
  // the first id, which HF generates before them.
  std::vector<size_t> firsts;  // positions where an id appears for the first time
  for (size_t i = 0; i < hf.size(); ++i) {
    if (std::find(hf.begin(), hf.begin() + static_cast<std::ptrdiff_t>(i), hf[i]) == hf.begin() + i)
      firsts.push_back(i);
  }
  ASSERT_GE(firsts.size(), 2u) << "the golden's greedy ids are one id repeated";
  std::vector<int64_t> listed = {hf[firsts.back()]};  // gpt2's golden cycles through 2 ids: one listed
  if (firsts.size() > 2) listed.push_back(hf[firsts[firsts.size() - 2]]);
  const size_t stop = firsts[firsts.size() - listed.size()], before = 0;
  const std::string dir = ::testing::TempDir() + "/eos_list_" + GetParam();
  std::filesystem::remove_all(dir);
  std::filesystem::copy(kDir + "/" + GetParam(), dir, std::filesystem::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  config["eos_token_id"] = hf[before];
  std::ofstream(dir + "/config.json") << config.dump();
  std::ofstream(dir + "/generation_config.json") << nlohmann::json({{"eos_token_id", listed}}).dump();
  const auto [code, out] = CtlGenerate(dir, std::string("eos_") + GetParam(), g.prompt);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, IdsText(g.generated.narrow(1, 0, static_cast<int64_t>(stop) + 1)));
  std::ofstream(dir + "/generation_config.json") << nlohmann::json({{"do_sample", false}}).dump();
  const auto [code_none, out_none] = CtlGenerate(dir, std::string("eos_none_") + GetParam(), g.prompt);
  EXPECT_EQ(code_none, 0) << out_none;
  EXPECT_EQ(out_none, IdsText(g.generated));
}

INSTANTIATE_TEST_SUITE_P(Models, HfGoldenTest, ::testing::Values("llama", "gpt2", "llama_bf16"));

TEST(HfGoldenImportTest, Bf16CheckpointIsReadAsItsRoundedWeights) {
  auto fp32 = LoadHfWeights(kDir + "/llama");
  auto bf16 = LoadHfWeights(kDir + "/llama_bf16");
  ASSERT_TRUE(fp32.ok() && bf16.ok());
  const torch::Tensor& a = fp32->at("model.layers.1.mlp.up_proj.weight");
  const torch::Tensor& b = bf16->at("model.layers.1.mlp.up_proj.weight");
  EXPECT_TRUE(torch::equal(b, a.to(torch::kBFloat16).to(torch::kFloat)));
  EXPECT_FALSE(torch::equal(a, b));
}

// The llama-shaped families and rope scalings of tests/golden/make_hf_families.py (ctest fixture hf_families): here the
// ModelConfig comes from the directory's config.json through our importer (config/hf_model_config.h), so a misread
// key (rope type, factor, head_dim, window, tie) fails the logits.
const std::string kFamiliesDir = DILOCO_HF_FAMILIES_DIR;

struct FamilyCase {
  std::string name;
  ModelArch arch;
  RopeType rope;
  int64_t head_dim;        // ModelConfig::HeadDim()
  int64_t sliding_window;  // 0: none
  bool tied;
};

void PrintTo(const FamilyCase& c, std::ostream* os) { *os << c.name; }

class HfFamilyGoldenTest : public ::testing::TestWithParam<FamilyCase> {
 protected:
  ModelConfig Config() {
    auto hf = ReadHfModelConfig(kFamiliesDir + "/" + GetParam().name);
    if (!hf.ok()) throw std::runtime_error(std::string(hf.status().message()));
    hf->model.seq_len = 64;
    return hf->model;
  }
};

TEST_P(HfFamilyGoldenTest, ConfigJsonIsReadAsTheFamily) {
  const FamilyCase& c = GetParam();
  const ModelConfig m = Config();
  EXPECT_EQ(m.arch, c.arch);
  EXPECT_EQ(m.rope_type, c.rope);
  EXPECT_EQ(m.HeadDim(), c.head_dim);
  EXPECT_EQ(m.sliding_window, c.sliding_window);
  EXPECT_EQ(m.tie_embeddings, c.tied);
  EXPECT_TRUE(ValidateModel(m).ok()) << ValidateModel(m);
}

TEST_P(HfFamilyGoldenTest, LogitsEqualHuggingFaces) {
  const Golden g = ReadGolden(GetParam().name, kFamiliesDir);
  auto model = Import(Config(), GetParam().name, kFamiliesDir);
  torch::NoGradGuard no_grad;
  const torch::Tensor ours = model->forward(g.tokens);
  ASSERT_EQ(ours.sizes(), g.logits.sizes());
  EXPECT_LE(MaxAbsDiff(ours, g.logits), 1e-4);
  EXPECT_GT(g.logits.std().item<double>(), 0.1);
}

// The KV cache path (greedy, one token a call) and the product's decoder give HF's ids, and the cached logits are
// forward()'s (for mistral past the window on both paths).
TEST_P(HfFamilyGoldenTest, GreedyGenerationGivesHuggingFacesIds) {
  const Golden g = ReadGolden(GetParam().name, kFamiliesDir);
  ASSERT_GT(g.margin, 1e-3) << "the golden's greedy path is too close to a tie to compare";
  auto model = Import(Config(), GetParam().name, kFamiliesDir);
  const auto [ids, cached_logits] = Greedy(*model, g.prompt, 32);
  EXPECT_TRUE(torch::equal(ids, g.generated)) << "ours: " << ids << "\nHugging Face: " << g.generated;
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor full = model->forward(torch::cat({g.prompt, ids}, 1)).narrow(1, 0, cached_logits.size(1));
    EXPECT_LE(MaxAbsDiff(cached_logits, full), 1e-5);
  }
  std::vector<int64_t> prompt(g.prompt.data_ptr<int64_t>(), g.prompt.data_ptr<int64_t>() + g.prompt.numel());
  GenerateOptions options;
  options.max_new_tokens = 32;
  auto generated = Generate(*model, prompt, model->config().MaxPositions(), options);
  ASSERT_TRUE(generated.ok()) << generated.status();
  EXPECT_TRUE(torch::equal(torch::tensor(*generated, torch::kLong).unsqueeze(0), g.generated));
}

TEST_P(HfFamilyGoldenTest, CtlGeneratePrintsHuggingFacesIds) {
  const Golden g = ReadGolden(GetParam().name, kFamiliesDir);
  const auto [code, out] = CtlGenerate(kFamiliesDir + "/" + GetParam().name, GetParam().name, g.prompt);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out, IdsText(g.generated));
}

// The export: a checkpoint of the imported parameters goes through `diloco-ctl export --format hf` (model: from the
// directory's config.json), and tests/golden/check_family_export.py loads the result with transformers (no missing or
// unexpected keys, the family's class) and gets the golden logits within 1e-4.
TEST_P(HfFamilyGoldenTest, ExportLoadsInTransformersWithTheGoldenLogits) {
  const std::string name = GetParam().name, dir = kFamiliesDir + "/" + name;
  const std::string scratch = ::testing::TempDir() + "/family_export_" + name;
  std::filesystem::remove_all(scratch);
  std::filesystem::create_directories(scratch);
  auto model = Import(Config(), name, kFamiliesDir);
  CheckpointData data;
  data.round = 1;
  for (const auto& [param, value] : NamedParameters(*model)) data.params.emplace_back(param, value.detach().clone());
  data.fingerprint = Fingerprint(SpecsOf(data.params));
  ASSERT_TRUE(SaveCheckpoint(scratch + "/ckpt.bin", data).ok());
  std::ofstream(scratch + "/run.yaml") << "run:\n  output_dir: " << scratch << "/run\nmodel:\n  init_from: " << dir
                                       << "\n";
  const auto [code, out] = Shell(std::string(DILOCO_CTL) + " export --checkpoint " + scratch + "/ckpt.bin --config " +
                                 scratch + "/run.yaml --format hf --out " + scratch + "/hf");
  ASSERT_EQ(code, 0) << out;
  const char* classes[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
  const std::string cls = classes[static_cast<int>(GetParam().arch) - static_cast<int>(ModelArch::kLlama)];
  const auto [check_code, check] =
      Shell(std::string(DILOCO_PYTHON) + " " + DILOCO_SOURCE_DIR + "/tests/golden/check_family_export.py --dir " +
            scratch + "/hf --golden " + kFamiliesDir + "/" + name + "_golden.safetensors --class " + cls);
  EXPECT_EQ(check_code, 0) << check;
  EXPECT_NE(check.find("check_family_export: OK " + cls), std::string::npos) << check;
  std::cout << "[export " << name << "] " << check;
}

INSTANTIATE_TEST_SUITE_P(
    Families, HfFamilyGoldenTest,
    ::testing::Values(FamilyCase{"llama_llama3", ModelArch::kLlama, RopeType::kLlama3, 24, 0, false},
                      FamilyCase{"llama_yarn", ModelArch::kLlama, RopeType::kYarn, 16, 0, true},
                      FamilyCase{"llama_linear", ModelArch::kLlama, RopeType::kLinear, 16, 0, false},
                      FamilyCase{"llama_dynamic", ModelArch::kLlama, RopeType::kDynamic, 16, 0, false},
                      FamilyCase{"llama_llama3_toplevel", ModelArch::kLlama, RopeType::kLlama3, 16, 0, false},
                      FamilyCase{"mistral", ModelArch::kMistral, RopeType::kDefault, 32, 8, false},
                      FamilyCase{"qwen2", ModelArch::kQwen2, RopeType::kDefault, 16, 0, false},
                      FamilyCase{"qwen2_tied", ModelArch::kQwen2, RopeType::kDefault, 16, 0, true},
                      FamilyCase{"qwen3", ModelArch::kQwen3, RopeType::kYarn, 32, 0, false}),
    [](const ::testing::TestParamInfo<FamilyCase>& info) { return info.param.name; });

}  // namespace
}  // namespace diloco
