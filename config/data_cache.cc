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
#include "config/subprocess.h"

namespace diloco {
namespace {

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

}  // namespace

absl::StatusOr<TokenCache> LocateTokenCache(const Config& config) {
  auto text_hash = HashFile(config.data.text, "data.text");
  if (!text_hash.ok()) return text_hash.status();
  std::string key_text =
      absl::StrCat(*text_hash, "|vocab=", config.model.vocab_size, "|val=", config.data.val_fraction, "|v1");
  if (!config.data.tokenizer.empty()) {  // a given tokenizer: its bytes are part of the key (none: the cache as before)
    auto tokenizer_hash = HashFile(config.data.tokenizer, "data.tokenizer");
    if (!tokenizer_hash.ok()) return tokenizer_hash.status();
    absl::StrAppend(&key_text, "|tokenizer=", *tokenizer_hash);
  }
  char key[17];
  snprintf(key, sizeof(key), "%016llx", static_cast<unsigned long long>(XXH64(key_text.data(), key_text.size(), 0)));
  return TokenCache{absl::StrCat(config.CacheDir(), "/tok-", key)};
}

absl::StatusOr<TokenCache> EnsureTokenized(const Config& config, const std::string& tokenizer_exe) {
  auto cache = LocateTokenCache(config);
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
  if (!IsDir(cache->dir)) {  // nobody made it while we waited for the lock
    std::vector<std::string> argv = {tokenizer_exe,
                                     "--text",
                                     config.data.text,
                                     "--vocab-size",
                                     std::to_string(config.model.vocab_size),
                                     "--val-fraction",
                                     absl::StrCat(config.data.val_fraction),
                                     "--out",
                                     cache->dir};
    if (!config.data.tokenizer.empty()) argv.insert(argv.end(), {"--tokenizer-model", config.data.tokenizer});
    auto child = Subprocess::Start(argv);
    if (!child.ok()) {
      status = child.status();
    } else if (int code = child->Wait(); code != 0) {
      status = absl::InternalError(absl::StrCat("token cache: ", tokenizer_exe, " exited with code ", code,
                                                " while tokenizing ", config.data.text));
    } else if (!IsDir(cache->dir)) {
      status = absl::InternalError(absl::StrCat("token cache: tokenizer did not create ", cache->dir));
    }
  }
  flock(fd, LOCK_UN);
  close(fd);
  if (!status.ok()) return status;
  return cache;
}

}  // namespace diloco
