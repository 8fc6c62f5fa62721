#include "scripts/ctl/export.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/config_loader.h"
#include "config/data_cache.h"
#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"
#include "scripts/ctl/hf_export.h"
#include "worker/data/token_manifest.h"
#include "worker/lm/language_model.h"
#include "worker/lm/safetensors.h"

namespace diloco {
namespace {

constexpr char kSuffix[] = ".safetensors";

std::string Shape(const std::vector<int64_t>& shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

// The first tensor where two spec lists differ, in words ("" when they are equal).
std::string FirstDifference(const std::vector<TensorSpec>& checkpoint, const std::vector<TensorSpec>& model) {
  for (size_t i = 0; i < checkpoint.size() && i < model.size(); ++i) {
    const TensorSpec &c = checkpoint[i], &m = model[i];
    if (c.name != m.name) return absl::StrCat("tensor #", i, " is '", c.name, "' in the checkpoint, '", m.name, "'");
    if (c.shape != m.shape) {
      return absl::StrCat("'", c.name, "' is ", Shape(c.shape), " in the checkpoint, ", Shape(m.shape));
    }
    if (c.dtype != m.dtype) return absl::StrCat("'", c.name, "' has another dtype");
  }
  if (checkpoint.size() != model.size()) {
    return absl::StrCat("the checkpoint has ", checkpoint.size(), " tensors, the model ", model.size());
  }
  return "";
}

// Refuses a checkpoint whose tensors are not exactly the parameters of the model `config` builds.
absl::Status CheckSameModel(const ExportOptions& options, const Config& config, const CheckpointData& ckpt) {
  const std::vector<TensorSpec> stored = SpecsOf(ckpt.params);
  if (Fingerprint(stored) != ckpt.fingerprint) {
    return absl::DataLossError(absl::StrCat("checkpoint ", options.checkpoint, ": its tensors do not match its own ",
                                            "fingerprint ", ckpt.fingerprint));
  }
  LanguageModelPtr model = MakeLanguageModel(config.model, config.run.seed);
  const std::vector<TensorSpec> expected = SpecsOf(NamedParameters(*model));
  const std::string fingerprint = Fingerprint(expected);
  if (fingerprint != ckpt.fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", options.checkpoint, " (fingerprint ", ckpt.fingerprint, ") is not of the model that ",
        options.config, " describes (fingerprint ", fingerprint, "): ", FirstDifference(stored, expected),
        " from model: (vocab_size ", config.model.vocab_size, ", seq_len ", config.model.seq_len, ", n_layer ",
        config.model.n_layer, ", d_model ", config.model.d_model, "); pass the config of the run that wrote it"));
  }
  try {
    LoadParameters(*model, ckpt.params);  // names and shapes, once more, through the loader training uses
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", options.checkpoint, ": ", e.what()));
  }
  for (const auto& [name, t] : ckpt.params) {
    if (!at::isfinite(t).all().item<bool>()) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", options.checkpoint, ": tensor '", name, "' has NaN or infinite values"));
    }
  }
  return absl::OkStatus();
}

// The run's tokenizer (SentencePiece or tokenizer.json), if its token cache exists ("" otherwise: e.g. the text or
// cache is elsewhere).
std::string FindTokenizer(const Config& config) {
  auto cache = LocateTokenCache(config);
  if (!cache.ok()) return "";
  std::error_code ec;
  return std::filesystem::is_regular_file(cache->tokenizer_path(), ec) ? cache->tokenizer_path() : "";
}

// How the tensors make a model, by model.arch (worker/lm/arch_*.cc): what a reader needs besides the sizes.
nlohmann::ordered_json ArchitectureJson(const ModelConfig& m) {
  if (m.arch == ModelArch::kGpt) {
    return {{"norm", "pre-layernorm"},          {"layer_norm_eps", 1e-5},  {"activation", "gelu (erf)"},
            {"positions", "learned (pos_emb)"}, {"tied_embeddings", true}, {"logits", "ln_f(x) @ tok_emb.weight^T"}};
  }
  if (m.arch == ModelArch::kGpt2) {
    return {{"norm", "pre-layernorm"},      {"layer_norm_eps", m.norm_eps},      {"activation", "gelu (tanh)"},
            {"positions", "learned (wpe)"}, {"max_positions", m.MaxPositions()}, {"tied_embeddings", true}};
  }
  nlohmann::ordered_json a = {{"norm", "rmsnorm"},
                              {"norm_eps", m.norm_eps},
                              {"activation", "silu (SwiGLU: down(silu(gate(x)) * up(x)))"},
                              {"positions", "rope"},
                              {"rope_theta", m.rope_theta},
                              {"rope_type", std::string(EnumName(m.rope_type))},
                              {"max_positions", m.MaxPositions()},
                              {"n_kv_head", m.KvHeads()},
                              {"head_dim", m.HeadDim()},
                              {"tied_embeddings", m.tie_embeddings}};
  if (m.rope_type != RopeType::kDefault) a["rope_factor"] = m.rope_factor;
  if (m.arch == ModelArch::kQwen2) a["qkv_bias"] = true;
  if (m.arch == ModelArch::kQwen3) a["qk_norm"] = true;
  if (m.sliding_window > 0) a["sliding_window"] = m.sliding_window;
  return a;
}

nlohmann::ordered_json ModelJson(const Config& config, const CheckpointData& ckpt, const ExportOptions& options,
                                 int64_t parameters, const std::string& tokenizer_copy) {
  const ModelConfig& m = config.model;
  nlohmann::ordered_json j;
  j["format"] = "diloco-transformer-lm";
  j["weights"] = std::filesystem::path(options.out).filename().string();
  j["dtype"] = "float32";
  j["arch"] = std::string(EnumName(m.arch));
  j["vocab_size"] = m.vocab_size;
  j["seq_len"] = m.seq_len;
  j["n_layer"] = m.n_layer;
  j["n_head"] = m.n_head;
  j["d_model"] = m.d_model;
  j["d_mlp"] = m.FfnHidden();
  j["architecture"] = ArchitectureJson(m);
  j["parameters"] = parameters;
  j["round"] = ckpt.round;
  j["fingerprint"] = ckpt.fingerprint;
  j["checkpoint"] = options.checkpoint;
  j["run_name"] = config.run.name;
  if (tokenizer_copy.empty()) {
    j["tokenizer"] = nullptr;
  } else {
    const bool json = TokenizerFileName(tokenizer_copy) == "tokenizer.json";
    j["tokenizer"] = {{"type", json ? "tokenizer.json" : "sentencepiece"},
                      {"file", std::filesystem::path(tokenizer_copy).filename().string()},
                      {"vocab_size", m.vocab_size},
                      {"trained_on", config.data.text}};
  }
  return j;
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", path));
  return ss.str();
}

// config.model with the BOS / EOS ids the run's documents were written with (its token cache's manifest) where the
// model names none (a run that trained its own tokenizer): transformers' generate then stops at the EOS the model
// learned (before, config.json said null).
ModelConfig ModelWithCacheTokenIds(const Config& config) {
  ModelConfig model = config.model;
  if (model.bos_token_id >= 0 && model.eos_token_id >= 0) return model;
  auto cache = LocateTokenCache(config);
  TokenManifest manifest;
  std::string error;
  if (!cache.ok() || !ReadTokenManifest(cache->meta_path(), &manifest, &error)) return model;
  if (model.bos_token_id < 0 && manifest.bos_id >= 0 && manifest.bos_id < model.vocab_size) {
    model.bos_token_id = manifest.bos_id;
  }
  if (model.eos_token_id < 0 && manifest.eos_id >= 0 && manifest.eos_id < model.vocab_size) {
    model.eos_token_id = manifest.eos_id;
  }
  return model;
}

absl::StatusOr<ExportResult> ExportHf(const ExportOptions& options, const Config& config, const CheckpointData& ckpt) {
  HfExportOptions hf;
  hf.out = options.out;
  hf.dtype = options.dtype;
  hf.max_shard_size = options.max_shard_size;
  hf.tokenizer = config.data.tokenizer.empty() ? FindTokenizer(config) : config.data.tokenizer;
  auto written = WriteHfDirectory(hf, ModelWithCacheTokenIds(config), ckpt.params);
  if (!written.ok()) return written.status();
  ExportResult result;
  result.weights_path = options.out;
  result.config_path = (std::filesystem::path(options.out) / "config.json").string();
  if (!hf.tokenizer.empty()) {
    result.tokenizer_path = (std::filesystem::path(options.out) / TokenizerFileName(hf.tokenizer)).string();
  }
  result.round = ckpt.round;
  for (const auto& [name, t] : ckpt.params) result.parameters += t.numel();
  result.files = written->files;
  return result;
}

}  // namespace

std::string ModelJsonPath(const std::string& out) {
  const size_t n = sizeof(kSuffix) - 1;
  if (out.size() > n && out.compare(out.size() - n, n, kSuffix) == 0) return out.substr(0, out.size() - n) + ".json";
  return out + ".json";
}

absl::StatusOr<ExportResult> ExportCheckpoint(const ExportOptions& options) {
  if (options.format != "safetensors" && options.format != "hf") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format: unsupported '", options.format, "' (use safetensors or hf)"));
  }
  auto config = LoadConfig(options.config, options.overrides);
  if (!config.ok()) return config.status();
  auto ckpt = LoadCheckpoint(options.checkpoint);
  if (!ckpt.ok()) return ckpt.status();
  if (absl::Status s = CheckSameModel(options, *config, *ckpt); !s.ok()) return s;
  if (options.format == "hf") return ExportHf(options, *config, *ckpt);

  ExportResult result;
  result.weights_path = options.out;
  result.config_path = ModelJsonPath(options.out);
  result.round = ckpt->round;
  std::vector<at::Tensor> keep;  // contiguous float32 copies alive until written
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : ckpt->params) {
    keep.push_back(t.to(at::kFloat).contiguous());
    entries.push_back({name, keep.back().sizes().vec(), keep.back().data_ptr<float>()});
    result.parameters += t.numel();
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"diloco.round", std::to_string(ckpt->round)},
      {"diloco.fingerprint", ckpt->fingerprint},
      {"diloco.model", absl::StrCat("vocab_size=", config->model.vocab_size, " seq_len=", config->model.seq_len,
                                    " n_layer=", config->model.n_layer, " n_head=", config->model.n_head,
                                    " d_model=", config->model.d_model)}};
  if (absl::Status s = WriteSafetensors(options.out, entries, metadata); !s.ok()) return s;

  if (const std::string tokenizer = FindTokenizer(*config); !tokenizer.empty()) {
    const std::string json = result.config_path;
    result.tokenizer_path = json.substr(0, json.size() - 5) + "." + TokenizerFileName(tokenizer);
    auto bytes = ReadAll(tokenizer);
    if (!bytes.ok()) return bytes.status();
    if (absl::Status s = WriteFileAtomically(result.tokenizer_path, *bytes); !s.ok()) return s;
  }
  const std::string json = ModelJson(*config, *ckpt, options, result.parameters, result.tokenizer_path).dump(2) + "\n";
  if (absl::Status s = WriteFileAtomically(result.config_path, json); !s.ok()) return s;
  return result;
}

}  // namespace diloco
