#include "worker/lm/token_shard.h"

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

}  // namespace

bool WriteTokenShard(const std::string& path, const std::vector<uint32_t>& ids, uint32_t vocab_size,
                     std::string* error) {
  Header h{};
  memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.dtype = vocab_size <= 65536 ? 2 : 4;
  h.count = ids.size();
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
