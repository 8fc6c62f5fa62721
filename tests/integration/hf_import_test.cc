// Import of a Hugging Face model directory (model.init_from: DIR), end to end with the real binaries: a Llama saved
// by transformers' own save_pretrained in bf16 (made here with the reference stack, DILOCO_PYTHON) whose config.json
// supplies every model key tiny.yaml leaves unset (arch, n_kv_head, ffn_hidden, max_positions, rope_theta, norm_eps,
// tie_embeddings). DiLoCo with 2 workers trains 3 rounds from it and the validation loss falls; the data-parallel
// baseline starts from the same theta_0 (same round-0 loss); the export goes back to transformers' format. Then one
// round from each llama-shaped family's directory (HfFamilyRound).
#include <gtest/gtest.h>

#include <filesystem>

#include "config/subprocess.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

// tiny.yaml's shapes (vocab 128, d_model 32, 1 layer, 2 heads) as a LlamaForCausalLM with GQA and an untied head.
constexpr char kMakeLlama[] = R"(
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
c = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=64, rope_theta=20000.0, tie_word_embeddings=False)
m = LlamaForCausalLM(c).to(torch.bfloat16)
# An Instruct model's sampling settings, which the export must keep (transformers' save_pretrained does).
m.generation_config.do_sample, m.generation_config.temperature, m.generation_config.top_p = True, 0.7, 0.8
m.save_pretrained(sys.argv[1])
)";

int RunPython(const std::vector<std::string>& args, std::string* output) {
  std::vector<std::string> argv = {DILOCO_PYTHON};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess::Options options;
  options.capture_output = true;
  auto p = Subprocess::Start(argv, options);
  if (!p.ok()) return -1;
  *output += p->ReadOutputToEnd();
  return p->Wait();
}

nlohmann::json Launch(const std::string& dir, const std::vector<std::string>& overrides, bool ddp,
                      std::string* output) {
  std::vector<std::string> args = TinyArgs(dir, overrides);
  args.erase(args.begin());  // the launcher takes the config as a positional argument
  if (ddp) args.insert(args.begin(), {"--mode", "ddp"});
  RunningProcess launch("diloco-launch", args);
  EXPECT_EQ(launch.Wait(240), 0) << launch.output();
  *output = launch.output();
  return ReadJson(dir + "/summary.json");
}

TEST(HfImport, LlamaDirectoryTrainsWithDiLoCoAndDataParallelAndExportsBack) {
  const std::string hf = ScratchDir("hf_llama");
  std::string made;
  ASSERT_EQ(RunPython({"-c", kMakeLlama, hf}, &made), 0) << made;
  // The directory ships no tokenizer: a tokenizer trained here would not match its embeddings, so the run is refused
  // unless data.train_tokenizer says so (before, one was trained silently).
  std::vector<std::string> refused = TinyArgs(ScratchDir("hf_no_tokenizer"), {"model.init_from=" + hf});
  refused.erase(refused.begin());
  refused.insert(refused.begin(), "--check-config");
  RunningProcess check("diloco-launch", refused);
  EXPECT_EQ(check.Wait(60), 2) << check.output();
  EXPECT_NE(check.output().find("model.init_from " + hf + ": the directory has no tokenizer.model or tokenizer.json"),
            std::string::npos)
      << check.output();
  const std::vector<std::string> overrides = {"model.init_from=" + hf, "data.train_tokenizer=true"};

  std::string output;
  const std::string run = ScratchDir("hf_diloco");
  const nlohmann::json diloco = Launch(run, overrides, false, &output);
  EXPECT_NE(output.find("theta_0 from " + hf + " (Hugging Face llama"), std::string::npos) << output;
  EXPECT_NE(output.find("model.arch: llama"), std::string::npos);  // the resolved config
  EXPECT_NE(output.find("model.n_kv_head: 1"), std::string::npos);
  EXPECT_NE(output.find("model.rope_theta: 20000"), std::string::npos);
  const auto& evals = diloco["evals"];
  ASSERT_EQ(evals.size(), 4u);
  EXPECT_LT(evals.back()["val_loss"].get<double>(), evals.front()["val_loss"].get<double>() - 0.2) << evals.dump();

  const nlohmann::json ddp = Launch(ScratchDir("hf_ddp"), overrides, true, &output);
  EXPECT_NE(output.find("theta_0 from " + hf), std::string::npos) << output;
  EXPECT_DOUBLE_EQ(ddp["evals"][0]["val_loss"].get<double>(), evals.front()["val_loss"].get<double>());

  const std::string out = ScratchDir("hf_export");
  RunningProcess exported("diloco-ctl", With({"export", "--checkpoint", run + "/checkpoints/ckpt-00000003.bin",
                                              "--format", "hf", "--out", out},
                                             TinyArgs(run, overrides)));
  ASSERT_EQ(exported.Wait(60), 0) << exported.output();
  std::string loaded;
  ASSERT_EQ(RunPython({"-c",
                       "import sys, transformers; m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
                       "g = m.generation_config; print(type(m).__name__, m.config.num_key_value_heads, "
                       "m.config.rope_parameters['rope_theta'], g.do_sample, g.temperature, g.top_p)",
                       out},
                      &loaded),
            0)
      << loaded;
  EXPECT_NE(loaded.find("LlamaForCausalLM 1 20000.0 True 0.7 0.8"), std::string::npos) << loaded;

  // transformers' loss of the exported model on our validation batches is the coordinator's last evaluation (of the
  // same theta_3): the export, the architecture and the evaluation agree.
  std::string loss;
  ASSERT_EQ(RunPython({SourceDir() + "/tests/integration/hf_val_loss.py", out, BinDir() + "/test-cache", "128", "32",
                       "4", "8"},
                      &loss),
            0)
      << loss;
  const size_t last_line = loss.find_last_of('\n', loss.size() - 2);  // the loss is the last line
  EXPECT_NEAR(std::strtod(loss.c_str() + (last_line == std::string::npos ? 0 : last_line + 1), nullptr),
              evals.back()["val_loss"].get<double>(), 1e-4)
      << loss;
}

// One DiLoCo round from each llama-shaped family's directory (tiny.yaml's shapes, made by transformers in float32):
// mistral with a window (16) shorter than the training context (32), qwen2 with its q/k/v biases and a tied head,
// qwen3 with q/k norms and head_dim 24, llama with Llama 3.1's rope scaling. The round must run and lower the
// validation loss; the export of its checkpoint loads in transformers with no missing or unexpected key and gives our
// coordinator's validation loss of that theta (tests/integration/hf_val_loss.py).
constexpr char kMakeFamily[] = R"(
import sys, torch, transformers
torch.manual_seed(0)
family, out = sys.argv[1], sys.argv[2]
common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=None,
              eos_token_id=None)
if family == "mistral":
    m = transformers.MistralForCausalLM(transformers.MistralConfig(**common, sliding_window=16))
elif family == "qwen2":
    m = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**{**common, "tie_word_embeddings": True}))
elif family == "qwen3":
    m = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common, head_dim=24))
else:
    m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}))
m.save_pretrained(out)
)";

constexpr char kLoadStrict[] = R"(
import sys, transformers
m, info = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
bad = {k: v for k, v in info.items() if v}
print(type(m).__name__, "problems:", bad if bad else "none")
)";

class HfFamilyRound : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFamilyRound, OneDiLoCoRoundFromTheDirectoryAndExportBack) {
  const std::string family = GetParam();
  const std::string hf = ScratchDir("hf_family_" + family);
  std::string made;
  ASSERT_EQ(RunPython({"-c", kMakeFamily, family, hf}, &made), 0) << made;
  const std::vector<std::string> overrides = {"model.init_from=" + hf, "outer.rounds=1", "data.train_tokenizer=true"};

  std::string output;
  const std::string run = ScratchDir("hf_round_" + family);
  const nlohmann::json summary = Launch(run, overrides, false, &output);
  EXPECT_NE(output.find("model.arch: " + family), std::string::npos) << output;
  const auto& evals = summary["evals"];
  ASSERT_EQ(evals.size(), 2u) << summary.dump();
  EXPECT_LT(evals[1]["val_loss"].get<double>(), evals[0]["val_loss"].get<double>()) << evals.dump();

  const std::string out = ScratchDir("hf_export_" + family);
  RunningProcess exported("diloco-ctl", With({"export", "--checkpoint", run + "/checkpoints/ckpt-00000001.bin",
                                              "--format", "hf", "--out", out},
                                             TinyArgs(run, overrides)));
  ASSERT_EQ(exported.Wait(60), 0) << exported.output();
  std::string loaded;
  ASSERT_EQ(RunPython({"-c", kLoadStrict, out}, &loaded), 0) << loaded;
  EXPECT_NE(loaded.find("problems: none"), std::string::npos) << loaded;

  std::string loss;
  ASSERT_EQ(RunPython({SourceDir() + "/tests/integration/hf_val_loss.py", out, BinDir() + "/test-cache", "128", "32",
                       "4", "8"},
                      &loss),
            0)
      << loss;
  const size_t last_line = loss.find_last_of('\n', loss.size() - 2);
  EXPECT_NEAR(std::strtod(loss.c_str() + (last_line == std::string::npos ? 0 : last_line + 1), nullptr),
              evals[1]["val_loss"].get<double>(), 1e-4)
      << loss;
}

INSTANTIATE_TEST_SUITE_P(Families, HfFamilyRound, ::testing::Values("mistral", "qwen2", "qwen3", "llama"));

}  // namespace
}  // namespace diloco::testing
