#include "config/hf_model_config.h"

#include <filesystem>
#include <fstream>

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

// rope_theta and the rope type: 5.x rope_parameters {rope_theta, rope_type}; 4.x top-level rope_theta and
// rope_scaling (null, or {"rope_type" or "type": ...}). Only the plain rotary embedding ("default") is implemented.
double RopeTheta(Reader& r, const json& j) {
  double theta = r.Number("rope_theta", 10000.0);
  std::string type = "default";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!r.Present(key)) continue;
    const json& p = j[key];
    if (!p.is_object()) {
      r.Error(absl::StrCat(key, ": expected an object or null, got ", p.dump()));
      return theta;
    }
    if (p.contains("rope_theta") && p["rope_theta"].is_number()) theta = p["rope_theta"].get<double>();
    for (const char* type_key : {"rope_type", "type"}) {
      if (p.contains(type_key) && p[type_key].is_string()) type = p[type_key].get<std::string>();
    }
  }
  if (type != "default") {
    r.Error(absl::StrCat("rope type '", type, "' (rope scaling) is not supported; only 'default' (plain rotary ",
                         "embedding with rope_theta)"));
  }
  return theta;
}

const std::vector<std::string> kLlamaKeys = {
    "model.arch",           "model.vocab_size",   "model.n_layer",       "model.n_head",     "model.d_model",
    "model.n_kv_head",      "model.ffn_hidden",   "model.max_positions", "model.rope_theta", "model.norm_eps",
    "model.tie_embeddings", "model.bos_token_id", "model.eos_token_id"};
const std::vector<std::string> kGpt2Keys = {"model.arch",          "model.vocab_size",  "model.n_layer",
                                            "model.n_head",        "model.d_model",     "model.ffn_hidden",
                                            "model.max_positions", "model.norm_eps",    "model.tie_embeddings",
                                            "model.bos_token_id",  "model.eos_token_id"};

// LlamaConfig (transformers 5.25) defaults for absent keys.
void ReadLlama(Reader& r, const json& j, HfModelConfig& out) {
  ModelConfig& m = out.model;
  m.arch = ModelArch::kLlama;
  m.vocab_size = r.Int("vocab_size", 32000);
  m.d_model = r.Int("hidden_size", 4096);
  m.n_layer = r.Int("num_hidden_layers", 32);
  m.n_head = r.Int("num_attention_heads", 32);
  m.n_kv_head = r.Int("num_key_value_heads", m.n_head);
  m.ffn_hidden = r.Int("intermediate_size", 11008);
  m.max_positions = r.Int("max_position_embeddings", 2048);
  m.norm_eps = r.Number("rms_norm_eps", 1e-6);
  m.tie_embeddings = r.Bool("tie_word_embeddings", false);
  m.rope_theta = RopeTheta(r, j);
  m.bos_token_id = r.TokenId("bos_token_id", 1, m.vocab_size);
  m.eos_token_id = r.TokenId("eos_token_id", 2, m.vocab_size);
  if (m.n_head > 0 && r.Present("head_dim") && r.Int("head_dim", 0) != m.d_model / m.n_head) {
    r.Error(absl::StrCat("head_dim ", r.Int("head_dim", 0), " is not hidden_size / num_attention_heads (",
                         m.d_model / m.n_head, "); only that head size is supported"));
  }
  r.Require("attention_bias", false, "llama without biases");
  r.Require("mlp_bias", false, "llama without biases");
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
  if (type == "llama") {
    ReadLlama(r, j, out);
  } else if (type == "gpt2") {
    ReadGpt2(r, out);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": model_type '", type,
                                                   "' is not supported (supported: 'llama' for LlamaForCausalLM, ",
                                                   "'gpt2' for GPT2LMHeadModel)"));
  }
  if (!r.status().ok()) return r.status();
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

void PutTokenIds(const ModelConfig& m, nlohmann::ordered_json& j) {
  j["bos_token_id"] = m.bos_token_id >= 0 ? json(m.bos_token_id) : json(nullptr);
  j["eos_token_id"] = m.eos_token_id >= 0 ? json(m.eos_token_id) : json(nullptr);
}

}  // namespace

nlohmann::ordered_json HfConfigJson(const ModelConfig& m, const std::string& dtype,
                                    const std::string& transformers_version) {
  nlohmann::ordered_json j;
  if (m.arch == ModelArch::kLlama) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = m.vocab_size;
    j["hidden_size"] = m.d_model;
    j["intermediate_size"] = m.FfnHidden();
    j["num_hidden_layers"] = m.n_layer;
    j["num_attention_heads"] = m.n_head;
    j["num_key_value_heads"] = m.KvHeads();
    j["head_dim"] = m.d_model / m.n_head;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = m.MaxPositions();
    j["rms_norm_eps"] = m.norm_eps;
    j["rope_theta"] = m.rope_theta;                                                   // 4.x
    j["rope_scaling"] = nullptr;                                                      // 4.x
    j["rope_parameters"] = {{"rope_theta", m.rope_theta}, {"rope_type", "default"}};  // 5.x
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["tie_word_embeddings"] = m.tie_embeddings;
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
  PutTokenIds(m, j);
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = dtype;  // 4.x
  j["dtype"] = dtype;        // 5.x
  j["transformers_version"] = transformers_version;
  return j;
}

nlohmann::ordered_json HfGenerationConfigJson(const ModelConfig& m, const std::string& transformers_version) {
  nlohmann::ordered_json j;
  j["_from_model_config"] = true;
  if (m.bos_token_id >= 0) j["bos_token_id"] = m.bos_token_id;
  if (m.eos_token_id >= 0) j["eos_token_id"] = m.eos_token_id;
  j["transformers_version"] = transformers_version;
  return j;
}

}  // namespace diloco
