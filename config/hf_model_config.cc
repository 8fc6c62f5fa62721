#include "config/hf_model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

using json = nlohmann::json;

// Reads config.json values with transformers' defaults for absent (or null) keys; remembers the first error.
class Reader {
 public:
  Reader(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  int64_t Int(const char* key, int64_t fallback) {
    if (!Present(key)) return fallback;
    if (!j_[key].is_number_integer()) return Fail(key, "an integer"), fallback;
    return j_[key].get<int64_t>();
  }
  double Number(const char* key, double fallback) {
    if (!Present(key)) return fallback;
    if (!j_[key].is_number()) return Fail(key, "a number"), fallback;
    return j_[key].get<double>();
  }
  bool Bool(const char* key, bool fallback) {
    if (!Present(key)) return fallback;
    if (!j_[key].is_boolean()) return Fail(key, "true or false"), fallback;
    return j_[key].get<bool>();
  }
  std::string String(const char* key, const std::string& fallback) {
    if (!Present(key)) return fallback;
    if (!j_[key].is_string()) return Fail(key, "a string"), fallback;
    return j_[key].get<std::string>();
  }
  // bos/eos: an integer, a list of them (the first is taken) or null (none); ids outside [0, vocab) are none.
  int64_t TokenId(const char* key, int64_t fallback, int64_t vocab) {
    int64_t id = fallback;
    if (j_.contains(key)) {
      const json& v = j_[key];
      if (v.is_array() && !v.empty() && v[0].is_number_integer()) {
        id = v[0].get<int64_t>();
      } else if (v.is_number_integer()) {
        id = v.get<int64_t>();
      } else if (v.is_null() || (v.is_array() && v.empty())) {
        id = -1;
      } else {
        Fail(key, "an integer, a list of integers or null");
      }
    }
    return id >= 0 && id < vocab ? id : -1;
  }
  // `key` must equal `want` (a feature we do not implement otherwise).
  void Require(const char* key, const json& want, const std::string& why) {
    if (!Present(key) || j_[key] == want) return;
    Error(absl::StrCat(key, " is ", j_[key].dump(), "; only ", want.dump(), " is supported (", why, ")"));
  }
  bool Present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const json& operator[](const char* key) const { return j_[key]; }
  void Fail(const char* key, const char* expected) {
    Error(absl::StrCat(key, ": expected ", expected, ", got ", j_[key].dump()));
  }
  void Error(const std::string& what) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(absl::StrCat(origin_, ": ", what));
  }
  const absl::Status& status() const { return status_; }

 private:
  const json& j_;
  std::string origin_;
  absl::Status status_;
};

// The dtype of the stored weights: 5.x "dtype", 4.x "torch_dtype".
std::string Dtype(Reader& r) { return r.String("dtype", r.String("torch_dtype", "")); }

// A number of the rope dict `p` (`key` absent or null: `fallback`).
double RopeNumber(Reader& r, const json& p, const char* key, double fallback) {
  if (!p.contains(key) || p[key].is_null()) return fallback;
  if (!p[key].is_number()) r.Error(absl::StrCat("rope ", key, ": expected a number, got ", p[key].dump()));
  return p[key].is_number() ? p[key].get<double>() : fallback;
}

// YaRN's mscale: 0.1 k ln(factor) + 1 (1 for factor <= 1).
double YarnMscale(double factor, double k) { return factor <= 1 ? 1.0 : 0.1 * k * std::log(factor) + 1.0; }

// The rope dict's scaling keys for m.rope_type (worker/lm/rope.h), transformers' defaults where absent. For llama3
// and yarn a top-level original_max_position_embeddings (Phi-3's layout) wins over the dict's, as in transformers 5.
void ReadRopeScaling(Reader& r, const json& j, const json& p, ModelConfig& m) {
  m.rope_factor = RopeNumber(r, p, "factor", 1.0);
  const bool top_level_original = (m.rope_type == RopeType::kLlama3 || m.rope_type == RopeType::kYarn) &&
                                  r.Present("original_max_position_embeddings");
  m.rope_original_max_positions = static_cast<int64_t>(RopeNumber(
      r, top_level_original ? j : p, "original_max_position_embeddings", static_cast<double>(m.MaxPositions())));
  if (m.rope_original_max_positions == m.MaxPositions()) m.rope_original_max_positions = 0;
  if (m.rope_type == RopeType::kLlama3) {
    m.rope_low_freq_factor = RopeNumber(r, p, "low_freq_factor", 1.0);
    m.rope_high_freq_factor = RopeNumber(r, p, "high_freq_factor", 4.0);
  }
  if (m.rope_type != RopeType::kYarn) return;
  if (!p.contains("factor") || p["factor"].is_null()) {
    m.rope_factor = static_cast<double>(m.MaxPositions()) / static_cast<double>(m.RopeOriginalMaxPositions());
  }
  const double ms = RopeNumber(r, p, "mscale", 0), ms_all = RopeNumber(r, p, "mscale_all_dim", 0);
  const double derived =
      ms != 0 && ms_all != 0 ? YarnMscale(m.rope_factor, ms) / YarnMscale(m.rope_factor, ms_all) : 0.0;
  m.rope_attention_factor = RopeNumber(r, p, "attention_factor", derived);
  m.rope_beta_fast = RopeNumber(r, p, "beta_fast", 32);
  m.rope_beta_slow = RopeNumber(r, p, "beta_slow", 1);
  if (p.contains("truncate") && p["truncate"] != json(true)) {
    r.Error(absl::StrCat("rope truncate is ", p["truncate"].dump(), "; only true (the default) is supported"));
  }
}

// One rope dict `p` (`key` of config.json `j`) read into `m`: its type ("rope_type" or 4.x "type"; absent: default),
// its rope_theta (absent: the top-level one, else 10000) and its scaling keys.
void ReadRopeDict(Reader& r, const json& j, const char* key, const json& p, ModelConfig& m) {
  if (!p.is_object()) return r.Error(absl::StrCat(key, ": expected an object or null, got ", p.dump()));
  m.rope_theta = RopeNumber(r, p, "rope_theta", r.Number("rope_theta", 10000.0));
  std::string type = "default";
  for (const char* type_key : {"type", "rope_type"}) {
    if (p.contains(type_key) && p[type_key].is_string()) type = p[type_key].get<std::string>();
  }
  if (!EnumFromName(type, &m.rope_type)) {
    return r.Error(
        absl::StrCat("rope type '", type, "' is not supported (supported: default, linear, llama3, yarn, dynamic)"));
  }
  if (RopeNumber(r, p, "partial_rotary_factor", 1.0) != 1.0) {
    return r.Error("rope partial_rotary_factor other than 1 is not supported");
  }
  ReadRopeScaling(r, j, p, m);
}

// What of the rope two readings disagree on ("" when nothing).
std::string RopeDifference(const ModelConfig& a, const ModelConfig& b) {
  const std::vector<std::tuple<const char*, double, double>> numbers = {
      {"rope_theta", a.rope_theta, b.rope_theta},
      {"factor", a.rope_factor, b.rope_factor},
      {"low_freq_factor", a.rope_low_freq_factor, b.rope_low_freq_factor},
      {"high_freq_factor", a.rope_high_freq_factor, b.rope_high_freq_factor},
      {"original_max_position_embeddings", static_cast<double>(a.RopeOriginalMaxPositions()),
       static_cast<double>(b.RopeOriginalMaxPositions())},
      {"attention_factor", a.rope_attention_factor, b.rope_attention_factor},
      {"beta_fast", a.rope_beta_fast, b.rope_beta_fast},
      {"beta_slow", a.rope_beta_slow, b.rope_beta_slow}};
  if (a.rope_type != b.rope_type) {
    return absl::StrCat("rope type ", std::string(EnumName(a.rope_type)), " against ",
                        std::string(EnumName(b.rope_type)));
  }
  for (const auto& [name, x, y] : numbers) {
    if (x != y) return absl::StrCat(name, " ", x, " against ", y);
  }
  return "";
}

// rope_theta and the rope scaling: 5.x rope_parameters {rope_theta, rope_type, ...}; 4.x top-level rope_theta and
// rope_scaling (null, or {"rope_type" or "type": ..., ...}). Types default, linear, llama3, yarn and dynamic; any
// other is refused naming it. Reads after max_positions (the default of original_max_position_embeddings). With both
// dicts (our export writes both, alike), transformers 5 reads rope_scaling alone with the top-level rope_theta: a
// config.json whose two dicts mean different ropes (rope_scaling added by hand to a 5.x config, whose rope_theta
// then silently becomes 10000 in transformers) is refused, naming the difference.
void ReadRope(Reader& r, const json& j, ModelConfig& m) {
  m.rope_theta = r.Number("rope_theta", 10000.0);
  m.rope_type = RopeType::kDefault;
  if (!r.Present("rope_scaling") && !r.Present("rope_parameters")) return;
  if (!r.Present("rope_parameters")) return ReadRopeDict(r, j, "rope_scaling", j["rope_scaling"], m);
  ReadRopeDict(r, j, "rope_parameters", j["rope_parameters"], m);
  if (!r.Present("rope_scaling") || !r.status().ok()) return;
  ModelConfig scaling = m;
  ReadRopeDict(r, j, "rope_scaling", j["rope_scaling"], scaling);
  const std::string difference = RopeDifference(scaling, m);
  if (r.status().ok() && !difference.empty()) {
    r.Error(absl::StrCat("rope_scaling and rope_parameters describe different ropes (", difference,
                         "); transformers 5 reads rope_scaling with the top-level rope_theta (10000 when absent): "
                         "keep one of the two"));
  }
}

const std::vector<std::string> kLlamaKeys = {"model.arch",
                                             "model.vocab_size",
                                             "model.n_layer",
                                             "model.n_head",
                                             "model.d_model",
                                             "model.n_kv_head",
                                             "model.ffn_hidden",
                                             "model.max_positions",
                                             "model.rope_theta",
                                             "model.norm_eps",
                                             "model.tie_embeddings",
                                             "model.bos_token_id",
                                             "model.eos_token_id",
                                             "model.head_dim",
                                             "model.rope_type",
                                             "model.rope_factor",
                                             "model.rope_low_freq_factor",
                                             "model.rope_high_freq_factor",
                                             "model.rope_original_max_positions",
                                             "model.rope_attention_factor",
                                             "model.rope_beta_fast",
                                             "model.rope_beta_slow",
                                             "model.sliding_window"};
const std::vector<std::string> kGpt2Keys = {"model.arch",          "model.vocab_size",  "model.n_layer",
                                            "model.n_head",        "model.d_model",     "model.ffn_hidden",
                                            "model.max_positions", "model.norm_eps",    "model.tie_embeddings",
                                            "model.bos_token_id",  "model.eos_token_id"};

// A llama-shaped family: its model_type, class and transformers 5.25 config defaults for absent keys.
struct LlamaFamily {
  ModelArch arch;
  const char* model_type;
  const char* class_name;
  int64_t vocab_size, hidden_size, intermediate_size, max_positions;
  int64_t num_key_value_heads;  // when absent (0: num_attention_heads); null is num_attention_heads in every family
  int64_t head_dim;             // 0: hidden_size / num_attention_heads
  int64_t bos, eos;             // -1: none
};

constexpr LlamaFamily kLlamaFamilies[] = {
    {ModelArch::kLlama, "llama", "LlamaForCausalLM", 32000, 4096, 11008, 2048, 0, 0, 1, 2},
    {ModelArch::kMistral, "mistral", "MistralForCausalLM", 32000, 4096, 14336, 131072, 8, 0, 1, 2},
    {ModelArch::kQwen2, "qwen2", "Qwen2ForCausalLM", 151936, 4096, 22016, 32768, 32, 0, -1, -1},
    {ModelArch::kQwen3, "qwen3", "Qwen3ForCausalLM", 151936, 4096, 22016, 32768, 32, 128, -1, -1},
};

const LlamaFamily* FindFamily(ModelArch arch) {
  for (const LlamaFamily& f : kLlamaFamilies) {
    if (f.arch == arch) return &f;
  }
  return nullptr;
}

// Sliding-window attention: mistral's sliding_window (null: none; a window at least the context is none too);
// qwen2 and qwen3 only with no layer of it. Their layers are as transformers 5.25 lays them out: layer_types when
// given, else "sliding_attention" from layer max_window_layers (default 28) on when use_sliding_window (default
// false) and sliding_window (default 4096) is not null; so use_sliding_window with max_window_layers >= the layers
// is full attention throughout, and is read.
void ReadSlidingWindow(Reader& r, const json& j, ModelConfig& m) {
  if (m.arch == ModelArch::kMistral) {
    m.sliding_window =
        j.contains("sliding_window") && j["sliding_window"].is_null() ? 0 : r.Int("sliding_window", 4096);
    if (m.sliding_window >= m.MaxPositions()) m.sliding_window = 0;
    return;
  }
  int64_t sliding_layers = 0;
  if (r.Present("layer_types")) {
    if (!j["layer_types"].is_array()) return r.Fail("layer_types", "a list");
    for (const json& t : j["layer_types"]) sliding_layers += t == json("sliding_attention") ? 1 : 0;
  } else {
    const bool window =
        r.Bool("use_sliding_window", false) && !(j.contains("sliding_window") && j["sliding_window"].is_null());
    const int64_t first = r.Int("max_window_layers", 28);
    if (window) sliding_layers = std::max<int64_t>(0, m.n_layer - std::max<int64_t>(0, first));
  }
  if (sliding_layers > 0) {
    r.Error(absl::StrCat(sliding_layers, " of ", m.n_layer,
                         " layers use sliding-window attention (use_sliding_window, ",
                         "max_window_layers, layer_types); only mistral's window is supported"));
  }
}

void ReadLlamaFamily(Reader& r, const json& j, const LlamaFamily& f, HfModelConfig& out) {
  ModelConfig& m = out.model;
  m.arch = f.arch;
  m.vocab_size = r.Int("vocab_size", f.vocab_size);
  m.d_model = r.Int("hidden_size", f.hidden_size);
  m.n_layer = r.Int("num_hidden_layers", 32);
  m.n_head = r.Int("num_attention_heads", 32);
  m.n_kv_head = j.contains("num_key_value_heads") && j["num_key_value_heads"].is_null()
                    ? m.n_head
                    : r.Int("num_key_value_heads", f.num_key_value_heads > 0 ? f.num_key_value_heads : m.n_head);
  m.ffn_hidden = r.Int("intermediate_size", f.intermediate_size);
  m.max_positions = r.Int("max_position_embeddings", f.max_positions);
  m.norm_eps = r.Number("rms_norm_eps", 1e-6);
  m.tie_embeddings = r.Bool("tie_word_embeddings", false);
  ReadRope(r, j, m);
  m.bos_token_id = r.TokenId("bos_token_id", f.bos, m.vocab_size);
  m.eos_token_id = r.TokenId("eos_token_id", f.eos, m.vocab_size);
  // head_dim: kept 0 when it is d_model / n_head (the keys of a llama without head_dim stay as they were).
  const bool divisible = m.n_head > 0 && m.d_model % m.n_head == 0;
  const int64_t derived = m.n_head > 0 ? m.d_model / m.n_head : 0;
  const int64_t head_dim = r.Int("head_dim", f.head_dim > 0 ? f.head_dim : derived);
  m.head_dim = divisible && head_dim == derived ? 0 : head_dim;
  ReadSlidingWindow(r, j, m);
  // Only llama and qwen3 read attention_bias (mistral has none, qwen2 its q/k/v biases whatever the key says), and
  // only llama mlp_bias.
  if (f.arch == ModelArch::kLlama || f.arch == ModelArch::kQwen3) {
    r.Require("attention_bias", false, "no attention biases but qwen2's q/k/v");
  }
  if (f.arch == ModelArch::kLlama) r.Require("mlp_bias", false, "an MLP without biases");
  r.Require("hidden_act", "silu", "SwiGLU with SiLU");
  out.keys = kLlamaKeys;
}

// GPT2Config (transformers 5.25) defaults for absent keys.
void ReadGpt2(Reader& r, HfModelConfig& out) {
  ModelConfig& m = out.model;
  m.arch = ModelArch::kGpt2;
  m.vocab_size = r.Int("vocab_size", 50257);
  m.d_model = r.Int("n_embd", 768);
  m.n_layer = r.Int("n_layer", 12);
  m.n_head = r.Int("n_head", 12);
  m.ffn_hidden = r.Int("n_inner", 4 * m.d_model);  // null: 4 x n_embd
  m.max_positions = r.Int("n_positions", 1024);
  m.norm_eps = r.Number("layer_norm_epsilon", 1e-5);
  m.tie_embeddings = r.Bool("tie_word_embeddings", true);
  m.bos_token_id = r.TokenId("bos_token_id", 50256, m.vocab_size);
  m.eos_token_id = r.TokenId("eos_token_id", 50256, m.vocab_size);
  r.Require("activation_function", "gelu_new", "GPT-2's tanh GELU; a diloco gpt export ('gelu') is not read back");
  r.Require("tie_word_embeddings", true, "GPT-2 ties its head");
  r.Require("scale_attn_weights", true, "attention scaled by 1/sqrt(head size)");
  r.Require("scale_attn_by_inverse_layer_idx", false, "plain GPT-2 attention");
  r.Require("reorder_and_upcast_attn", false, "plain GPT-2 attention");
  r.Require("add_cross_attention", false, "a decoder-only model");
  out.keys = kGpt2Keys;
}

}  // namespace

absl::StatusOr<HfModelConfig> ParseHfModelConfig(const json& j, const std::string& origin) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(origin, ": expected a JSON object"));
  Reader r(j, origin);
  const std::string type = r.String("model_type", "");
  HfModelConfig out;
  out.dtype = Dtype(r);
  const LlamaFamily* family = nullptr;
  for (const LlamaFamily& f : kLlamaFamilies) {
    if (type == f.model_type) family = &f;
  }
  if (family != nullptr) {
    ReadLlamaFamily(r, j, *family, out);
  } else if (type == "gpt2") {
    ReadGpt2(r, out);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": model_type '", type,
                     "' is not supported (supported: 'llama' for LlamaForCausalLM, 'mistral' for MistralForCausalLM, ",
                     "'qwen2' for Qwen2ForCausalLM, 'qwen3' for Qwen3ForCausalLM, 'gpt2' for GPT2LMHeadModel)"));
  }
  if (!r.status().ok()) return r.status();
  for (const char* key : {"attention_dropout", "attn_pdrop", "embd_pdrop", "resid_pdrop"}) {
    const auto it = j.find(key);
    if (it != j.end() && it->is_number() && it->get<double>() != 0) {
      out.not_applied.push_back(absl::StrCat(key, " ", it->get<double>()));
    }
  }
  return out;
}

absl::StatusOr<HfModelConfig> ReadHfModelConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read (a Hugging Face model directory has one)"));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return ParseHfModelConfig(j, path);
}

bool IsHfModelDir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) &&
         std::filesystem::is_regular_file(std::filesystem::path(path) / "config.json", ec);
}

namespace {

// eos_token_id as written: the model's id first, then the other stop ids (a list when there is more than one), else
// the model's one id (null: none). Read back, the list's first is model.eos_token_id again.
json EosJson(const ModelConfig& m, const std::vector<int64_t>& eos_ids) {
  std::vector<int64_t> ids;
  if (m.eos_token_id >= 0) ids.push_back(m.eos_token_id);
  for (int64_t id : eos_ids) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  if (ids.size() > 1) return json(ids);
  return ids.empty() ? json(nullptr) : json(ids[0]);
}

void PutTokenIds(const ModelConfig& m, const std::vector<int64_t>& eos_ids, nlohmann::ordered_json& j) {
  j["bos_token_id"] = m.bos_token_id >= 0 ? json(m.bos_token_id) : json(nullptr);
  j["eos_token_id"] = EosJson(m, eos_ids);
}

// The integer ids under `key` of the JSON file at `path` (an id or a list of ids; anything else: none).
void AppendIds(const std::filesystem::path& path, const char* key, int64_t vocab, std::vector<int64_t>& out) {
  std::ifstream in(path);
  if (!in) return;
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);  // not JSON: discarded, not an object
  if (!j.is_object() || !j.contains(key)) return;
  const json v = j.at(key).is_array() ? j.at(key) : json::array({j.at(key)});
  for (const json& id : v) {
    if (!id.is_number_integer()) continue;
    const auto n = id.get<int64_t>();
    if (n >= 0 && n < vocab && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
}

// The rope dict of `m` (transformers' rope_parameters; rope_theta added by the caller where the layout wants it).
nlohmann::ordered_json RopeJson(const ModelConfig& m) {
  nlohmann::ordered_json p;
  p["rope_type"] = std::string(EnumName(m.rope_type));
  if (m.rope_type == RopeType::kDefault) return p;
  p["factor"] = m.rope_factor;
  if (m.rope_type == RopeType::kLinear || m.rope_type == RopeType::kDynamic) return p;
  p["original_max_position_embeddings"] = m.RopeOriginalMaxPositions();
  if (m.rope_type == RopeType::kLlama3) {
    p["low_freq_factor"] = m.rope_low_freq_factor;
    p["high_freq_factor"] = m.rope_high_freq_factor;
  } else {  // yarn
    if (m.rope_attention_factor > 0) p["attention_factor"] = m.rope_attention_factor;
    p["beta_fast"] = m.rope_beta_fast;
    p["beta_slow"] = m.rope_beta_slow;
  }
  return p;
}

void PutLlamaFamily(const ModelConfig& m, nlohmann::ordered_json& j) {
  const LlamaFamily& f = *FindFamily(m.arch);
  j["architectures"] = {f.class_name};
  j["model_type"] = f.model_type;
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = m.FfnHidden();
  j["num_hidden_layers"] = m.n_layer;
  j["num_attention_heads"] = m.n_head;
  j["num_key_value_heads"] = m.KvHeads();
  j["head_dim"] = m.HeadDim();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.MaxPositions();
  j["rms_norm_eps"] = m.norm_eps;
  nlohmann::ordered_json rope = RopeJson(m);
  j["rope_theta"] = m.rope_theta;                                                           // 4.x
  j["rope_scaling"] = m.rope_type == RopeType::kDefault ? nlohmann::ordered_json() : rope;  // 4.x
  rope["rope_theta"] = m.rope_theta;
  j["rope_parameters"] = rope;  // 5.x
  if (m.arch != ModelArch::kQwen2) j["attention_bias"] = false;
  j["mlp_bias"] = false;
  if (m.arch == ModelArch::kMistral) {
    j["sliding_window"] = m.sliding_window > 0 ? json(m.sliding_window) : json(nullptr);
  } else if (m.arch != ModelArch::kLlama) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  j["tie_word_embeddings"] = m.tie_embeddings;
}

}  // namespace

std::vector<int64_t> HfStopTokenIds(const std::string& dir, int64_t vocab_size) {
  std::vector<int64_t> ids;
  if (!IsHfModelDir(dir)) return ids;
  const std::filesystem::path generation = std::filesystem::path(dir) / "generation_config.json";
  std::error_code ec;
  AppendIds(std::filesystem::exists(generation, ec) ? generation : std::filesystem::path(dir) / "config.json",
            "eos_token_id", vocab_size, ids);
  return ids;
}

nlohmann::ordered_json HfConfigJson(const ModelConfig& m, const std::string& dtype,
                                    const std::string& transformers_version, const std::vector<int64_t>& eos_ids) {
  nlohmann::ordered_json j;
  if (m.LlamaShaped()) {
    PutLlamaFamily(m, j);
  } else {  // gpt2, and our gpt as a GPT2LMHeadModel with the exact (erf) GELU
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = m.vocab_size;
    j["n_embd"] = m.d_model;
    j["n_layer"] = m.n_layer;
    j["n_head"] = m.n_head;
    j["n_inner"] = m.FfnHidden();
    j["n_positions"] = m.MaxPositions();
    j["activation_function"] = m.arch == ModelArch::kGpt ? "gelu" : "gelu_new";
    j["layer_norm_epsilon"] = m.arch == ModelArch::kGpt ? 1e-5 : m.norm_eps;
    j["tie_word_embeddings"] = true;
    for (const char* dropout : {"attn_pdrop", "embd_pdrop", "resid_pdrop"}) j[dropout] = 0.0;
  }
  PutTokenIds(m, eos_ids, j);
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = dtype;  // 4.x
  j["dtype"] = dtype;        // 5.x
  j["transformers_version"] = transformers_version;
  return j;
}

nlohmann::ordered_json HfGenerationConfigJson(const ModelConfig& m, const std::string& transformers_version,
                                              const std::vector<int64_t>& eos_ids) {
  nlohmann::ordered_json j;
  j["_from_model_config"] = true;
  if (m.bos_token_id >= 0) j["bos_token_id"] = m.bos_token_id;
  if (m.eos_token_id >= 0 || !eos_ids.empty()) j["eos_token_id"] = EosJson(m, eos_ids);
  j["transformers_version"] = transformers_version;
  return j;
}

}  // namespace diloco
