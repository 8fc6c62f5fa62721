#include "config/data_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "config/config_enums.h"
#include "config/data_inputs.h"
#include "config/hf_model_config.h"
#include "config/subprocess.h"

namespace diloco {

std::string TokenizerFileName(const std::string& path) {
  return std::filesystem::path(path).extension() == ".json" ? "tokenizer.json" : "tokenizer.model";
}

std::string TokenCache::tokenizer_path() const {
  std::error_code ec;
  const std::string json = dir + "/tokenizer.json";
  return std::filesystem::is_regular_file(json, ec) ? json : tokenizer_model_path();
}
namespace {

// Bump when the tokenizer's output changes for the same inputs (v2: shards, manifest, BOS/EOS; v3: a tokenizer.json
// text document's ids are those of one encode() of the whole file, work_items.h; v4: tokenizer.json words over 256
// bytes and single_word added tokens as the tokenizers library encodes them; v5: tokenizer.json regexes read \s as
// Oniguruma (not U+180E) and split at empty matches). A given SentencePiece model's key says "|sp=document" since
// such a model without our <nl> symbol encodes whole documents, not line by line: only those caches are made again
// (a trained tokenizer's and a tokenizer.json's are not, nor retrained).
constexpr int kCacheFormatVersion = 5;
// Longer input lists than this go to the tokenizer through a list file instead of its command line.
constexpr size_t kMaxInlineInputChars = 32 << 10;

absl::StatusOr<uint64_t> HashFile(const std::string& path, const char* key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(key, ": cannot read '", path, "' (", std::strerror(errno), "); set ", key,
                                            " to an existing file"));
  }
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), buf.size());
    XXH64_update(state, buf.data(), in.gcount());
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// "path|size|mtime_ns" of each input: the key changes when a file is replaced, grows or is touched.
std::string Stamps(const std::vector<std::string>& paths) {
  std::string out;
  for (const std::string& path : paths) {
    struct stat st {};
    stat(path.c_str(), &st);
    absl::StrAppend(&out, "|", path, "|", st.st_size, "|", st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec);
  }
  return out;
}

// The expanded inputs of a config.
struct Inputs {
  std::vector<std::string> train, val;
  DataFormat format = DataFormat::kText;  // data.text is text whatever data.format says
};

absl::StatusOr<Inputs> ResolveInputs(const Config& config) {
  Inputs inputs;
  auto train = TrainingInputs(config);
  if (!train.ok()) return train.status();
  inputs.train = *std::move(train);
  if (!config.data.val_files.empty()) {
    auto val = ExpandInputs(config.data.val_files, "data.val_files");
    if (!val.ok()) return val.status();
    inputs.val = *std::move(val);
  }
  if (!config.data.files.empty()) inputs.format = config.data.format;
  return inputs;
}

absl::StatusOr<TokenCache> Locate(const Config& config, const Inputs& inputs) {
  const DataConfig& d = config.data;
  std::string key_text =
      absl::StrCat("v", kCacheFormatVersion, "|format=", std::string(EnumName(inputs.format)), "|field=", d.jsonl_field,
                   "|dtype=", std::string(EnumName(d.token_dtype)), "|bad=", std::string(EnumName(d.on_bad_record)),
                   "|val=", d.val_fraction, "|vocab=", config.model.vocab_size, "|train_mb=", d.tokenizer_train_mb,
                   "|train", Stamps(inputs.train), "|val_files", Stamps(inputs.val));
  if (!d.tokenizer.empty()) {  // a given tokenizer: its bytes are part of the key
    auto tokenizer_hash = HashFile(d.tokenizer, "data.tokenizer");
    if (!tokenizer_hash.ok()) return tokenizer_hash.status();
    absl::StrAppend(&key_text, "|tokenizer=", *tokenizer_hash);
    if (TokenizerFileName(d.tokenizer) == "tokenizer.model") absl::StrAppend(&key_text, "|sp=document");
    const std::filesystem::path dir = std::filesystem::path(d.tokenizer).parent_path();
    for (const char* sidecar : {"config.json", "tokenizer_config.json"}) {  // a tokenizer.json's BOS / EOS
      std::error_code ec;
      if (TokenizerFileName(d.tokenizer) != "tokenizer.json" || !std::filesystem::is_regular_file(dir / sidecar, ec))
        continue;
      auto sidecar_hash = HashFile((dir / sidecar).string(), "data.tokenizer");
      if (!sidecar_hash.ok()) return sidecar_hash.status();
      absl::StrAppend(&key_text, "|", sidecar, "=", *sidecar_hash);
    }
  }
  char key[17];
  snprintf(key, sizeof(key), "%016llx", static_cast<unsigned long long>(XXH64(key_text.data(), key_text.size(), 0)));
  return TokenCache{absl::StrCat(config.CacheDir(), "/tok-", key)};
}

// Adds the inputs to argv: one --input / --val-input each, or a list file next to the cache when they are many.
absl::Status AddInputArgs(const std::vector<std::string>& paths, const std::string& flag, const std::string& list_path,
                          std::vector<std::string>* argv) {
  size_t chars = 0;
  for (const std::string& p : paths) chars += p.size() + 1;
  if (chars <= kMaxInlineInputChars) {
    for (const std::string& p : paths) argv->insert(argv->end(), {"--" + flag, p});
    return absl::OkStatus();
  }
  std::ofstream list(list_path, std::ios::trunc);
  for (const std::string& p : paths) list << p << "\n";
  list.flush();
  if (!list) return absl::PermissionDeniedError(absl::StrCat("token cache: cannot write '", list_path, "'"));
  argv->insert(argv->end(), {"--" + flag + "-list", list_path});
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> TokenizerArgv(const Config& config, const Inputs& inputs,
                                                       const TokenCache& cache, const std::string& tokenizer_exe) {
  const DataConfig& d = config.data;
  std::vector<std::string> argv = {tokenizer_exe,
                                   "--format",
                                   std::string(EnumName(inputs.format)),
                                   "--vocab-size",
                                   std::to_string(config.model.vocab_size),
                                   "--val-fraction",
                                   absl::StrCat(d.val_fraction),
                                   "--jsonl-field",
                                   d.jsonl_field,
                                   "--token-dtype",
                                   std::string(EnumName(d.token_dtype)),
                                   "--on-bad-record",
                                   std::string(EnumName(d.on_bad_record)),
                                   "--train-mb",
                                   std::to_string(d.tokenizer_train_mb),
                                   "--threads",
                                   std::to_string(d.tokenizer_threads),
                                   "--out",
                                   cache.dir};
  if (!d.tokenizer.empty()) argv.insert(argv.end(), {"--tokenizer-model", d.tokenizer});
  if (absl::Status s = AddInputArgs(inputs.train, "input", cache.dir + ".inputs", &argv); !s.ok()) return s;
  if (absl::Status s = AddInputArgs(inputs.val, "val-input", cache.dir + ".val-inputs", &argv); !s.ok()) return s;
  return argv;
}

// Runs the tokenizer (the caller holds the lock).
absl::Status Tokenize(const Config& config, const Inputs& inputs, const TokenCache& cache,
                      const std::string& tokenizer_exe) {
  auto argv = TokenizerArgv(config, inputs, cache, tokenizer_exe);
  if (!argv.ok()) return argv.status();
  auto child = Subprocess::Start(*argv);
  if (!child.ok()) return child.status();
  const std::string what =
      config.data.files.empty() ? config.data.text : absl::StrCat("data.files (", inputs.train.size(), " files)");
  if (int code = child->Wait(); code != 0) {
    return absl::InternalError(
        absl::StrCat("token cache: ", tokenizer_exe, " exited with code ", code, " while tokenizing ", what));
  }
  if (!IsDir(cache.dir)) return absl::InternalError(absl::StrCat("token cache: tokenizer did not create ", cache.dir));
  std::error_code ec;
  std::filesystem::remove(cache.dir + ".inputs", ec);
  std::filesystem::remove(cache.dir + ".val-inputs", ec);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenCache> LocateTokenCache(const Config& config) {
  auto inputs = ResolveInputs(config);
  if (!inputs.ok()) return inputs.status();
  return Locate(config, *inputs);
}

absl::Status CheckTokenizerChoice(const Config& config) {
  const DataConfig& d = config.data;
  if (d.format == DataFormat::kTokens || !d.tokenizer.empty() || d.train_tokenizer ||
      !IsHfModelDir(config.model.init_from)) {
    return absl::OkStatus();
  }
  std::string has;
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    std::error_code ec;
    if (has.empty() && std::filesystem::is_regular_file(std::filesystem::path(config.model.init_from) / name, ec)) {
      has = name;
    }
  }
  if (!has.empty()) {  // data.tokenizer set to "" (unset, it is the directory's)
    return absl::InvalidArgumentError(absl::StrCat(
        "data.tokenizer is empty, so a tokenizer would be trained here, which would not match the embeddings of "
        "model.init_from ",
        config.model.init_from, "; remove data.tokenizer to use its ", has,
        ", or set data.train_tokenizer: true for a model made at random"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "model.init_from ", config.model.init_from,
      ": the directory has no tokenizer.model or tokenizer.json, and a tokenizer trained here would not match its "
      "embeddings; set data.tokenizer to the model's tokenizer (a vocab.json + merges.txt directory: "
      "transformers' AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR) writes its tokenizer.json), or "
      "data.train_tokenizer: true for a model made at random"));
}

absl::StatusOr<TokenCache> EnsureTokenized(const Config& config, const std::string& tokenizer_exe) {
  if (absl::Status s = CheckTokenizerChoice(config); !s.ok()) return s;
  auto inputs = ResolveInputs(config);
  if (!inputs.ok()) return inputs.status();
  auto cache = Locate(config, *inputs);
  if (!cache.ok()) return cache.status();
  if (IsDir(cache->dir)) return cache;

  std::error_code ec;
  std::filesystem::create_directories(config.CacheDir(), ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("token cache: cannot create directory '", config.CacheDir(), "': ", ec.message()));
  }
  const std::string lock_path = cache->dir + ".lock";
  const int fd = open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("token cache: cannot open lock '", lock_path, "': ", std::strerror(errno)));
  }
  while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  absl::Status status = absl::OkStatus();
  if (!IsDir(cache->dir)) status = Tokenize(config, *inputs, *cache, tokenizer_exe);  // nobody made it meanwhile
  flock(fd, LOCK_UN);
  close(fd);
  if (!status.ok()) return status;
  return cache;
}

absl::StatusOr<std::string> VocabDigestOf(const TokenCache& cache, const std::string& tokenizer_exe) {
  const std::string tokenizer = cache.tokenizer_path();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(tokenizer, ec)) return std::string();
  auto out = RunForOutput({tokenizer_exe, "digest", "--model", tokenizer});
  if (!out.ok()) return absl::InternalError(absl::StrCat("token cache: ", out.status().message()));
  // The digest is the last line (a library may have logged before it).
  std::string text = *out;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const std::string digest = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  if (digest.size() != 16 || digest.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::InternalError(
        absl::StrCat("token cache: ", tokenizer_exe, " digest printed '", text.substr(0, 200), "', not a digest"));
  }
  return digest;
}

}  // namespace diloco
