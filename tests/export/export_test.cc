// Integration tests of `diloco-ctl export`: a checkpoint written by the coordinator's SaveCheckpoint (a model whose
// every parameter, LayerNorm gains and biases included, was moved off its init so a misplaced tensor shows) is
// exported by the real diloco-ctl binary, and tests/export/check_export.py loads the file in Python PyTorch
// (scripts/bench/train_reference.py's model) and compares its logits with the C++ model's on the same tokens.
// Also: the checker rejects a transposed or a misnamed tensor, and every export error is one line with a non-zero
// exit code. Each test runs in its own scratch directory; single-threaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"
#include "tests/unit/scratch_dir_test.h"
#include "worker/lm/language_model.h"
#include "worker/lm/safetensors.h"

namespace diloco {
namespace {

constexpr int64_t kRound = 7;
constexpr int64_t kBatch = 2;

struct Ran {
  int code = -1;
  std::string output;
};

// Runs argv to completion with stdout + stderr captured.
Ran RunToEnd(const std::vector<std::string>& argv) {
  Subprocess::Options options;
  options.capture_output = true;
  auto p = Subprocess::Start(argv, options);
  if (!p.ok()) return {-1, std::string(p.status().message())};
  Ran ran;
  ran.output = p->ReadOutputToEnd();
  ran.code = p->Wait();
  return ran;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ExportTest : public ScratchDirTest {
 protected:
  void SetUp() override {
    ScratchDirTest::SetUp();
    config_path_ = Path("run.yaml");
    std::ofstream(config_path_) << "run:\n  name: export-test\n  seed: 3\n  output_dir: " << Path("run") << "\n"
                                << "model:\n  vocab_size: 96\n  seq_len: 16\n  n_layer: 2\n  n_head: 4\n"
                                << "  d_model: 32\n"
                                << "data:\n  text: " << DILOCO_SOURCE_DIR << "/tests/data/tinyshakespeare.txt\n"
                                << "  cache_dir: " << Path("cache") << "\n";
    auto config = LoadConfig(config_path_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    checkpoint_path_ = Path("ckpt-00000007.bin");
    WriteCheckpoint();
  }

  // theta of a "trained" model: the init plus N(0, 0.3) noise on every tensor (LayerNorm gains and biases too).
  void WriteCheckpoint() {
    LanguageModelPtr model = MakeLanguageModel(config_.model, config_.run.seed);
    torch::NoGradGuard no_grad;
    torch::manual_seed(11);
    CheckpointData data;
    data.round = kRound;
    for (auto& [name, p] : NamedParameters(*model)) {
      p.add_(torch::randn_like(p) * 0.3);
      data.params.emplace_back(name, p.detach().clone());
      data.momentum.push_back(torch::randn_like(p));
    }
    data.fingerprint = Fingerprint(SpecsOf(data.params));
    data.evals = {{0, 4.5}, {kRound, 3.25}};
    ASSERT_TRUE(SaveCheckpoint(checkpoint_path_, data).ok());
  }

  // The C++ model's logits for fixed tokens, as check_export.py's reference files; returns the reference JSON path.
  // With bf16, the model's parameters are first rounded to bfloat16 (what a --dtype bf16 export stores).
  std::string WriteCppReference(bool bf16 = false) {
    auto ckpt = LoadCheckpoint(checkpoint_path_);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    if (bf16) {
      for (auto& [name, t] : ckpt->params) t = t.to(torch::kBFloat16).to(torch::kFloat);
    }
    LanguageModelPtr model = MakeLanguageModel(config_.model, /*seed=*/99);  // another init: the load must overwrite it
    LoadParameters(*model, ckpt->params);
    model->eval();
    const int64_t T = config_.model.seq_len;
    torch::Tensor tokens = (torch::arange(kBatch * T, torch::kLong) * 37 + 11).remainder(config_.model.vocab_size);
    tokens = tokens.view({kBatch, T});
    torch::NoGradGuard no_grad;
    torch::Tensor logits = model->forward(tokens).contiguous();
    std::ofstream(Path("logits.f32"), std::ios::binary)
        .write(static_cast<const char*>(logits.data_ptr()), logits.numel() * sizeof(float));
    nlohmann::json ref;
    ref["tokens"] = nlohmann::json::array();
    for (int64_t b = 0; b < kBatch; ++b) {
      std::vector<int64_t> row(tokens[b].data_ptr<int64_t>(), tokens[b].data_ptr<int64_t>() + T);
      ref["tokens"].push_back(row);
    }
    ref["logits_file"] = "logits.f32";
    ref["logits_shape"] = logits.sizes().vec();
    std::ofstream(Path("reference.json")) << ref.dump();
    return Path("reference.json");
  }

  Ran Export(const std::string& out, std::vector<std::string> extra = {}, const std::string& format = "safetensors") {
    std::vector<std::string> argv = {std::string(DILOCO_BIN_DIR) + "/diloco-ctl",
                                     "export",
                                     "--checkpoint",
                                     checkpoint_path_,
                                     "--config",
                                     config_path_,
                                     "--format",
                                     format,
                                     "--out",
                                     out};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunToEnd(argv);
  }

  Ran Check(const std::string& weights, const std::string& model_json) {
    return RunToEnd({"/usr/bin/python3", std::string(DILOCO_SOURCE_DIR) + "/tests/export/check_export.py", "--weights",
                     weights, "--model-json", model_json, "--reference", WriteCppReference(), "--tol", "1e-4"});
  }

  // Re-writes the exported tensors with `edit` applied (the checker must then fail).
  void WriteTampered(const std::string& path, void (*edit)(std::vector<std::pair<std::string, at::Tensor>>*)) {
    auto ckpt = LoadCheckpoint(checkpoint_path_);
    ASSERT_TRUE(ckpt.ok());
    edit(&ckpt->params);
    std::vector<SafetensorsEntry> entries;
    for (auto& [name, t] : ckpt->params) {
      t = t.contiguous();
      entries.push_back({name, t.sizes().vec(), t.data_ptr<float>()});
    }
    ASSERT_TRUE(WriteSafetensors(path, entries,
                                 {{"diloco.round", std::to_string(kRound)}, {"diloco.fingerprint", ckpt->fingerprint}})
                    .ok());
  }

  // tests/export/check_hf_export.py under the reference stack (transformers' own GPT2LMHeadModel).
  Ran CheckHf(const std::string& dir, int shards, bool bf16 = false) {
    return RunToEnd({DILOCO_PYTHON, std::string(DILOCO_SOURCE_DIR) + "/tests/export/check_hf_export.py", "--dir", dir,
                     "--reference", WriteCppReference(bf16), "--tol", "1e-4", "--expect-shards",
                     std::to_string(shards)});
  }

  // Replaces the run's model: section (and the checkpoint) with `model_yaml`.
  void UseModel(const std::string& model_yaml) {
    std::ofstream(config_path_) << "run:\n  name: export-test\n  seed: 3\n  output_dir: " << Path("run") << "\n"
                                << "model:\n"
                                << model_yaml << "data:\n  text: " << DILOCO_SOURCE_DIR
                                << "/tests/data/tinyshakespeare.txt\n  cache_dir: " << Path("cache") << "\n";
    auto config = LoadConfig(config_path_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    WriteCheckpoint();
  }

  std::string config_path_, checkpoint_path_;
  Config config_;
};

TEST_F(ExportTest, PythonModelOnTheExportGivesTheCppLogits) {
  const Ran ran = Export(Path("model.safetensors"));
  ASSERT_EQ(ran.code, 0) << ran.output;
  EXPECT_NE(ran.output.find("exported round 7"), std::string::npos) << ran.output;

  const nlohmann::json j = nlohmann::json::parse(Slurp(Path("model.json")));
  EXPECT_EQ(j["vocab_size"], 96);
  EXPECT_EQ(j["seq_len"], 16);
  EXPECT_EQ(j["n_layer"], 2);
  EXPECT_EQ(j["n_head"], 4);
  EXPECT_EQ(j["d_model"], 32);
  EXPECT_EQ(j["round"], kRound);
  EXPECT_EQ(j["weights"], "model.safetensors");
  EXPECT_TRUE(j["tokenizer"].is_null());  // the run's token cache was never made

  // The file's own layout: 8-byte length, JSON header, 8-byte aligned data, nothing after the last tensor.
  const std::string bytes = Slurp(Path("model.safetensors"));
  uint64_t n = 0;
  memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["blocks.1.qkv.weight"]["shape"], nlohmann::json::array({96, 32}));
  EXPECT_EQ(header["__metadata__"]["diloco.round"], "7");
  EXPECT_EQ(header.size(), 1u + 2 + 2 * 12 + 2);  // 28 tensors  // metadata, tok/pos_emb, 12 per block, ln_f

  const Ran check = Check(Path("model.safetensors"), Path("model.json"));
  std::cout << "[export] " << check.output;
  EXPECT_EQ(check.code, 0) << check.output;
  EXPECT_NE(check.output.find("check_export: OK"), std::string::npos) << check.output;
}

TEST_F(ExportTest, HuggingFaceLoadsTheHfExportAndGivesOurLogits) {
  const Ran ran = Export(Path("hf"), {}, "hf");
  ASSERT_EQ(ran.code, 0) << ran.output;
  const nlohmann::json config = nlohmann::json::parse(Slurp(Path("hf/config.json")));
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(config["activation_function"], "gelu");  // gpt's exact GELU
  EXPECT_EQ(config["n_positions"], 16);
  EXPECT_TRUE(std::filesystem::exists(Path("hf/generation_config.json")));
  const std::string bytes = Slurp(Path("hf/model.safetensors"));
  uint64_t n = 0;
  memcpy(&n, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["transformer.h.1.attn.c_attn.weight"]["shape"], nlohmann::json::array({32, 96}));  // Conv1D
  EXPECT_FALSE(header.contains("lm_head.weight"));  // tied, as Hugging Face writes it

  const Ran check = CheckHf(Path("hf"), 1);
  std::cout << "[export hf] " << check.output;
  EXPECT_EQ(check.code, 0) << check.output;
  EXPECT_NE(check.output.find("check_hf_export: OK GPT2LMHeadModel"), std::string::npos) << check.output;
}

// A run that trained its own tokenizer writes every document as [BOS] ids [EOS] with the ids its token cache names:
// the Hugging Face export says them in config.json and generation_config.json, so that transformers' generate
// stops at the EOS the model learned. Before, both said null (the model config names none).
TEST_F(ExportTest, AnHfExportNamesTheBosAndEosTheRunsDocumentsWereWrittenWith) {
  auto cache = EnsureTokenized(config_, std::string(DILOCO_BIN_DIR) + "/diloco-tokenize");
  ASSERT_TRUE(cache.ok()) << cache.status();
  const nlohmann::json meta = nlohmann::json::parse(Slurp(cache->meta_path()));
  ASSERT_GE(meta["bos_id"].get<int>(), 0) << meta.dump();
  ASSERT_GE(meta["eos_id"].get<int>(), 0) << meta.dump();
  const Ran ran = Export(Path("hf"), {}, "hf");
  ASSERT_EQ(ran.code, 0) << ran.output;
  for (const char* file : {"hf/config.json", "hf/generation_config.json"}) {
    const nlohmann::json j = nlohmann::json::parse(Slurp(Path(file)));
    EXPECT_EQ(j["bos_token_id"], meta["bos_id"]) << file << ": " << j.dump();
    EXPECT_EQ(j["eos_token_id"], meta["eos_id"]) << file << ": " << j.dump();
  }
}

// Exported sharded into a folder that holds an earlier single-file export (then back): the earlier export's weight
// files go, as transformers' save_pretrained removes them. Before, the old model.safetensors stayed beside the new
// shards, and transformers (and our reader) loaded it instead of them.
TEST_F(ExportTest, ShardedHfExportLoads) {
  ASSERT_EQ(Export(Path("hf"), {}, "hf").code, 0);
  ASSERT_TRUE(std::filesystem::exists(Path("hf/model.safetensors")));
  std::ofstream(Path("hf/model-00001-of-00009.safetensors")) << "a shard of an older export";
  std::ofstream(Path("hf/notes.txt")) << "the user's own file";
  // About 110 KiB of float32 tensors (c_fc and mlp c_proj are 16 KiB each): a 32 KiB limit makes 4 or more shards.
  const Ran ran = Export(Path("hf"), {"--max-shard-size", "32768"}, "hf");
  ASSERT_EQ(ran.code, 0) << ran.output;
  const nlohmann::json index = nlohmann::json::parse(Slurp(Path("hf/model.safetensors.index.json")));
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  ASSERT_GE(shards.size(), 3u);
  char first[64];
  snprintf(first, sizeof(first), "model-00001-of-%05zu.safetensors", shards.size());
  EXPECT_EQ(*shards.begin(), first);
  EXPECT_FALSE(std::filesystem::exists(Path("hf/model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(Path("hf/model-00001-of-00009.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(Path("hf/notes.txt"))) << "only weight files are removed";
  const Ran check = CheckHf(Path("hf"), static_cast<int>(shards.size()));
  EXPECT_EQ(check.code, 0) << check.output;
  // And back to one file: the shards and their index go.
  ASSERT_EQ(Export(Path("hf"), {}, "hf").code, 0);
  EXPECT_FALSE(std::filesystem::exists(Path("hf/model.safetensors.index.json")));
  EXPECT_FALSE(std::filesystem::exists(Path("hf") + "/" + *shards.begin()));
  EXPECT_EQ(CheckHf(Path("hf"), 1).code, 0);
}

TEST_F(ExportTest, LlamaWithGqaAndUntiedHeadExportsForTransformers) {
  UseModel(
      "  arch: llama\n  vocab_size: 96\n  seq_len: 16\n  n_layer: 2\n  n_head: 4\n  n_kv_head: 2\n  d_model: 32\n"
      "  ffn_hidden: 80\n  max_positions: 64\n  rope_theta: 50000\n  norm_eps: 1e-6\n  tie_embeddings: false\n"
      "  bos_token_id: 1\n  eos_token_id: 2\n");
  const Ran ran = Export(Path("hf"), {}, "hf");
  ASSERT_EQ(ran.code, 0) << ran.output;
  const nlohmann::json generation = nlohmann::json::parse(Slurp(Path("hf/generation_config.json")));
  EXPECT_EQ(generation["eos_token_id"], 2);
  const Ran check = CheckHf(Path("hf"), 1);
  std::cout << "[export hf llama] " << check.output;
  EXPECT_NE(check.output.find("check_hf_export: OK LlamaForCausalLM"), std::string::npos) << check.output;
}

// The safetensors export's model.json says how a llama-shaped model's tensors go together (RMSNorm, SwiGLU of the
// model's own width, RoPE, grouped-query heads, an untied head); it used to describe our GPT whatever the arch.
TEST_F(ExportTest, SafetensorsModelJsonDescribesTheModelsOwnArchitecture) {
  UseModel(
      "  arch: qwen2\n  vocab_size: 96\n  seq_len: 16\n  n_layer: 2\n  n_head: 4\n  n_kv_head: 2\n  d_model: 32\n"
      "  ffn_hidden: 80\n  max_positions: 64\n  rope_theta: 50000\n  norm_eps: 1e-6\n  tie_embeddings: false\n");
  const Ran ran = Export(Path("model.safetensors"));
  ASSERT_EQ(ran.code, 0) << ran.output;
  const nlohmann::json j = nlohmann::json::parse(Slurp(Path("model.json")));
  EXPECT_EQ(j["arch"], "qwen2");
  EXPECT_EQ(j["d_mlp"], 80);
  const nlohmann::json& a = j["architecture"];
  EXPECT_EQ(a["norm"], "rmsnorm");
  EXPECT_DOUBLE_EQ(a["norm_eps"].get<double>(), 1e-6);
  EXPECT_EQ(a["positions"], "rope");
  EXPECT_DOUBLE_EQ(a["rope_theta"].get<double>(), 50000);
  EXPECT_EQ(a["n_kv_head"], 2);
  EXPECT_EQ(a["head_dim"], 8);
  EXPECT_EQ(a["tied_embeddings"], false);
  EXPECT_EQ(a["qkv_bias"], true);
  EXPECT_FALSE(a.contains("layer_norm_eps"));
}

TEST_F(ExportTest, Bf16HfExportHoldsTheRoundedWeights) {
  const Ran ran = Export(Path("hf"), {"--dtype", "bf16"}, "hf");
  ASSERT_EQ(ran.code, 0) << ran.output;
  EXPECT_EQ(nlohmann::json::parse(Slurp(Path("hf/config.json")))["dtype"], "bfloat16");
  const std::string bytes = Slurp(Path("hf/model.safetensors"));
  uint64_t n = 0;
  memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(nlohmann::json::parse(bytes.substr(8, n))["transformer.wte.weight"]["dtype"], "BF16");
  const Ran check = CheckHf(Path("hf"), 1, /*bf16=*/true);  // loaded as float32: our model on bf16-rounded weights
  EXPECT_EQ(check.code, 0) << check.output;
}

TEST_F(ExportTest, HfCheckerRejectsAWrongLogit) {
  ASSERT_EQ(Export(Path("hf"), {}, "hf").code, 0);
  WriteCppReference();
  {
    std::fstream f(Path("logits.f32"), std::ios::in | std::ios::out | std::ios::binary);
    const float off = 1e3f;
    f.write(reinterpret_cast<const char*>(&off), sizeof(off));  // the checker re-reads this file
  }
  const Ran check = RunToEnd({DILOCO_PYTHON, std::string(DILOCO_SOURCE_DIR) + "/tests/export/check_hf_export.py",
                              "--dir", Path("hf"), "--reference", Path("reference.json")});
  EXPECT_EQ(check.code, 1) << check.output;
  EXPECT_NE(check.output.find("logits differ"), std::string::npos) << check.output;
}

TEST_F(ExportTest, CopiesTheRunsTokenizer) {
  auto cache = LocateTokenCache(config_);
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::filesystem::create_directories(cache->dir);
  std::ofstream(cache->tokenizer_model_path()) << "sentencepiece model bytes";
  const Ran ran = Export(Path("out/lm.safetensors"), {"--set", "run.name=renamed"});
  ASSERT_NE(ran.code, 0);  // out/ does not exist
  std::filesystem::create_directories(Path("out"));
  const Ran again = Export(Path("out/lm.safetensors"), {"--set", "run.name=renamed"});
  ASSERT_EQ(again.code, 0) << again.output;
  const nlohmann::json j = nlohmann::json::parse(Slurp(Path("out/lm.json")));
  EXPECT_EQ(j["run_name"], "renamed");
  EXPECT_EQ(j["tokenizer"]["file"], "lm.tokenizer.model");
  EXPECT_EQ(Slurp(Path("out/lm.tokenizer.model")), "sentencepiece model bytes");
}

TEST_F(ExportTest, CheckerRejectsATransposedTensor) {
  ASSERT_EQ(Export(Path("model.safetensors")).code, 0);
  WriteTampered(Path("bad.safetensors"), [](std::vector<std::pair<std::string, at::Tensor>>* params) {
    for (auto& [name, t] : *params) {
      if (name == "blocks.0.attn_out.weight") t = t.t().contiguous();  // [32, 32]: the shape still fits
    }
  });
  const Ran check = Check(Path("bad.safetensors"), Path("model.json"));
  std::cout << "[export] " << check.output;
  EXPECT_EQ(check.code, 1) << check.output;
  EXPECT_NE(check.output.find("logits differ"), std::string::npos) << check.output;
}

TEST_F(ExportTest, CheckerRejectsSwappedNames) {
  ASSERT_EQ(Export(Path("model.safetensors")).code, 0);
  WriteTampered(Path("bad.safetensors"), [](std::vector<std::pair<std::string, at::Tensor>>* params) {
    for (auto& [name, t] : *params) {  // same shapes, so only the values can tell
      if (name == "blocks.1.ln1.bias") {
        name = "blocks.1.ln2.bias";
      } else if (name == "blocks.1.ln2.bias") {
        name = "blocks.1.ln1.bias";
      }
    }
  });
  const Ran check = Check(Path("bad.safetensors"), Path("model.json"));
  std::cout << "[export] " << check.output;
  EXPECT_EQ(check.code, 1) << check.output;
  EXPECT_NE(check.output.find("logits differ"), std::string::npos) << check.output;
}

// One line on stderr, the given exit code, and nothing left at the output path.
void ExpectOneLineError(const Ran& ran, int code, const std::string& text, const std::string& out) {
  EXPECT_EQ(ran.code, code) << ran.output;
  EXPECT_NE(ran.output.find(text), std::string::npos) << ran.output;
  EXPECT_EQ(std::count(ran.output.begin(), ran.output.end(), '\n'), 1) << ran.output;
  EXPECT_EQ(ran.output.rfind("diloco-ctl: error: export: ", 0), 0u) << ran.output;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(ExportTest, MissingCheckpointIsOneLine) {
  checkpoint_path_ = Path("nope.bin");
  ExpectOneLineError(Export(Path("m.safetensors")), 2, "nope.bin: cannot open", Path("m.safetensors"));
}

TEST_F(ExportTest, CorruptCheckpointIsOneLine) {
  std::string bytes = Slurp(checkpoint_path_);
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(checkpoint_path_, std::ios::binary) << bytes;
  ExpectOneLineError(Export(Path("m.safetensors")), 1, "checksum mismatch", Path("m.safetensors"));
}

TEST_F(ExportTest, ConfigOfAnotherModelIsRefused) {
  ExpectOneLineError(Export(Path("m.safetensors"), {"--set", "model.d_model=64"}), 1,
                     "'tok_emb.weight' is [96, 32] in the checkpoint, [96, 64] from model:", Path("m.safetensors"));
  ExpectOneLineError(
      Export(Path("m.safetensors"), {"--set", "model.n_layer=1"}), 1,
      "tensor #14 is 'blocks.1.ln1.weight' in the checkpoint, 'ln_f.weight' from model:", Path("m.safetensors"));
}

TEST_F(ExportTest, BadFlagsAndUnwritableOutputAreOneLine) {
  ExpectOneLineError(Export(Path("m.onnx"), {}, "onnx"), 2, "--format: unsupported 'onnx'", Path("m.onnx"));
  ExpectOneLineError(Export(Path("m.safetensors"), {"--set", "model.no_such_key=1"}), 2, "no_such_key",
                     Path("m.safetensors"));
  ExpectOneLineError(Export(Path("missing-dir/m.safetensors")), 1, "cannot write", Path("missing-dir/m.safetensors"));
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {  // no temp file left behind
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

}  // namespace
}  // namespace diloco
