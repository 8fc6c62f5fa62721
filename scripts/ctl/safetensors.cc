#include "scripts/ctl/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"

// The format stores little-endian bytes; this writer copies memory as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors writer assumes a little-endian host");

namespace diloco {
namespace {

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// A file that appears at `path` only on Commit(): writes go to a temp file next to it.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(absl::StrCat(path_, ".tmp-", getpid())) {}
  ~AtomicFile() {
    if (f_ != nullptr) fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
  }

  absl::Status Open() {
    f_ = fopen(tmp_.c_str(), "wb");
    if (f_ == nullptr) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write ", path_, " (temp file ", tmp_, "): ", strerror(errno)));
    }
    return absl::OkStatus();
  }
  void Write(const void* p, size_t n) { ok_ = ok_ && (n == 0 || fwrite(p, 1, n, f_) == n); }

  absl::Status Commit() {
    const bool flushed = fflush(f_) == 0 && fsync(fileno(f_)) == 0;
    const bool closed = fclose(f_) == 0;
    f_ = nullptr;
    if (!ok_ || !flushed || !closed) {
      return absl::DataLossError(absl::StrCat("writing ", tmp_, " failed (", strerror(errno), ")"));
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("rename ", tmp_, " -> ", path_, ": ", strerror(errno)));
    }
    committed_ = true;
    const std::string dir = std::filesystem::path(path_).parent_path().string();
    const int dfd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
    return absl::OkStatus();
  }

 private:
  std::string path_, tmp_;
  FILE* f_ = nullptr;
  bool ok_ = true;
  bool committed_ = false;
};

absl::Status CheckEntries(const std::vector<SafetensorsEntry>& tensors) {
  std::set<std::string> names;
  for (const SafetensorsEntry& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: invalid tensor name '", t.name, "'"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: duplicate tensor name '", t.name, "'"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", t.name, "' has a negative dim"));
      }
    }
    if (t.data == nullptr && Numel(t.shape) > 0) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor '", t.name, "' has no data"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string SafetensorsHeader(const std::vector<SafetensorsEntry>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    const uint64_t bytes = Numel(t.shape) * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  return header.dump();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  if (absl::Status s = CheckEntries(tensors); !s.ok()) return s;
  std::string header = SafetensorsHeader(tensors, metadata);
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t header_len = header.size();

  AtomicFile file(path);
  if (absl::Status s = file.Open(); !s.ok()) return s;
  file.Write(&header_len, sizeof(header_len));
  file.Write(header.data(), header.size());
  for (const SafetensorsEntry& t : tensors) file.Write(t.data, Numel(t.shape) * sizeof(float));
  return file.Commit();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  if (absl::Status s = file.Open(); !s.ok()) return s;
  file.Write(text.data(), text.size());
  return file.Commit();
}

}  // namespace diloco
