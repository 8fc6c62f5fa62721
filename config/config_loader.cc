#include "config/config_loader.h"

#include <xxhash.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "config/hf_model_config.h"
#include "config/message_limit.h"
#include "config/model_rules.h"

namespace diloco {
namespace {

// One key of the schema: how to set it from a YAML scalar and how to print it.
struct Field {
  std::string key;  // "section.name"
  std::function<absl::Status(Config&, const YAML::Node&)> set;
  std::function<std::string(const Config&)> get;
  std::function<void(Config& to, const Config& from)> copy;
  std::function<bool(const Config&, const Config&)> equal;
};

template <typename T, typename = void>
struct IsConfigEnum : std::false_type {};
template <typename T>
struct IsConfigEnum<T, std::void_t<decltype(EnumNames<T>::kNames)>> : std::true_type {};

template <typename T>
const char* TypeName() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_integral_v<T>) return "an integer";
  if constexpr (std::is_floating_point_v<T>) return "a number";
  return "a string";
}

using StringList = std::vector<std::string>;

// A list key (data.files): a YAML sequence of strings, or one string for a list of one; null is the empty list.
absl::Status DecodeStringList(const std::string& key, const YAML::Node& n, StringList* out) {
  out->clear();
  if (n.IsNull()) return absl::OkStatus();
  if (n.IsScalar()) {
    out->push_back(n.Scalar());
    return absl::OkStatus();
  }
  if (n.IsSequence()) {
    for (const YAML::Node& item : n) {
      if (!item.IsScalar()) return absl::InvalidArgumentError(absl::StrCat(key, ": expected a list of strings"));
      out->push_back(item.Scalar());
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(key, ": expected a list of strings, got a map"));
}

template <typename T>
std::string Show(const T& v) {
  if constexpr (std::is_same_v<T, StringList>) return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
  if constexpr (std::is_same_v<T, std::string>) return v.empty() ? "\"\"" : v;
  if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  if constexpr (IsConfigEnum<T>::value) return std::string(EnumName(v));
  if constexpr (!std::is_same_v<T, StringList> && !std::is_same_v<T, std::string> && !std::is_same_v<T, bool> &&
                !IsConfigEnum<T>::value) {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

template <typename Section, typename T>
Field MakeField(std::string key, Section Config::*section, T Section::*member) {
  Field f;
  f.key = key;
  f.set = [key, section, member](Config& c, const YAML::Node& n) -> absl::Status {
    if constexpr (std::is_same_v<T, std::string>) {
      if (n.IsNull()) {
        (c.*section).*member = "";
        return absl::OkStatus();
      }
    }
    T value{};
    if constexpr (std::is_same_v<T, StringList>) {
      absl::Status s = DecodeStringList(key, n, &value);
      if (!s.ok()) return s;
    } else if constexpr (IsConfigEnum<T>::value) {
      if (!n.IsScalar() || !EnumFromName(n.Scalar(), &value)) {
        std::string got = n.IsScalar() ? absl::StrCat("'", n.Scalar(), "'") : n.IsNull() ? "''" : "a list or map";
        return absl::InvalidArgumentError(absl::StrCat(key, ": expected ", EnumChoices<T>(), ", got ", got));
      }
    } else {
      if (!n.IsScalar() || !YAML::convert<T>::decode(n, value)) {
        std::string got = n.IsScalar() ? absl::StrCat("'", n.Scalar(), "'") : "a list or map";
        return absl::InvalidArgumentError(absl::StrCat(key, ": expected ", TypeName<T>(), ", got ", got));
      }
    }
    (c.*section).*member = value;
    return absl::OkStatus();
  };
  f.get = [section, member](const Config& c) { return Show((c.*section).*member); };
  f.copy = [section, member](Config& to, const Config& from) { (to.*section).*member = (from.*section).*member; };
  f.equal = [section, member](const Config& a, const Config& b) {
    return (a.*section).*member == (b.*section).*member;
  };
  return f;
}

const std::vector<Field>& Fields() {
  static const std::vector<Field> fields = {
      MakeField("run.name", &Config::run, &RunConfig::name),
      MakeField("run.seed", &Config::run, &RunConfig::seed),
      MakeField("run.output_dir", &Config::run, &RunConfig::output_dir),
      MakeField("model.arch", &Config::model, &ModelConfig::arch),
      MakeField("model.vocab_size", &Config::model, &ModelConfig::vocab_size),
      MakeField("model.seq_len", &Config::model, &ModelConfig::seq_len),
      MakeField("model.n_layer", &Config::model, &ModelConfig::n_layer),
      MakeField("model.n_head", &Config::model, &ModelConfig::n_head),
      MakeField("model.d_model", &Config::model, &ModelConfig::d_model),
      MakeField("model.n_kv_head", &Config::model, &ModelConfig::n_kv_head),
      MakeField("model.ffn_hidden", &Config::model, &ModelConfig::ffn_hidden),
      MakeField("model.max_positions", &Config::model, &ModelConfig::max_positions),
      MakeField("model.rope_theta", &Config::model, &ModelConfig::rope_theta),
      MakeField("model.norm_eps", &Config::model, &ModelConfig::norm_eps),
      MakeField("model.tie_embeddings", &Config::model, &ModelConfig::tie_embeddings),
      MakeField("model.bos_token_id", &Config::model, &ModelConfig::bos_token_id),
      MakeField("model.eos_token_id", &Config::model, &ModelConfig::eos_token_id),
      MakeField("model.init_from", &Config::model, &ModelConfig::init_from),
      MakeField("model.activation_checkpointing", &Config::model, &ModelConfig::activation_checkpointing),
      MakeField("data.text", &Config::data, &DataConfig::text),
      MakeField("data.files", &Config::data, &DataConfig::files),
      MakeField("data.format", &Config::data, &DataConfig::format),
      MakeField("data.jsonl_field", &Config::data, &DataConfig::jsonl_field),
      MakeField("data.token_dtype", &Config::data, &DataConfig::token_dtype),
      MakeField("data.val_files", &Config::data, &DataConfig::val_files),
      MakeField("data.val_fraction", &Config::data, &DataConfig::val_fraction),
      MakeField("data.on_bad_record", &Config::data, &DataConfig::on_bad_record),
      MakeField("data.cache_dir", &Config::data, &DataConfig::cache_dir),
      MakeField("data.split", &Config::data, &DataConfig::split),
      MakeField("data.sampling", &Config::data, &DataConfig::sampling),
      MakeField("data.tokenizer", &Config::data, &DataConfig::tokenizer),
      MakeField("data.tokenizer_threads", &Config::data, &DataConfig::tokenizer_threads),
      MakeField("data.tokenizer_train_mb", &Config::data, &DataConfig::tokenizer_train_mb),
      MakeField("data.trace_windows", &Config::data, &DataConfig::trace_windows),
      MakeField("inner.optimizer", &Config::inner, &InnerConfig::optimizer),
      MakeField("inner.lr", &Config::inner, &InnerConfig::lr),
      MakeField("inner.weight_decay", &Config::inner, &InnerConfig::weight_decay),
      MakeField("inner.weight_decay_1d", &Config::inner, &InnerConfig::weight_decay_1d),
      MakeField("inner.beta1", &Config::inner, &InnerConfig::beta1),
      MakeField("inner.beta2", &Config::inner, &InnerConfig::beta2),
      MakeField("inner.warmup_steps", &Config::inner, &InnerConfig::warmup_steps),
      MakeField("inner.min_lr_ratio", &Config::inner, &InnerConfig::min_lr_ratio),
      MakeField("inner.grad_clip", &Config::inner, &InnerConfig::grad_clip),
      MakeField("inner.batch_size", &Config::inner, &InnerConfig::batch_size),
      MakeField("inner.micro_batch_size", &Config::inner, &InnerConfig::micro_batch_size),
      MakeField("inner.steps", &Config::inner, &InnerConfig::steps),
      MakeField("inner.adaptive_steps", &Config::inner, &InnerConfig::adaptive_steps),
      MakeField("outer.optimizer", &Config::outer, &OuterConfig::optimizer),
      MakeField("outer.lr", &Config::outer, &OuterConfig::lr),
      MakeField("outer.momentum", &Config::outer, &OuterConfig::momentum),
      MakeField("outer.rounds", &Config::outer, &OuterConfig::rounds),
      MakeField("outer.late_policy", &Config::outer, &OuterConfig::late_policy),
      MakeField("outer.mode", &Config::outer, &OuterConfig::mode),
      MakeField("outer.delay_n", &Config::outer, &OuterConfig::delay_n),
      MakeField("outer.max_staleness", &Config::outer, &OuterConfig::max_staleness),
      MakeField("coordinator.listen", &Config::coordinator, &CoordinatorConfig::listen),
      MakeField("coordinator.min_workers", &Config::coordinator, &CoordinatorConfig::min_workers),
      MakeField("coordinator.round_timeout_s", &Config::coordinator, &CoordinatorConfig::round_timeout_s),
      MakeField("coordinator.checkpoint_every", &Config::coordinator, &CoordinatorConfig::checkpoint_every),
      MakeField("coordinator.checkpoint_dir", &Config::coordinator, &CoordinatorConfig::checkpoint_dir),
      MakeField("coordinator.keep_checkpoints", &Config::coordinator, &CoordinatorConfig::keep_checkpoints),
      MakeField("coordinator.replay_log_dir", &Config::coordinator, &CoordinatorConfig::replay_log_dir),
      MakeField("coordinator.eval_every", &Config::coordinator, &CoordinatorConfig::eval_every),
      MakeField("coordinator.eval_batches", &Config::coordinator, &CoordinatorConfig::eval_batches),
      MakeField("coordinator.threads", &Config::coordinator, &CoordinatorConfig::threads),
      MakeField("coordinator.heartbeat_interval_s", &Config::coordinator, &CoordinatorConfig::heartbeat_interval_s),
      MakeField("coordinator.lease_s", &Config::coordinator, &CoordinatorConfig::lease_s),
      MakeField("coordinator.max_members", &Config::coordinator, &CoordinatorConfig::max_members),
      MakeField("coordinator.grpc_memory_quota_mb", &Config::coordinator, &CoordinatorConfig::grpc_memory_quota_mb),
      MakeField("coordinator.metrics_listen", &Config::coordinator, &CoordinatorConfig::metrics_listen),
      MakeField("coordinator.device", &Config::coordinator, &CoordinatorConfig::device),
      MakeField("workers.count", &Config::workers, &WorkersConfig::count),
      MakeField("workers.device", &Config::workers, &WorkersConfig::device),
      MakeField("workers.threads", &Config::workers, &WorkersConfig::threads),
      MakeField("workers.connect_timeout_s", &Config::workers, &WorkersConfig::connect_timeout_s),
      MakeField("workers.rpc_timeout_s", &Config::workers, &WorkersConfig::rpc_timeout_s),
      MakeField("workers.cluster_size", &Config::workers, &WorkersConfig::cluster_size),
      MakeField("workers.cluster_timeout_s", &Config::workers, &WorkersConfig::cluster_timeout_s),
      MakeField("workers.check_replicas", &Config::workers, &WorkersConfig::check_replicas),
      MakeField("workers.slowdown", &Config::workers, &WorkersConfig::slowdown),
      MakeField("workers.precision", &Config::workers, &WorkersConfig::precision),
      MakeField("workers.state_dir", &Config::workers, &WorkersConfig::state_dir),
      MakeField("workers.resume", &Config::workers, &WorkersConfig::resume),
      MakeField("comm.chunk_bytes", &Config::comm, &CommConfig::chunk_bytes),
      MakeField("comm.codec", &Config::comm, &CommConfig::codec),
      MakeField("comm.pull_codec", &Config::comm, &CommConfig::pull_codec),
      MakeField("comm.error_feedback", &Config::comm, &CommConfig::error_feedback),
      MakeField("comm.fragments", &Config::comm, &CommConfig::fragments),
      MakeField("comm.overlap_steps", &Config::comm, &CommConfig::overlap_steps),
      MakeField("comm.merge_alpha", &Config::comm, &CommConfig::merge_alpha),
      MakeField("comm.transport", &Config::comm, &CommConfig::transport),
      MakeField("comm.tcp_port", &Config::comm, &CommConfig::tcp_port),
      MakeField("security.tls_cert", &Config::security, &SecurityConfig::tls_cert),
      MakeField("security.tls_key", &Config::security, &SecurityConfig::tls_key),
      MakeField("security.tls_ca", &Config::security, &SecurityConfig::tls_ca),
      MakeField("security.token_file", &Config::security, &SecurityConfig::token_file),
      MakeField("security.server_name", &Config::security, &SecurityConfig::server_name),
  };
  return fields;
}

const Field* FindField(const std::string& key) {
  for (const Field& f : Fields()) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

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
  for (const auto& section : root) {
    const std::string name = section.first.as<std::string>();
    if (KnownKeysOf(name).empty()) return UnknownKey(origin, name);
    if (section.second.IsNull()) continue;
    if (!section.second.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": section '", name, "' must be a map of keys"));
    }
    for (const auto& entry : section.second) {
      const std::string key = absl::StrCat(name, ".", entry.first.as<std::string>());
      const Field* field = FindField(key);
      if (field == nullptr) return UnknownKey(origin, key);
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
    return absl::InvalidArgumentError(absl::StrCat("--set ", override_text, ": ", e.what()));
  }
  absl::Status s = field->set(config, node);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("--set ", override_text, ": ", s.message()));
  set_keys.insert(key);
  return absl::OkStatus();
}

// model.init_from names a Hugging Face directory: the model keys its config.json determines fill those the YAML and
// --set left unset; one they set to another value is an error naming both. model.seq_len (the training context, not a
// shape key) left unset becomes min(its default, max_positions). data.tokenizer left unset becomes the directory's
// SentencePiece tokenizer.model when it ships one.
absl::Status MergeHfModelDir(Config& config, const SetKeys& set_keys) {
  const std::string& dir = config.model.init_from;
  auto hf = ReadHfModelConfig(dir);
  if (!hf.ok()) return absl::Status(hf.status().code(), absl::StrCat("model.init_from: ", hf.status().message()));
  Config from = config;
  from.model = hf->model;
  for (const std::string& key : hf->keys) {
    const Field* field = FindField(key);
    if (!set_keys.count(key)) {
      field->copy(config, from);
    } else if (!field->equal(config, from)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": the YAML says ", field->get(config), ", ", dir, "/config.json says ", field->get(from)));
    }
  }
  if (!set_keys.count("model.seq_len")) {
    config.model.seq_len = std::min(config.model.seq_len, config.model.MaxPositions());
  }
  const std::string tokenizer = (std::filesystem::path(dir) / "tokenizer.model").string();
  std::error_code ec;
  if (!set_keys.count("data.tokenizer") && std::filesystem::is_regular_file(tokenizer, ec)) {
    config.data.tokenizer = tokenizer;
  }
  return absl::OkStatus();
}

// security.*: cert and key come together; every named file must be readable; the token file must hold a secret.
// cpu, cuda or cuda:N (whether the machine has it is checked where it runs: worker/lm/device_choice.h).
absl::Status CheckDeviceName(const char* key, const std::string& device) {
  if (device == "cpu" || device == "cuda" ||
      (absl::StartsWith(device, "cuda:") && device.size() > 5 &&
       device.find_first_not_of("0123456789", 5) == std::string::npos)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(key, ": '", device, "' is not a device; use cpu, cuda or cuda:N"));
}

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
  if (d.tokenizer_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.tokenizer_threads: must be >= 0 (0 = every core), got ", d.tokenizer_threads));
  }
  if (d.tokenizer_train_mb <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("data.tokenizer_train_mb: must be > 0, got ", d.tokenizer_train_mb));
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
  absl::Status s = ApplyDocument(root, origin, config, set_keys);
  if (!s.ok()) return s;
  for (const std::string& o : overrides) {
    s = ApplyOverride(o, config, set_keys);
    if (!s.ok()) return s;
  }
  std::error_code ec;
  if (!config.model.init_from.empty() && std::filesystem::is_directory(config.model.init_from, ec)) {
    s = MergeHfModelDir(config, set_keys);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(origin, ": ", s.message()));
  }
  s = ValidateConfig(config);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", s.message()));
  return config;
}

absl::StatusOr<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("config file ", path, ": cannot be read (", std::strerror(errno),
                                            "); pass an existing file to --config"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str(), path, overrides);
}

absl::Status ValidateConfig(const Config& c) {
  std::error_code ec;
  auto positive = [](const char* key, double v) -> absl::Status {
    if (v > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(key, ": must be > 0, got ", v));
  };
  for (auto [key, v] : std::vector<std::pair<const char*, double>>{
           {"model.vocab_size", double(c.model.vocab_size)},
           {"model.seq_len", double(c.model.seq_len)},
           {"model.n_layer", double(c.model.n_layer)},
           {"model.n_head", double(c.model.n_head)},
           {"model.d_model", double(c.model.d_model)},
           {"inner.lr", c.inner.lr},
           {"inner.batch_size", double(c.inner.batch_size)},
           {"inner.steps", double(c.inner.steps)},
           {"outer.lr", c.outer.lr},
           {"outer.rounds", double(c.outer.rounds)},
           {"coordinator.min_workers", double(c.coordinator.min_workers)},
           {"coordinator.round_timeout_s", c.coordinator.round_timeout_s},
           {"coordinator.eval_batches", double(c.coordinator.eval_batches)},
           {"coordinator.threads", double(c.coordinator.threads)},
           {"coordinator.heartbeat_interval_s", c.coordinator.heartbeat_interval_s},
           {"coordinator.lease_s", c.coordinator.lease_s},
           {"coordinator.max_members", double(c.coordinator.max_members)},
           {"workers.count", double(c.workers.count)},
           {"workers.threads", double(c.workers.threads)},
           {"workers.rpc_timeout_s", c.workers.rpc_timeout_s},
           {"comm.chunk_bytes", double(c.comm.chunk_bytes)},
           {"comm.fragments", double(c.comm.fragments)},
           {"workers.cluster_size", double(c.workers.cluster_size)},
           {"workers.cluster_timeout_s", c.workers.cluster_timeout_s}}) {
    absl::Status s = positive(key, v);
    if (!s.ok()) return s;
  }
  if (c.coordinator.grpc_memory_quota_mb < 0) {
    return absl::InvalidArgumentError(absl::StrCat("coordinator.grpc_memory_quota_mb (",
                                                   c.coordinator.grpc_memory_quota_mb, ") must be >= 0 (0 = off)"));
  }
  if (c.inner.micro_batch_size < 0 ||
      (c.inner.micro_batch_size > 0 && c.inner.batch_size % c.inner.micro_batch_size != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("inner.micro_batch_size (", c.inner.micro_batch_size,
                                                   ") must divide inner.batch_size (", c.inner.batch_size,
                                                   "); 0 = the whole batch at once"));
  }
  absl::Status model = ValidateModel(c.model);
  if (!model.ok()) return model;
  if (c.model.vocab_size > (int64_t{1} << 32)) {  // token ids are stored as uint16 or uint32
    return absl::InvalidArgumentError(absl::StrCat("model.vocab_size: at most 2^32, got ", c.model.vocab_size));
  }
  if (c.comm.chunk_bytes > (int64_t{256} << 20)) {  // gRPC message limits are an int: chunk_bytes + 1 MiB must fit
    return absl::InvalidArgumentError(
        absl::StrCat("comm.chunk_bytes: at most 268435456 (256 MiB), got ", c.comm.chunk_bytes));
  }
  // The gRPC memory quota must hold two messages of the largest size or honest pushes would be reset
  // (coordinator/main.cc).
  const int64_t quota_mb = c.coordinator.grpc_memory_quota_mb;
  const int64_t message_mb = (MaxMessageBytes(c.comm.chunk_bytes) + (int64_t{1} << 20) - 1) >> 20;
  if (quota_mb > 0 && quota_mb < 2 * message_mb) {
    return absl::InvalidArgumentError(absl::StrCat(
        "coordinator.grpc_memory_quota_mb: ", quota_mb, " MiB cannot hold two messages of comm.chunk_bytes + 1 MiB (",
        message_mb, " MiB each); set at least ", 2 * message_mb, ", lower comm.chunk_bytes, or 0 (off)"));
  }
  if (!c.data.tokenizer.empty() && !std::filesystem::is_regular_file(c.data.tokenizer, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("data.tokenizer: '", c.data.tokenizer,
                                                   "' is not a file (a SentencePiece model; \"\" to train one)"));
  }
  absl::Status data = ValidateData(c.data);
  if (!data.ok()) return data;
  if (!(c.data.val_fraction > 0 && c.data.val_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.val_fraction: must be between 0 and 1 (exclusive), got ", c.data.val_fraction));
  }

  if (c.comm.tcp_port < 0 || c.comm.tcp_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("comm.tcp_port: must be in [0, 65535], got ", c.comm.tcp_port));
  }
  if (c.comm.transport == PushTransport::kTcp && (!c.security.tls_cert.empty() || !c.security.tls_ca.empty())) {
    return absl::InvalidArgumentError(
        "comm.transport: 'tcp' sends pseudo-gradients unencrypted; it cannot be combined with security.tls_* "
        "(use 'grpc')");
  }

  if (c.outer.momentum < 0 || c.outer.momentum >= 1) {
    return absl::InvalidArgumentError(absl::StrCat("outer.momentum: must be in [0, 1), got ", c.outer.momentum));
  }
  for (auto [key, v] : std::vector<std::pair<const char*, double>>{
           {"inner.weight_decay", c.inner.weight_decay},
           {"inner.warmup_steps", double(c.inner.warmup_steps)},
           {"inner.grad_clip", c.inner.grad_clip},
           {"inner.min_lr_ratio", c.inner.min_lr_ratio},
           {"coordinator.checkpoint_every", double(c.coordinator.checkpoint_every)},
           {"coordinator.eval_every", double(c.coordinator.eval_every)},
           {"coordinator.keep_checkpoints", double(c.coordinator.keep_checkpoints)}}) {
    if (v < 0) return absl::InvalidArgumentError(absl::StrCat(key, ": must be >= 0, got ", v));
  }
  if (!c.coordinator.metrics_listen.empty()) {
    const std::string& m = c.coordinator.metrics_listen;
    const size_t colon = m.rfind(':');
    const std::string port = colon == std::string::npos ? "" : m.substr(colon + 1);
    const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
    if (colon == 0 || !digits || std::stoi(port) > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "coordinator.metrics_listen: expected HOST:PORT (e.g. 127.0.0.1:9464; port 0 picks a free one) or \"\" "
          "for off, got '",
          m, "'"));
    }
  }
  if (c.run.output_dir.empty()) return absl::InvalidArgumentError("run.output_dir: must not be empty");
  if (c.comm.fragments > c.model.n_layer + 1) {  // blocks i -> i mod P; ln_f -> P-1: every fragment gets a tensor
    return absl::InvalidArgumentError(
        absl::StrCat("comm.fragments: at most model.n_layer + 1 (", c.model.n_layer + 1, "), got ", c.comm.fragments));
  }
  if (c.inner.steps % c.comm.fragments != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm.fragments (", c.comm.fragments, ") must divide inner.steps (", c.inner.steps, ")"));
  }
  if (c.comm.overlap_steps < 0 || c.comm.overlap_steps > c.StepsPerSync()) {
    return absl::InvalidArgumentError(absl::StrCat("comm.overlap_steps: must be in [0, inner.steps / comm.fragments = ",
                                                   c.StepsPerSync(), "], got ", c.comm.overlap_steps));
  }
  if (!(c.comm.merge_alpha >= 0 && c.comm.merge_alpha <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("comm.merge_alpha: must be in [0, 1], got ", c.comm.merge_alpha));
  }

  if (c.outer.delay_n < 0 || c.outer.max_staleness < 0) {
    return absl::InvalidArgumentError(absl::StrCat("outer.delay_n and outer.max_staleness: must be >= 0, got ",
                                                   c.outer.delay_n, " and ", c.outer.max_staleness));
  }

  if (absl::Status s = CheckDeviceName("workers.device", c.workers.device); !s.ok()) return s;
  if (absl::Status s = CheckDeviceName("coordinator.device", c.coordinator.device); !s.ok()) return s;
  if (!(c.workers.slowdown >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("workers.slowdown: must be >= 1, got ", c.workers.slowdown));
  }
  if ((c.outer.mode == OuterMode::kAsync || c.inner.adaptive_steps) &&
      (c.comm.fragments != 1 || c.comm.overlap_steps != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        c.outer.mode == OuterMode::kAsync ? "outer.mode async" : "inner.adaptive_steps",
        " needs comm.fragments 1 and comm.overlap_steps 0 (Streaming DiLoCo rounds are fixed fragments of H)"));
  }
  if (absl::Status s = ValidateSecurity(c.security); !s.ok()) return s;
  return absl::OkStatus();
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

std::vector<std::pair<std::string, std::string>> ConfigKeysWithDefaults() {
  const Config defaults;
  std::vector<std::pair<std::string, std::string>> out;
  for (const Field& f : Fields()) out.emplace_back(f.key, f.get(defaults));
  return out;
}

}  // namespace diloco
