#include "worker/lm/hf_weights.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/lm/safetensors.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ShapeText(const torch::Tensor& t) { return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]"); }

absl::Status AddShard(const std::string& path, HfWeights& out) {
  auto tensors = ReadSafetensors(path);
  if (!tensors.ok()) return tensors.status();
  for (auto& [name, t] : *tensors) {
    if (!out.emplace(name, std::move(t)).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is stored in two shards"));
    }
  }
  return absl::OkStatus();
}

// The shard files of index.json's weight_map (each once, in first-mention order), after checking its form.
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& index_path) {
  std::ifstream in(index_path);
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": not JSON with a \"weight_map\" object"));
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[\"", name, "\"] is not a file name"));
    }
    map[name] = file.get<std::string>();
  }
  return map;
}

absl::StatusOr<HfWeights> LoadSharded(const std::string& dir, const std::string& index_path) {
  auto map = ReadWeightMap(index_path);
  if (!map.ok()) return map.status();
  HfWeights out;
  std::set<std::string> files;
  for (const auto& [name, file] : *map) {
    if (!files.insert(file).second) continue;
    if (absl::Status s = AddShard((fs::path(dir) / file).string(), out); !s.ok()) return s;
  }
  for (const auto& [name, file] : *map) {
    if (out.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map lists '", name, "' in ", file, ", which does not hold it"));
    }
  }
  return out;
}

// Tensors a Hugging Face file may carry that are no parameters of ours.
bool IgnoredBuffer(const std::string& name) {
  return EndsWith(name, "rotary_emb.inv_freq") || EndsWith(name, ".attn.bias") || EndsWith(name, ".attn.masked_bias");
}

// The key under which `param` is stored: itself, or without the base-model prefix ("model.", "transformer.").
const torch::Tensor* Find(const HfWeights& weights, const std::string& param, std::string& key) {
  key = param;
  if (auto it = weights.find(key); it != weights.end()) return &it->second;
  for (const std::string prefix : {"model.", "transformer."}) {
    if (param.compare(0, prefix.size(), prefix) != 0) continue;
    key = param.substr(prefix.size());
    if (auto it = weights.find(key); it != weights.end()) return &it->second;
  }
  key = param;
  return nullptr;
}

// A tied model's file may still hold lm_head.weight (save_pretrained of a tied model does not, some exporters do):
// equal to the embedding, it is the same tensor and skipped. Different (a fine-tune that trained the head alone, with
// config.json still saying tied), transformers 4.x ties it to the embedding and 5.x keeps the file's head: rather
// than pick one in silence, the load stops and says how to choose.
absl::Status CheckTiedHead(const torch::Tensor& head, const torch::OrderedDict<std::string, torch::Tensor>& params,
                           const std::string& dir, bool can_untie) {
  for (const auto& p : params) {
    const std::string& name = p.key();
    if (!absl::EndsWith(name, "embed_tokens.weight") && !absl::EndsWith(name, "wte.weight") &&
        name != "tok_emb.weight") {
      continue;
    }
    if (head.sizes().equals(p.value().sizes()) && torch::equal(head.to(p.value().dtype()), p.value())) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": config.json ties the head to the embedding (tie_word_embeddings), but the file's lm_head.weight ",
        "differs from ", p.key(), " (transformers 4.x would use the embedding, 5.x the file's head): ",
        can_untie ? "set tie_word_embeddings to false in config.json to train the file's own head, or " : "",
        "remove lm_head.weight to tie them"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HfWeights> LoadHfWeights(const std::string& dir) {
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(single)) {
    HfWeights out;
    if (absl::Status s = AddShard(single, out); !s.ok()) return s;
    return out;
  }
  if (fs::exists(index)) return LoadSharded(dir, index);
  for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json"}) {
    if (fs::exists(fs::path(dir) / pickle)) {
      return absl::NotFoundError(absl::StrCat(
          dir, ": the weights are in ", pickle,
          ", which is not read (a pickle file runs code when loaded); convert them ",
          "to safetensors: transformers' AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR) writes ",
          "model.safetensors"));
    }
  }
  return absl::NotFoundError(
      absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json (a Hugging Face model directory?)"));
}

absl::Status CopyHfWeights(const HfWeights& weights, const std::string& dir, LanguageModel& model) {
  torch::NoGradGuard no_grad;
  std::set<std::string> used;
  auto params = model.named_parameters(/*recurse=*/true);
  for (auto& p : params) {
    std::string key;
    const torch::Tensor* value = Find(weights, p.key(), key);
    if (value == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": missing tensor '", p.key(), "' (shape ",
                                                     ShapeText(p.value()), ") that model.arch ",
                                                     std::string(EnumName(model.config().arch)), " needs"));
    }
    if (!value->sizes().equals(p.value().sizes())) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor '", key, "' has shape ", ShapeText(*value),
                                                     ", the model's '", p.key(), "' is ", ShapeText(p.value())));
    }
    p.value().copy_(*value);
    used.insert(key);
  }
  const bool tied = params.find("lm_head.weight") == nullptr;
  if (auto head = weights.find("lm_head.weight"); tied && head != weights.end()) {
    const bool can_untie = model.config().arch != ModelArch::kGpt2;  // model.arch gpt2 always ties (GPT-2's way)
    if (absl::Status s = CheckTiedHead(head->second, params, dir, can_untie); !s.ok()) return s;
  }
  std::vector<std::string> extra;
  for (const auto& [name, t] : weights) {
    if (used.count(name) > 0 || IgnoredBuffer(name) || (tied && name == "lm_head.weight")) continue;
    extra.push_back(name);
  }
  if (!extra.empty()) {
    const size_t shown = std::min<size_t>(extra.size(), 5);
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": ", extra.size(), " tensor(s) that model.arch ", std::string(EnumName(model.config().arch)),
                     " does not have: ", absl::StrJoin(extra.begin(), extra.begin() + shown, ", "),
                     extra.size() > shown ? ", ..." : ""));
  }
  return absl::OkStatus();
}

}  // namespace diloco
