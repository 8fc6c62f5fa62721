// A Hugging Face model directory whose tokenizer is a tokenizer.json, end to end through diloco-ctl:
// tests/golden/make_tokenizer_e2e.py trains Llama 3's and Qwen2's kinds of tokenizer.json with the tokenizers library,
// saves a tiny random LlamaForCausalLM / Qwen2ForCausalLM of that vocabulary beside it, and records the prompt's ids
// as AutoTokenizer gives them (the post-processor's BOS: llama's Llama 3 template, none for qwen2, and a Qwen2 model
// whose template adds BOS, qwen2_bos) and transformers' generate(do_sample=False) of 32 tokens. Here
// `diloco-ctl generate --prompt TEXT` (from the directory, and from a checkpoint of a run started from it) must print
// exactly those ids and their text, and `diloco-ctl export --format hf` must carry the tokenizer.json into the export,
// where AutoTokenizer loads it and encodes the prompt to the same ids, and generate from the export gives them again.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config_loader.h"
#include "config/subprocess.h"
#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"
#include "tests/process_harness.h"
#include "worker/lm/init_from.h"
#include "worker/lm/language_model.h"

namespace diloco::testing {
namespace {

class HfTokenizerE2eTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = ScratchDir("hf_tokenizer_e2e_" + std::to_string(::getpid()));
    if (!std::filesystem::exists(DILOCO_PYTHON)) return;
    ASSERT_EQ(Shell(std::string(DILOCO_PYTHON) + " " + SourceDir() + "/tests/golden/make_tokenizer_e2e.py make " +
                    dir_ + " " + SourceDir() + "/tests/data/tinyshakespeare.txt > " + dir_ + "/make.log 2>&1"),
              0)
        << ReadFile(dir_ + "/make.log");
    golden_ = ReadJson(dir_ + "/golden.json");
  }
  void SetUp() override {
    if (!std::filesystem::exists(DILOCO_PYTHON)) GTEST_SKIP() << "no Python with transformers at " << DILOCO_PYTHON;
  }
  static std::string ModelDir() { return dir_ + "/" + GetParam(); }
  static const nlohmann::json& Golden() { return golden_[GetParam()]; }
  // A run config whose model: comes from init_from (its config.json; data.tokenizer from its tokenizer.json).
  static std::string RunYaml(const std::string& init_from, const std::string& tag) {
    const std::string path = dir_ + "/" + tag + ".yaml";
    std::ofstream(path) << "run:\n  name: e2e\n  output_dir: " << dir_ << "/run_" << tag
                        << "\nmodel:\n  init_from: " << init_from << "\n";
    return path;
  }

  static std::string dir_;
  static nlohmann::json golden_;
};
std::string HfTokenizerE2eTest::dir_;
nlohmann::json HfTokenizerE2eTest::golden_;

// Runs diloco-ctl with args (no shell: the prompt's newline and UTF-8 pass as they are): exit code, stdout + stderr.
std::pair<int, std::string> RunCtl(const std::vector<std::string>& args) { return RunToEnd("diloco-ctl", args); }

std::string JoinIds(const nlohmann::json& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i].get<int>());
  return out;
}

// diloco-ctl generate --prompt with `source` (--init-from DIR, or --checkpoint FILE) and 32 greedy tokens.
std::pair<int, std::string> Generate(const std::vector<std::string>& source, const std::string& prompt,
                                     bool print_ids) {
  std::vector<std::string> args = {"generate", "--prompt", prompt, "--max-new-tokens", "32", "--ignore-eos"};
  args.insert(args.end(), source.begin(), source.end());
  if (print_ids) args.push_back("--print-ids");
  return RunCtl(args);
}

TEST_P(HfTokenizerE2eTest, GeneratePromptGivesTransformersGreedyIds) {
  const std::string prompt = Golden()["prompt"];
  const auto [code, out] =
      Generate({"--config", RunYaml("", "generate"), "--init-from", ModelDir()}, prompt, /*print_ids=*/true);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(out, JoinIds(Golden()["generated"]) + "\n");
  // Without --print-ids: the prompt, then the tokenizer.json's decoding of the new ids.
  const auto [text_code, text] =
      Generate({"--config", RunYaml("", "generate"), "--init-from", ModelDir()}, prompt, /*print_ids=*/false);
  ASSERT_EQ(text_code, 0) << text;
  EXPECT_EQ(text, prompt + Golden()["decoded"].get<std::string>() + "\n");
}

// A checkpoint of a run started from the directory: generate and export find the tokenizer.json through the run's
// config (data.tokenizer set from init_from); the export holds the same file, AutoTokenizer reads it, and the export
// generates the same ids again.
TEST_P(HfTokenizerE2eTest, CheckpointGeneratesAndExportCarriesTheTokenizerJson) {
  const std::string yaml = RunYaml(ModelDir(), "export");
  auto config = LoadConfig(yaml, {});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->data.tokenizer, ModelDir() + "/tokenizer.json");
  auto model = MakeLanguageModel(config->model, 1);
  ASSERT_TRUE(LoadInitFrom(config->model, *model).ok());
  CheckpointData data;
  data.round = 1;
  for (const auto& [name, value] : NamedParameters(*model)) data.params.emplace_back(name, value.detach().clone());
  data.fingerprint = Fingerprint(SpecsOf(data.params));
  const std::string ckpt = dir_ + "/" + GetParam() + "_ckpt.bin", out = dir_ + "/" + GetParam() + "_hf";
  ASSERT_TRUE(SaveCheckpoint(ckpt, data).ok());

  const std::string prompt = Golden()["prompt"];
  const auto [code, ids] = Generate({"--config", yaml, "--checkpoint", ckpt}, prompt, /*print_ids=*/true);
  ASSERT_EQ(code, 0) << ids;
  EXPECT_EQ(ids, JoinIds(Golden()["generated"]) + "\n");

  std::filesystem::remove_all(out);
  const auto [export_code, log] =
      RunCtl({"export", "--checkpoint", ckpt, "--config", yaml, "--format", "hf", "--out", out});
  ASSERT_EQ(export_code, 0) << log;
  EXPECT_EQ(ReadFile(out + "/tokenizer.json"), ReadFile(ModelDir() + "/tokenizer.json"));
  if (GetParam() ==
      "llama") {  // the tokenizer_config.json (its BOS / EOS names) and chat template beside it come along
    EXPECT_EQ(ReadFile(out + "/tokenizer_config.json"), ReadFile(ModelDir() + "/tokenizer_config.json"));
    EXPECT_EQ(ReadFile(out + "/chat_template.jinja"), ReadFile(ModelDir() + "/chat_template.jinja"));
  }
  // AutoTokenizer in the export gives the prompt the same special tokens, and the same ids without them.
  const std::string check_log = dir_ + "/" + GetParam() + "_check.log";
  const int check = Shell(
      std::string(DILOCO_PYTHON) + " " + SourceDir() + "/tests/golden/make_tokenizer_e2e.py check " + out +
      " \"$(cat " + dir_ + "/" + GetParam() + "_prompt.txt)\" '" + JoinIds(Golden()["prompt_ids"]) + "' '" +
      JoinIds(Golden()["plain_ids"]) + "'" + (GetParam() == "llama" ? " '<|bos|>'" : "") + " > " + check_log + " 2>&1");
  EXPECT_EQ(check, 0) << ReadFile(check_log);
  EXPECT_NE(ReadFile(check_log).find("check_tokenizer: OK"), std::string::npos) << ReadFile(check_log);

  const auto [again_code, again] =
      Generate({"--config", RunYaml("", "again"), "--init-from", out}, prompt, /*print_ids=*/true);
  ASSERT_EQ(again_code, 0) << again;
  EXPECT_EQ(again, JoinIds(Golden()["generated"]) + "\n");
}

INSTANTIATE_TEST_SUITE_P(Families, HfTokenizerE2eTest, ::testing::Values("llama", "qwen2", "qwen2_bos"));

}  // namespace
}  // namespace diloco::testing
