#include "worker/lm/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"

// The format stores little-endian bytes; the writer and the reader copy memory as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace diloco {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the format's own limit on the JSON header

size_t ElementSize(SafetensorsDtype dtype) { return dtype == SafetensorsDtype::kF32 ? 4 : 2; }
const char* DtypeName(SafetensorsDtype dtype) { return dtype == SafetensorsDtype::kF32 ? "F32" : "BF16"; }

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
    const uint64_t bytes = Numel(t.shape) * ElementSize(t.dtype);
    header[t.name] = {{"dtype", DtypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
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
  for (const SafetensorsEntry& t : tensors) file.Write(t.data, Numel(t.shape) * ElementSize(t.dtype));
  return file.Commit();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  if (absl::Status s = file.Open(); !s.ok()) return s;
  file.Write(text.data(), text.size());
  return file.Commit();
}

namespace {

// One tensor of a file's header, checked against the data section's size.
struct StoredTensor {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

absl::StatusOr<at::ScalarType> ParseDtype(const std::string& path, const std::string& name, const std::string& dtype) {
  if (dtype == "F32") return at::kFloat;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "F16") return at::kHalf;
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": tensor '", name, "' has dtype '", dtype, "' (supported: F32, BF16, F16)"));
}

absl::StatusOr<StoredTensor> ParseEntry(const std::string& path, const std::string& name,
                                        const nlohmann::ordered_json& entry, uint64_t data_bytes) {
  StoredTensor t;
  t.name = name;
  std::string dtype;
  std::vector<uint64_t> offsets;
  try {
    dtype = entry.at("dtype").get<std::string>();
    t.shape = entry.at("shape").get<std::vector<int64_t>>();
    offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': bad header entry (", e.what(), ")"));
  }
  absl::StatusOr<at::ScalarType> type = ParseDtype(path, name, dtype);
  if (!type.ok()) return type.status();
  t.dtype = *type;
  uint64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 0) return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "' has a negative dimension"));
    numel *= static_cast<uint64_t>(d);
  }
  if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "' has data_offsets out of range (data is ",
                                            data_bytes, " bytes; truncated file?)"));
  }
  t.begin = offsets[0];
  t.end = offsets[1];
  if (t.end - t.begin != numel * at::elementSize(t.dtype)) {
    return absl::DataLossError(absl::StrCat(path, ": tensor '", name, "' holds ", t.end - t.begin,
                                            " bytes, its dtype and shape need ", numel * at::elementSize(t.dtype)));
  }
  return t;
}

absl::StatusOr<std::vector<StoredTensor>> ParseHeader(const std::string& path, const std::string& text,
                                                      uint64_t data_bytes,
                                                      std::map<std::string, std::string>* metadata) {
  const nlohmann::ordered_json header = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the safetensors header is not a JSON object"));
  }
  std::vector<StoredTensor> out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (metadata == nullptr) continue;
      if (!entry.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ is not an object"));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ value of '", key, "' is not a string"));
        }
        (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<StoredTensor> t = ParseEntry(path, name, entry, data_bytes);
    if (!t.ok()) return t.status();
    out.push_back(std::move(*t));
  }
  return out;
}

}  // namespace

absl::StatusOr<NamedTensors> ReadSafetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (!in || ec) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  uint64_t header_bytes = 0;
  if (file_bytes < 8 || !in.read(reinterpret_cast<char*>(&header_bytes), 8)) {
    return absl::DataLossError(absl::StrCat(path, ": truncated safetensors file (", file_bytes, " bytes)"));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": safetensors header of ", header_bytes, " bytes is over the 100 MB limit"));
  }
  if (8 + header_bytes > file_bytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated safetensors file (header of ", header_bytes,
                                            " bytes, file of ", file_bytes, ")"));
  }
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  absl::StatusOr<std::vector<StoredTensor>> specs = ParseHeader(path, text, file_bytes - 8 - header_bytes, metadata);
  if (!specs.ok()) return specs.status();

  NamedTensors out;
  out.reserve(specs->size());
  for (const StoredTensor& spec : *specs) {
    at::Tensor raw = at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype));
    in.seekg(static_cast<std::streamoff>(8 + header_bytes + spec.begin));
    if (!in.read(static_cast<char*>(raw.data_ptr()), static_cast<std::streamsize>(spec.end - spec.begin))) {
      return absl::DataLossError(absl::StrCat(path, ": cannot read tensor '", spec.name, "'"));
    }
    out.emplace_back(spec.name, raw.to(at::kFloat).contiguous());
  }
  return out;
}

}  // namespace diloco
