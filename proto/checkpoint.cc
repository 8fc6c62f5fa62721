#include "proto/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace diloco {
namespace {

constexpr char kMagic[8] = {'D', 'L', 'C', 'O', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 2;  // 2: evals carry tokens and bytes; version 1 files still load

// Appends to a file while hashing every byte.
class HashingWriter {
 public:
  explicit HashingWriter(FILE* f) : f_(f), state_(XXH64_createState()) { XXH64_reset(state_, 0); }
  ~HashingWriter() { XXH64_freeState(state_); }
  void Bytes(const void* p, size_t n) {
    XXH64_update(state_, p, n);
    ok_ = ok_ && fwrite(p, 1, n, f_) == n;
  }
  template <typename T>
  void Pod(T v) {
    Bytes(&v, sizeof(v));
  }
  void String(const std::string& s) {
    Pod<uint32_t>(static_cast<uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  void Floats(const at::Tensor& t) {
    at::Tensor c = t.to(at::kFloat).contiguous();
    Bytes(c.data_ptr(), c.numel() * sizeof(float));
  }
  void Finish() {
    const uint64_t h = XXH64_digest(state_);
    ok_ = ok_ && fwrite(&h, 1, sizeof(h), f_) == sizeof(h);
  }
  bool ok() const { return ok_; }

 private:
  FILE* f_;
  XXH64_state_t* state_;
  bool ok_ = true;
};

// Reads from an in-memory file image with bounds checks.
class Reader {
 public:
  Reader(const std::string& buf, size_t end) : buf_(buf), end_(end) {}
  bool Bytes(void* p, size_t n) {
    if (pos_ + n > end_) return false;
    memcpy(p, buf_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Pod(T* v) {
    return Bytes(v, sizeof(T));
  }
  bool String(std::string* s) {
    uint32_t n = 0;
    if (!Pod(&n) || pos_ + n > end_) return false;
    s->assign(buf_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Floats(at::Tensor* t) { return Bytes(t->data_ptr(), t->numel() * sizeof(float)); }
  bool AtEnd() const { return pos_ == end_; }
  size_t remaining() const { return end_ - pos_; }

 private:
  const std::string& buf_;
  size_t end_;
  size_t pos_ = 0;
};

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", what));
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int64_t round) {
  return absl::StrFormat("%s/ckpt-%08d.bin", dir, round);
}

absl::Status SaveCheckpoint(const std::string& path, const CheckpointData& data) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("checkpoint dir ", dir, ": ", ec.message()));
  const std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp, ": ", strerror(errno)));
  HashingWriter w(f);
  w.Bytes(kMagic, sizeof(kMagic));
  w.Pod<uint32_t>(kVersion);
  w.Pod<int64_t>(data.round);
  w.String(data.fingerprint);
  w.Pod<uint32_t>(static_cast<uint32_t>(data.params.size()));
  for (const auto& [name, t] : data.params) {
    w.String(name);
    w.Pod<uint32_t>(static_cast<uint32_t>(t.dim()));
    for (int64_t d : t.sizes()) w.Pod<int64_t>(d);
    w.Floats(t);
  }
  w.Pod<uint32_t>(static_cast<uint32_t>(data.momentum.size()));
  for (const at::Tensor& m : data.momentum) w.Floats(m);
  w.Pod<uint32_t>(static_cast<uint32_t>(data.evals.size()));
  for (const EvalRecord& e : data.evals) {
    w.Pod<int64_t>(e.round);
    w.Pod<double>(e.val_loss);
    w.Pod<int64_t>(e.tokens);
    w.Pod<int64_t>(e.bytes_pushed_committed);
  }
  w.Finish();
  const bool flushed = fflush(f) == 0 && fsync(fileno(f)) == 0;
  fclose(f);
  if (!w.ok() || !flushed) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("writing ", tmp, " failed (disk full?)"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, ": ", strerror(errno)));
  }
  const int dfd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointData> LoadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("checkpoint ", path, ": cannot open (", strerror(errno), ")"));
  std::string buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (buf.size() < sizeof(kMagic) + sizeof(uint64_t) || memcmp(buf.data(), kMagic, sizeof(kMagic)) != 0) {
    return Corrupt(path, "not a DiLoCo checkpoint (bad magic or too short)");
  }
  const size_t body = buf.size() - sizeof(uint64_t);
  uint64_t stored = 0;
  memcpy(&stored, buf.data() + body, sizeof(stored));
  if (XXH64(buf.data(), body, 0) != stored) return Corrupt(path, "checksum mismatch (torn or corrupted file)");

  Reader r(buf, body);
  char magic[8];
  uint32_t version = 0, count = 0;
  CheckpointData data;
  if (!r.Bytes(magic, 8) || !r.Pod(&version)) return Corrupt(path, "truncated header");
  if (version != kVersion && version != 1) return Corrupt(path, absl::StrCat("unsupported version ", version));
  if (!r.Pod(&data.round) || !r.String(&data.fingerprint) || !r.Pod(&count)) return Corrupt(path, "truncated header");
  for (uint32_t i = 0; i < count; ++i) {
    std::string name;
    uint32_t ndim = 0;
    if (!r.String(&name) || !r.Pod(&ndim) || ndim > 8) return Corrupt(path, "bad tensor header");
    std::vector<int64_t> dims(ndim);
    uint64_t numel = 1;
    for (int64_t& d : dims) {
      if (!r.Pod(&d) || d < 0) return Corrupt(path, "bad tensor shape");
      numel *= static_cast<uint64_t>(d);
      if (numel > r.remaining() / sizeof(float)) return Corrupt(path, absl::StrCat("tensor '", name, "' truncated"));
    }
    at::Tensor t = at::empty(dims, at::kFloat);
    if (!r.Floats(&t)) return Corrupt(path, absl::StrCat("tensor '", name, "' truncated"));
    data.params.emplace_back(name, t);
  }
  uint32_t momentum_count = 0;
  if (!r.Pod(&momentum_count) || (momentum_count != 0 && momentum_count != count)) {
    return Corrupt(path, "bad momentum section");
  }
  for (uint32_t i = 0; i < momentum_count; ++i) {
    at::Tensor m = at::empty_like(data.params[i].second);
    if (!r.Floats(&m)) return Corrupt(path, "momentum truncated");
    data.momentum.push_back(m);
  }
  uint32_t eval_count = 0;
  if (!r.Pod(&eval_count)) return Corrupt(path, "bad eval section");
  for (uint32_t i = 0; i < eval_count; ++i) {
    EvalRecord e;
    if (!r.Pod(&e.round) || !r.Pod(&e.val_loss)) return Corrupt(path, "eval history truncated");
    if (version >= 2 && (!r.Pod(&e.tokens) || !r.Pod(&e.bytes_pushed_committed))) {
      return Corrupt(path, "eval history truncated");
    }
    data.evals.push_back(e);
  }
  if (!r.AtEnd()) return Corrupt(path, "trailing bytes before the checksum");
  return data;
}

namespace {
// Checkpoint files in dir, oldest first (names sort by round).
std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".bin") {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}
}  // namespace

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& dir, std::vector<std::string>* skipped) {
  const std::vector<std::string> files = CheckpointFiles(dir);
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    auto data = LoadCheckpoint(*it);
    if (data.ok()) return LoadedCheckpoint{*it, std::move(*data)};
    if (skipped != nullptr) skipped->push_back(std::string(data.status().message()));
  }
  return absl::NotFoundError(absl::StrCat("no valid checkpoint in ", dir));
}

void PruneCheckpoints(const std::string& dir, int64_t keep) {
  if (keep <= 0) return;
  const std::vector<std::string> files = CheckpointFiles(dir);
  std::error_code ec;
  for (size_t i = 0; i + keep < files.size(); ++i) std::filesystem::remove(files[i], ec);
}

}  // namespace diloco
