#include "config/config_loader.h"

#include <xxhash.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/config_fields.h"
#include "config/hf_model_config.h"
#include "config/message_limit.h"
#include "config/model_rules.h"

namespace diloco {
namespace {

std::string KnownKeysOf(const std::string& section) {
  std::vector<std::string> keys;
  for (const Field& f : Fields()) {
    if (absl::StartsWith(f.key, section + ".")) keys.push_back(f.key.substr(section.size() + 1));
  }
  return absl::StrJoin(keys, ", ");
}

std::string KnownSections() {
  std::vector<std::string> sections;
  for (const Field& f : Fields()) {
    std::string s = f.key.substr(0, f.key.find('.'));
    if (sections.empty() || sections.back() != s) sections.push_back(s);
  }
  return absl::StrJoin(sections, ", ");
}

absl::Status UnknownKey(const std::string& origin, const std::string& key) {
  const std::string section = key.substr(0, key.find('.'));
  const std::string known = KnownKeysOf(section);
  if (known.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": unknown section '", section, "' (known sections: ", KnownSections(), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(origin, ": unknown key '", key, "' (known keys of ", section, ": ", known, ")"));
}

// The keys a document or an override set ("section.key"), for the merge with a Hugging Face config.json.
using SetKeys = std::set<std::string>;

absl::Status ApplyDocument(const YAML::Node& root, const std::string& origin, Config& config, SetKeys& set_keys) {
  if (!root || root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(origin, ": top level must be a map of sections"));
  // YAML forbids a key twice in one map; yaml-cpp keeps both and the later one won in silence (an edit that forgot
  // the older line). Line numbers are yaml-cpp's 0-based marks + 1.
  std::map<std::string, int> lines;  // "section" and "section.key" -> the line that set it
  auto once = [&](const std::string& key, const YAML::Node& node) -> absl::Status {
    const int line = node.Mark().line + 1;
    auto [it, first] = lines.emplace(key, line);
    if (first) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ":", line, ": '", key, "' is set twice (first on line ", it->second, ")"));
  };
  for (const auto& section : root) {
    const std::string name = section.first.as<std::string>();
    if (KnownKeysOf(name).empty()) return UnknownKey(origin, name);
    if (absl::Status s = once(name, section.first); !s.ok()) return s;
    if (section.second.IsNull()) continue;
    if (!section.second.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": section '", name, "' must be a map of keys"));
    }
    for (const auto& entry : section.second) {
      const std::string key = absl::StrCat(name, ".", entry.first.as<std::string>());
      const Field* field = FindField(key);
      if (field == nullptr) return UnknownKey(origin, key);
      if (absl::Status s = once(key, entry.first); !s.ok()) return s;
      absl::Status s = field->set(config, entry.second);
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", s.message()));
      set_keys.insert(key);
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyOverride(const std::string& override_text, Config& config, SetKeys& set_keys) {
  const size_t eq = override_text.find('=');
  if (eq == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", override_text, ": expected section.key=value, e.g. --set inner.lr=0.001"));
  }
  const std::string key = override_text.substr(0, eq);
  const std::string value = override_text.substr(eq + 1);
  const Field* field = FindField(key);
  if (field == nullptr) return UnknownKey(absl::StrCat("--set ", override_text), key);
  YAML::Node node;
  try {
    node = value.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Load(value);
  } catch (const YAML::Exception& e) {
    if (field->type != "string") {
      return absl::InvalidArgumentError(absl::StrCat("--set ", override_text, ": ", e.what()));
    }
    node = YAML::Node(value);
  }
  // A string key takes the text as written when YAML reads it as a list or map: an IPv6 address such as
  // coordinator.listen=[::1]:5000 needs no quotes on the command line.
  if (field->type == "string" && (node.IsSequence() || node.IsMap())) node = YAML::Node(value);
  absl::Status s = field->set(config, node);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--set ", override_text, ": ", s.message()));
  set_keys.insert(key);
  return absl::OkStatus();
}

// model.init_from names a Hugging Face directory: the model keys its config.json determines fill those the YAML and
// --set left unset; one they set to another value is an error naming both. model.seq_len (the training context, not a
// shape key) left unset becomes min(its default, max_positions). data.tokenizer left unset becomes the directory's
// SentencePiece tokenizer.model when it ships one, else its tokenizer.json.
// `m` with each key whose 0 stands for a value derived from others (ModelConfig's accessors) made explicit.
ModelConfig ExplicitModel(ModelConfig m) {
  m.n_kv_head = m.KvHeads();
  m.head_dim = m.HeadDim();
  m.ffn_hidden = m.FfnHidden();
  m.rope_original_max_positions = m.RopeOriginalMaxPositions();
  if (m.sliding_window >= m.MaxPositions()) m.sliding_window = 0;
  return m;
}

absl::Status MergeHfModelDir(Config& config, const SetKeys& set_keys) {
  const std::string& dir = config.model.init_from;
  auto hf = ReadHfModelConfig(dir);
  if (!hf.ok()) return absl::Status(hf.status().code(), absl::StrCat("model.init_from: ", hf.status().message()));
  Config from = config;
  from.model = hf->model;
  for (const std::string& key : hf->keys) {
    if (!set_keys.count(key)) FindField(key)->copy(config, from);
  }
  // A key the YAML sets must mean what config.json does, where a 0 stands for a derived value on either side
  // (head_dim 0: d_model / n_head; sliding_window 0 or >= max_positions: none).
  Config yaml_explicit = config, hf_explicit = from;
  yaml_explicit.model = ExplicitModel(config.model);
  hf_explicit.model = ExplicitModel(from.model);
  for (const std::string& key : hf->keys) {
    const Field* field = FindField(key);
    if (set_keys.count(key) && !field->equal(yaml_explicit, hf_explicit)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": the YAML says ", field->get(config), ", ", dir, "/config.json says ", field->get(from)));
    }
  }
  if (!set_keys.count("model.seq_len")) {
    config.model.seq_len = std::min(config.model.seq_len, config.model.MaxPositions());
  }
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    const std::string tokenizer = (std::filesystem::path(dir) / name).string();
    std::error_code ec;
    if (!set_keys.count("data.tokenizer") && std::filesystem::is_regular_file(tokenizer, ec)) {
      config.data.tokenizer = tokenizer;
      break;
    }
  }
  return absl::OkStatus();
}

// security.*: cert and key come together; every named file must be readable; the token file must hold a secret.
absl::Status ValidateSecurity(const SecurityConfig& c) {
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.tls_cert.empty() ? "security.tls_cert" : "security.tls_key", ": must be set together with ",
        c.tls_cert.empty() ? "security.tls_key" : "security.tls_cert", " (a PEM certificate and its private key)"));
  }
  for (auto [key, path] : std::vector<std::pair<const char*, std::string>>{{"security.tls_cert", c.tls_cert},
                                                                           {"security.tls_key", c.tls_key},
                                                                           {"security.tls_ca", c.tls_ca},
                                                                           {"security.token_file", c.token_file}}) {
    if (path.empty()) continue;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": cannot read '", path, "' (", std::strerror(errno), ")"));
    }
    if (std::string(key) != "security.token_file") continue;
    std::stringstream text;
    text << in.rdbuf();
    if (text.str().find_first_not_of(" \t\r\n") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": '", path, "' is empty; put the run's shared secret in it (e.g. openssl rand -hex 32)"));
    }
  }
  return absl::OkStatus();
}

// data.*: the inputs' keys that only make sense together.
absl::Status ValidateData(const DataConfig& d) {
  if (d.files.empty() && !d.val_files.empty()) {
    return absl::InvalidArgumentError("data.val_files: needs data.files (the training inputs in the same format)");
  }
  if (d.files.empty() && d.format != DataFormat::kText) {
    return absl::InvalidArgumentError(absl::StrCat("data.format: '", std::string(EnumName(d.format)),
                                                   "' applies to data.files, which is empty; list the inputs there"));
  }
  if (d.format == DataFormat::kJsonl && d.jsonl_field.empty()) {
    return absl::InvalidArgumentError("data.jsonl_field: must name the field holding each document's text");
  }
  std::error_code ec;
  if (!d.tokenizer.empty() && !std::filesystem::is_regular_file(d.tokenizer, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.tokenizer: '", d.tokenizer,
                     "' is not a file (a SentencePiece model or tokenizer.json; \"\" to train one)"));
  }
  return absl::OkStatus();
}

// inner.*: the micro-batch divides the batch.
absl::Status ValidateInner(const InnerConfig& i) {
  if (i.micro_batch_size > 0 && i.batch_size % i.micro_batch_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("inner.micro_batch_size (", i.micro_batch_size,
                                                   ") must divide inner.batch_size (", i.batch_size,
                                                   "); 0 = the whole batch at once"));
  }
  return absl::OkStatus();
}

// workers.sharding needs a cluster to shard over.
absl::Status ValidateWorkers(const WorkersConfig& w) {
  if (w.sharding != Sharding::kNone && w.cluster_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("workers.sharding '", std::string(EnumName(w.sharding)),
                                                   "' needs workers.cluster_size > 1 (got ", w.cluster_size,
                                                   "): there is no cluster to shard the inner step over"));
  }
  return absl::OkStatus();
}

// comm.* against the model, the inner steps, the outer mode, the gRPC quota and TLS.
absl::Status ValidateComm(const Config& c) {
  // The gRPC memory quota must hold two messages of the largest size or honest pushes would be reset
  // (coordinator/main.cc).
  const int64_t quota_mb = c.coordinator.grpc_memory_quota_mb;
  const int64_t message_mb = (MaxMessageBytes(c.comm.chunk_bytes) + (int64_t{1} << 20) - 1) >> 20;
  if (quota_mb > 0 && quota_mb < 2 * message_mb) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator.grpc_memory_quota_mb: ", quota_mb, " MiB cannot hold two messages of comm.chunk_bytes + 1 MiB (",
        message_mb, " MiB each); set at least ", 2 * message_mb, ", lower comm.chunk_bytes, or 0 (off)"));
  }
  if (c.comm.transport == PushTransport::kTcp && (!c.security.tls_cert.empty() || !c.security.tls_ca.empty())) {
    return absl::InvalidArgumentError(
        "comm.transport: 'tcp' sends pseudo-gradients unencrypted; it cannot be combined with security.tls_* "
        "(use 'grpc')");
  }
  if (c.comm.fragments > c.model.n_layer + 1) {  // blocks i -> i mod P; ln_f -> P-1: every fragment gets a tensor
    return absl::InvalidArgumentError(
        absl::StrCat("comm.fragments: at most model.n_layer + 1 (", c.model.n_layer + 1, "), got ", c.comm.fragments));
  }
  if (c.inner.steps % c.comm.fragments != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.fragments (", c.comm.fragments, ") must divide inner.steps (", c.inner.steps, ")"));
  }
  if (c.comm.overlap_steps > c.StepsPerSync()) {
    return absl::InvalidArgumentError(absl::StrCat("comm.overlap_steps: must be in [0, inner.steps / comm.fragments = ",
                                                   c.StepsPerSync(), "], got ", c.comm.overlap_steps));
  }
  if ((c.outer.mode == OuterMode::kAsync || c.inner.adaptive_steps) &&
      (c.comm.fragments != 1 || c.comm.overlap_steps != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.outer.mode == OuterMode::kAsync ? "outer.mode async" : "inner.adaptive_steps",
        " needs comm.fragments 1 and comm.overlap_steps 0 (Streaming DiLoCo rounds are fixed fragments of H)"));
  }
  if (c.comm.pull_codec == WireCodec::kTopk) {
    return absl::InvalidArgumentError(
        "comm.pull_codec: topk is for pushes only; pulls carry the dense theta "
        "(fp32, bf16, fp16, int8 or int4)");
  }
  if (c.comm.cluster_parts && c.workers.cluster_size > 1 &&
      (c.comm.fragments != 1 || c.comm.overlap_steps != 0 || c.outer.aggregation != Aggregation::kMean)) {
    return absl::InvalidArgumentError(
        "comm.cluster_parts needs comm.fragments 1, comm.overlap_steps 0 and outer.aggregation mean (each rank "
        "pushes its slice of the whole model once the round's training is over)");
  }
  if (c.comm.topk_per_chunk > c.comm.topk_chunk) {
    return absl::InvalidArgumentError(absl::StrCat("comm.topk_per_chunk (", c.comm.topk_per_chunk,
                                                   ") must be at most comm.topk_chunk (", c.comm.topk_chunk, ")"));
  }
  const bool coordinate_wise =
      c.outer.aggregation == Aggregation::kTrimmedMean || c.outer.aggregation == Aggregation::kCenteredClip;
  if (c.outer.aggregation == Aggregation::kClip && c.outer.mode == OuterMode::kAsync) {
    return absl::InvalidArgumentError(
        "outer.aggregation clip needs outer.mode sync: it clips each push against the medians of the round's other "
        "push headers, and an asynchronous version has one push (use mean, or sync rounds)");
  }
  if (coordinate_wise && (c.outer.mode == OuterMode::kAsync || c.comm.codec == WireCodec::kTopk)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "outer.aggregation ", std::string(EnumName(c.outer.aggregation)), " needs outer.mode sync and a dense ",
        "comm.codec (not topk): it reduces chunk s of every push of a round together"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> ParseConfig(const std::string& yaml_text, const std::string& origin,
                                   const std::vector<std::string>& overrides) {
  Config config;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": not valid YAML: ", e.what()));
  }
  SetKeys set_keys;
  absl::Status s;
  try {  // a key that is not a scalar ("? [a, b]") throws from its conversion to a name
    s = ApplyDocument(root, origin, config, set_keys);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": a key that is not a plain name (", e.what(), ")"));
  }
  if (!s.ok()) return s;
  std::map<std::string, std::string> overridden;  // key -> the --set that gave its value (the last one)
  for (const std::string& o : overrides) {
    s = ApplyOverride(o, config, set_keys);
    if (!s.ok()) return s;
    overridden[o.substr(0, o.find('='))] = o;
  }
  std::error_code ec;
  if (!config.model.init_from.empty() && std::filesystem::is_directory(config.model.init_from, ec)) {
    s = MergeHfModelDir(config, set_keys);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(origin, ": ", s.message()));
  }
  s = ValidateConfig(config);
  if (!s.ok()) {
    // The message starts with the key it is about: a value from --set is named as that --set, not as the file.
    const absl::string_view message = s.message();
    const auto set = overridden.find(std::string(message.substr(0, message.find(':'))));
    const std::string where = set != overridden.end() ? absl::StrCat("--set ", set->second) : origin;
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", message));
  }
  return config;
}

namespace {
// The text of a config file: an error naming it when it is a directory (an ifstream opens one and reads nothing: a
// bind mount of a missing file) or cannot be read.
absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file ", path, ": is a directory, not a YAML file (a bind mount of a missing file?)"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("config file ", path, ": cannot be read (", std::strerror(errno),
                                            "); pass an existing YAML file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

absl::StatusOr<SecurityConfig> LoadSecurityConfig(const std::string& path, const std::vector<std::string>& overrides) {
  auto text = ReadConfigFile(path);
  if (!text.ok()) return text.status();
  Config config;
  SetKeys set_keys;
  try {
    const YAML::Node root = YAML::Load(*text);
    if (root.IsMap() && root["security"]) {
      YAML::Node security;
      security["security"] = root["security"];
      if (absl::Status s = ApplyDocument(security, path, config, set_keys); !s.ok()) return s;
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid YAML: ", e.what()));
  }
  for (const std::string& o : overrides) {
    if (!absl::StartsWith(o, "security.")) continue;
    if (absl::Status s = ApplyOverride(o, config, set_keys); !s.ok()) return s;
  }
  if (absl::Status s = ValidateSecurity(config.security); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  return config.security;
}

absl::StatusOr<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  auto text = ReadConfigFile(path);
  if (!text.ok()) return text.status();
  try {
    const YAML::Node root = YAML::Load(*text);
    if (!root || root.IsNull()) {
      return absl::InvalidArgumentError(absl::StrCat("config file ", path, ": holds no settings (empty)"));
    }
  } catch (const YAML::Exception&) {
    // ParseConfig reports it, with the parser's words.
  }
  return ParseConfig(*text, path, overrides);
}

// Each key's own range first (so the cross-key rules may divide by the positive ones), then the cross-key and
// file-system checks.
absl::Status ValidateConfig(const Config& c) {
  for (const Field& f : Fields()) {
    if (absl::Status s = f.check(c); !s.ok()) return s;
  }
  if (absl::Status s = ValidateInner(c.inner); !s.ok()) return s;
  if (absl::Status s = ValidateWorkers(c.workers); !s.ok()) return s;
  if (c.coordinator.heartbeat_interval_s >= c.coordinator.lease_s) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator.heartbeat_interval_s (", c.coordinator.heartbeat_interval_s,
        ") must be below coordinator.lease_s (", c.coordinator.lease_s,
        "): a member silent for lease_s is marked lost, so every worker would be lost between two heartbeats"));
  }
  if (absl::Status s = ValidateModel(c.model); !s.ok()) return s;
  if (absl::Status s = ValidateData(c.data); !s.ok()) return s;
  if (absl::Status s = ValidateComm(c); !s.ok()) return s;
  return ValidateSecurity(c.security);
}

std::string RenderConfig(const Config& config) {
  std::string out;
  for (const Field& f : Fields()) absl::StrAppend(&out, f.key, ": ", f.get(config), "\n");
  return out;
}

std::string ConfigHash(const Config& config) {
  const std::string text = RenderConfig(config);
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(XXH64(text.data(), text.size(), 0)));
  return buf;
}

std::string RenderClusterConfig(const Config& config) {
  // Memory knobs that leave a step's result as it is (a rank with less memory may use them), and paths.
  static const std::set<std::string> kPerMachine = {"model.init_from", "model.activation_checkpointing",
                                                    "inner.micro_batch_size", "comm.tcp_port"};
  static const std::set<std::string> kShared = {"workers.cluster_size", "workers.sharding", "workers.check_replicas",
                                                "workers.precision", "workers.allow_tf32"};
  std::string out;
  for (const Field& f : Fields()) {
    const bool section =
        absl::StartsWith(f.key, "model.") || absl::StartsWith(f.key, "inner.") || absl::StartsWith(f.key, "comm.");
    if ((section && kPerMachine.count(f.key) == 0) || kShared.count(f.key) != 0) {
      absl::StrAppend(&out, f.key, ": ", f.get(config), "\n");
    }
  }
  return out;
}

std::string ConfigDifference(const std::string& mine, const std::string& theirs, const std::string& them) {
  // The "key: value" lines, in order.
  auto parse = [](const std::string& text) {
    std::vector<std::pair<std::string, std::string>> keys;
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      const size_t colon = line.find(": ");
      if (colon != absl::string_view::npos) keys.emplace_back(line.substr(0, colon), line.substr(colon + 2));
    }
    return keys;
  };
  const auto a = parse(mine), b = parse(theirs);
  const std::map<std::string, std::string> a_keys(a.begin(), a.end()), b_keys(b.begin(), b.end());
  std::vector<std::string> differing;
  for (const auto& [key, value] : a) {
    auto it = b_keys.find(key);
    if (it == b_keys.end()) {
      differing.push_back(absl::StrCat(key, " ", value, " where ", them, " has no such key"));
    } else if (it->second != value) {
      differing.push_back(absl::StrCat(key, " ", value, " where ", them, " has ", it->second));
    }
  }
  for (const auto& [key, value] : b) {
    if (a_keys.count(key) == 0) differing.push_back(absl::StrCat("no ", key, " where ", them, " has ", value));
  }
  if (differing.empty()) return "";
  std::string out = differing.front();
  if (differing.size() > 1) {
    absl::StrAppend(&out, " (and ", differing.size() - 1, differing.size() == 2 ? " more key)" : " more keys)");
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> ConfigKeysWithDefaults() {
  const Config defaults;
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : Fields()) out.emplace_back(f.key, f.get(defaults));
  return out;
}

}  // namespace diloco
