#include "worker/data/token_shard.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace diloco {
namespace {

constexpr char kMagic[8] = {'D', 'L', 'C', 'O', 'T', 'O', 'K', '\0'};
constexpr uint32_t kVersion = 1;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t dtype;  // bytes per id: 2 or 4
  uint64_t count;
};
static_assert(sizeof(Header) == 24, "token shard header must be 24 bytes");

template <typename T>
void WriteIds(std::ofstream& out, const std::vector<uint32_t>& ids) {
  std::vector<T> buf(ids.begin(), ids.end());
  out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size() * sizeof(T)));
}

Header MakeHeader(uint32_t width, uint64_t count) {
  Header h{};
  memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.dtype = width;
  h.count = count;
  return h;
}

}  // namespace

TokenShardWriter::~TokenShardWriter() {
  if (file_ != nullptr) {
    fclose(file_);
    std::remove((path_ + ".tmp").c_str());
  }
}

bool TokenShardWriter::Open(const std::string& path, uint64_t vocab_size, std::string* error) {
  path_ = path;
  width_ = TokenShardWidth(vocab_size);
  count_ = 0;
  const std::string tmp = path + ".tmp";
  file_ = fopen(tmp.c_str(), "wb");
  if (file_ == nullptr) {
    *error = "cannot write " + tmp + ": " + std::strerror(errno);
    return false;
  }
  const Header h = MakeHeader(width_, 0);  // the count is filled in by Finish()
  if (fwrite(&h, sizeof(h), 1, file_) != 1) {
    *error = "write failed for " + tmp + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

bool TokenShardWriter::Append(const uint32_t* ids, size_t n, std::string* error) {
  size_t written;
  if (width_ == 2) {
    narrow_.assign(ids, ids + n);
    written = fwrite(narrow_.data(), 2, n, file_);
  } else {
    written = fwrite(ids, 4, n, file_);
  }
  if (written != n) {
    *error = "write failed for " + path_ + ".tmp: " + std::strerror(errno);
    return false;
  }
  count_ += n;
  return true;
}

bool TokenShardWriter::Finish(std::string* error) {
  const std::string tmp = path_ + ".tmp";
  const Header h = MakeHeader(width_, count_);
  const bool ok = fflush(file_) == 0 && fseek(file_, 0, SEEK_SET) == 0 && fwrite(&h, sizeof(h), 1, file_) == 1 &&
                  fflush(file_) == 0 && fsync(fileno(file_)) == 0;
  const bool closed = fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed || std::rename(tmp.c_str(), path_.c_str()) != 0) {
    *error = "cannot write " + path_ + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

bool WriteTokenShard(const std::string& path, const std::vector<uint32_t>& ids, uint32_t vocab_size,
                     std::string* error) {
  const Header h = MakeHeader(TokenShardWidth(vocab_size), ids.size());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      *error = "cannot write " + tmp + ": " + std::strerror(errno);
      return false;
    }
    out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    if (h.dtype == 2) {
      WriteIds<uint16_t>(out, ids);
    } else {
      WriteIds<uint32_t>(out, ids);
    }
    out.flush();
    if (!out) {
      *error = "write failed for " + tmp;
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

bool ReadTokenShard(const std::string& path, std::vector<int32_t>* ids, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "token shard " + path + ": cannot open (" + std::strerror(errno) + ")";
    return false;
  }
  Header h{};
  in.read(reinterpret_cast<char*>(&h), sizeof(h));
  if (!in || memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    *error = "token shard " + path + ": not a token shard (bad magic)";
    return false;
  }
  if (h.version != kVersion || (h.dtype != 2 && h.dtype != 4)) {
    *error = "token shard " + path + ": unsupported version " + std::to_string(h.version) + " / dtype " +
             std::to_string(h.dtype);
    return false;
  }
  in.seekg(0, std::ios::end);
  const uint64_t payload = static_cast<uint64_t>(in.tellg()) - sizeof(h);
  if (payload != h.count * h.dtype) {
    *error = "token shard " + path + ": header says " + std::to_string(h.count) + " tokens but the file holds " +
             std::to_string(payload) + " bytes of ids (truncated?)";
    return false;
  }
  in.seekg(sizeof(h));
  ids->resize(h.count);
  if (h.dtype == 2) {
    std::vector<uint16_t> buf(h.count);
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(payload));
    std::copy(buf.begin(), buf.end(), ids->begin());
  } else {
    std::vector<uint32_t> buf(h.count);
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(payload));
    std::copy(buf.begin(), buf.end(), ids->begin());
  }
  return static_cast<bool>(in);
}

}  // namespace diloco
