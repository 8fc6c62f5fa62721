#include "scripts/ctl/hf_export.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/hf_model_config.h"
#include "worker/lm/safetensors.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into the exported list
};

// Tensors in order, a new shard whenever the next tensor would take the current one above max_bytes (a tensor larger
// than max_bytes gets a shard of its own), as transformers' save_pretrained splits.
std::vector<Shard> PlanShards(const std::vector<at::Tensor>& tensors, int64_t max_bytes) {
  std::vector<Shard> shards;
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t size = tensors[i].numel() * tensors[i].element_size();
    if (shards.empty() || (bytes > 0 && bytes + size > max_bytes)) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().tensors.push_back(i);
    bytes += size;
  }
  if (shards.size() == 1) {
    shards[0].file = "model.safetensors";
  } else {
    for (size_t s = 0; s < shards.size(); ++s) {
      shards[s].file = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    }
  }
  return shards;
}

absl::Status CopyFile(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("tokenizer ", from, ": cannot be read"));
  return WriteFileAtomically(to, bytes.str());
}

}  // namespace

absl::StatusOr<std::pair<std::string, bool>> HfTensorName(ModelArch arch, const std::string& name) {
  if (arch != ModelArch::kGpt) return std::make_pair(name, false);
  static const std::map<std::string, std::string> kTop = {{"tok_emb.weight", "transformer.wte.weight"},
                                                          {"pos_emb.weight", "transformer.wpe.weight"},
                                                          {"ln_f.weight", "transformer.ln_f.weight"},
                                                          {"ln_f.bias", "transformer.ln_f.bias"}};
  static const std::map<std::string, std::string> kBlock = {
      {"ln1", "ln_1"}, {"qkv", "attn.c_attn"}, {"attn_out", "attn.c_proj"},
      {"ln2", "ln_2"}, {"fc", "mlp.c_fc"},     {"mlp_out", "mlp.c_proj"}};
  if (auto it = kTop.find(name); it != kTop.end()) return std::make_pair(it->second, false);
  static const std::regex kBlockName(R"(blocks\.(\d+)\.(\w+)\.(weight|bias))");
  std::smatch m;
  if (std::regex_match(name, m, kBlockName)) {
    if (auto it = kBlock.find(m[2]); it != kBlock.end()) {
      const bool linear = m[3] == "weight" && m[2] != "ln1" && m[2] != "ln2";  // Conv1D stores [in, out]
      return std::make_pair(absl::StrCat("transformer.h.", std::string(m[1]), ".", it->second, ".", std::string(m[3])),
                            linear);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("export --format hf: no GPT-2 name for gpt tensor '", name, "'"));
}

namespace {

// Once the new export is written: the weight files of an earlier export into the same folder that this one did not
// write (a single model.safetensors beside new shards, shards of another count, an index beside a single file), as
// transformers' save_pretrained removes them. Left there, they would be loaded instead of the new weights (a single
// model.safetensors wins over shards, in transformers and in our reader alike).
absl::Status RemoveStaleWeights(const std::string& out, const std::vector<std::string>& written) {
  static const std::regex kWeights(
      R"(model\.safetensors|model\.safetensors\.index\.json|model-\d{5}-of-\d{5}\.safetensors|)"
      R"(pytorch_model(-\d{5}-of-\d{5})?\.bin|pytorch_model\.bin\.index\.json)");
  std::set<std::string> keep;
  for (const std::string& path : written) keep.insert(fs::path(path).filename().string());
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(out, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || keep.count(name) != 0 || !std::regex_match(name, kWeights)) continue;
    if (!fs::remove(entry.path(), ec) || ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("--out ", out, ": cannot remove the earlier export's ", name, ": ", ec.message()));
    }
  }
  if (ec) return absl::PermissionDeniedError(absl::StrCat("--out ", out, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfExportResult> WriteHfDirectory(const HfExportOptions& options, const ModelConfig& model,
                                                const NamedTensors& params) {
  if (options.dtype != "fp32" && options.dtype != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype: unsupported '", options.dtype, "' (use fp32 or bf16)"));
  }
  const bool bf16 = options.dtype == "bf16";
  if (options.max_shard_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max-shard-size: must be > 0, got ", options.max_shard_size));
  }
  std::error_code ec;
  fs::create_directories(options.out, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("--out ", options.out, ": ", ec.message()));

  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;  // contiguous float32, alive until written
  for (const auto& [name, t] : params) {
    auto hf = HfTensorName(model.arch, name);
    if (!hf.ok()) return hf.status();
    names.push_back(hf->first);
    tensors.push_back((hf->second ? t.t() : t).to(bf16 ? at::kBFloat16 : at::kFloat).contiguous());
  }
  HfExportResult result;
  const std::vector<Shard> shards = PlanShards(tensors, options.max_shard_size);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (const Shard& shard : shards) {
    std::vector<SafetensorsEntry> entries;
    for (size_t i : shard.tensors) {
      entries.push_back({names[i], tensors[i].sizes().vec(), tensors[i].data_ptr(),
                         bf16 ? SafetensorsDtype::kBF16 : SafetensorsDtype::kF32});
      weight_map[names[i]] = shard.file;
      result.total_size += tensors[i].numel() * tensors[i].element_size();
    }
    const std::string path = (fs::path(options.out) / shard.file).string();
    if (absl::Status s = WriteSafetensors(path, entries, {{"format", "pt"}}); !s.ok()) return s;
    result.files.push_back(path);
  }
  std::vector<std::pair<std::string, std::string>> texts;
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", result.total_size}};
    index["weight_map"] = weight_map;
    texts.emplace_back("model.safetensors.index.json", index.dump(2) + "\n");
  }
  // A model from a Hugging Face directory keeps that directory's list of EOS ids (transformers stops at any).
  const std::vector<int64_t> eos_ids = HfStopTokenIds(model.init_from, model.vocab_size);
  texts.emplace_back("config.json",
                     HfConfigJson(model, bf16 ? "bfloat16" : "float32", "4.46.0", eos_ids).dump(2) + "\n");
  // A model from a Hugging Face directory keeps that directory's generation_config.json as transformers'
  // save_pretrained would (its do_sample, temperature, top_p, repetition_penalty: an Instruct model's sampling);
  // otherwise the one its config implies.
  std::error_code ec_generation;
  const fs::path source_generation =
      model.init_from.empty() ? fs::path() : fs::path(model.init_from) / "generation_config.json";
  const bool keep_generation = !model.init_from.empty() && fs::is_regular_file(source_generation, ec_generation);
  if (!keep_generation) {
    texts.emplace_back("generation_config.json", HfGenerationConfigJson(model, "4.46.0", eos_ids).dump(2) + "\n");
  }
  for (const auto& [file, text] : texts) {
    const std::string path = (fs::path(options.out) / file).string();
    if (absl::Status s = WriteFileAtomically(path, text); !s.ok()) return s;
    result.files.push_back(path);
  }
  if (keep_generation) {
    const std::string path = (fs::path(options.out) / "generation_config.json").string();
    if (absl::Status s = CopyFile(source_generation.string(), path); !s.ok()) return s;
    result.files.push_back(path);
  }
  if (absl::Status s = RemoveStaleWeights(options.out, result.files); !s.ok()) return s;
  if (!options.tokenizer.empty()) {
    const bool json = fs::path(options.tokenizer).extension() == ".json";  // a tokenizer.json keeps its name
    const std::string path = (fs::path(options.out) / (json ? "tokenizer.json" : "tokenizer.model")).string();
    if (absl::Status s = CopyFile(options.tokenizer, path); !s.ok()) return s;
    result.files.push_back(path);
    // The tokenizer's special tokens (bos_token, eos_token, add_bos_token) and chat template live in the files beside
    // it (transformers 5 writes the template to chat_template.jinja): carried when present, so that AutoTokenizer
    // knows them. A tokenizer.model's directory may hold its tokenizer.json too (the hub's Llama 2 / Mistral layout),
    // which AutoTokenizer reads first (without it, it converts the SentencePiece model, which needs protobuf).
    for (const char* sidecar : {"tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                                "chat_template.json", "tokenizer.json"}) {
      const fs::path from = fs::path(options.tokenizer).parent_path() / sidecar;
      std::error_code ec;
      if ((json && std::string(sidecar) == "tokenizer.json") || !fs::is_regular_file(from, ec)) continue;
      const std::string to = (fs::path(options.out) / sidecar).string();
      if (absl::Status s = CopyFile(from.string(), to); !s.ok()) return s;
      result.files.push_back(to);
    }
  }
  return result;
}

}  // namespace diloco
