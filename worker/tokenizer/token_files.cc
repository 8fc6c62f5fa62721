#include "worker/tokenizer/token_files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "worker/data/token_shard.h"

namespace diloco::tokenize {
namespace {

constexpr int32_t kLlmcMagicGpt2 = 20240520;    // version 1, uint16 ids
constexpr int32_t kLlmcMagicLlama3 = 20240801;  // version 7, uint32 ids
constexpr uint64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);
constexpr char kShardMagic[8] = {'D', 'L', 'C', 'O', 'T', 'O', 'K', '\0'};

std::string CountMismatch(const std::string& path, uint64_t header_count, uint64_t held) {
  return path + ": header says " + std::to_string(header_count) + " tokens but the file holds " + std::to_string(held) +
         (held < header_count ? " (truncated?)" : "");
}

// The first position in [begin, end) of ids (of type T) holding an id >= vocab_size, or end.
template <typename T>
uint64_t FirstBadId(const T* ids, uint64_t begin, uint64_t end, uint64_t vocab_size) {
  for (uint64_t i = begin; i < end; ++i) {
    if (ids[i] >= vocab_size) return i;
  }
  return end;
}

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const auto abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

}  // namespace

std::string InspectTokenFile(const std::string& path, uint32_t raw_width, TokenFile* out) {
  *out = TokenFile{Absolute(path), 0, raw_width, 0, "raw"};
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (fd >= 0) close(fd);
    return path + ": cannot read (" + std::strerror(errno) + ")";
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  int32_t header[256] = {};
  const ssize_t got = pread(fd, header, sizeof(header), 0);
  close(fd);
  if (got >= 24 && memcmp(header, kShardMagic, sizeof(kShardMagic)) == 0) {
    uint32_t version, dtype;
    uint64_t count;
    memcpy(&version, reinterpret_cast<const char*>(header) + 8, 4);
    memcpy(&dtype, reinterpret_cast<const char*>(header) + 12, 4);
    memcpy(&count, reinterpret_cast<const char*>(header) + 16, 8);
    if (version != 1 || (dtype != 2 && dtype != 4)) {
      return path + ": token shard version " + std::to_string(version) + " / width " + std::to_string(dtype) +
             " is not supported";
    }
    *out = TokenFile{out->path, kTokenShardHeaderBytes, dtype, count, "shard"};
    const uint64_t held = (size - kTokenShardHeaderBytes) / dtype;
    return held == count && (size - kTokenShardHeaderBytes) % dtype == 0 ? "" : CountMismatch(path, count, held);
  }
  if (got == static_cast<ssize_t>(kLlmcHeaderBytes) && (header[0] == kLlmcMagicGpt2 || header[0] == kLlmcMagicLlama3)) {
    const bool gpt2 = header[0] == kLlmcMagicGpt2;
    if (header[1] != (gpt2 ? 1 : 7)) {
      return path + ": llm.c magic " + std::to_string(header[0]) + " with version " + std::to_string(header[1]) +
             " (expected " + (gpt2 ? "1" : "7") + ")";
    }
    const uint32_t width = gpt2 ? 2 : 4;
    const uint64_t count = static_cast<uint32_t>(header[2]);
    *out = TokenFile{out->path, kLlmcHeaderBytes, width, count, "llm.c"};
    const uint64_t held = (size - kLlmcHeaderBytes) / width;
    return held == count && (size - kLlmcHeaderBytes) % width == 0 ? "" : CountMismatch(path, count, held);
  }
  if (size % raw_width != 0) {
    return path + ": " + std::to_string(size) + " bytes is not a whole number of " + std::to_string(raw_width) +
           "-byte ids (data.token_dtype " + (raw_width == 2 ? "uint16" : "uint32") + ")";
  }
  out->count = size / raw_width;
  return "";
}

std::string CheckTokenIds(const TokenFile& file, uint64_t vocab_size, int threads) {
  if (file.count == 0) return "";
  const int fd = open(file.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return file.path + ": cannot read (" + std::strerror(errno) + ")";
  const size_t bytes = file.offset + file.count * file.width;
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return file.path + ": cannot map (" + std::strerror(errno) + ")";
  const char* ids = static_cast<const char*>(map) + file.offset;
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(file.count / 65536) + 1));
  std::vector<uint64_t> first_bad(n);
  std::vector<std::thread> workers;
  for (int t = 0; t < n; ++t) {
    workers.emplace_back([&, t] {
      const uint64_t begin = file.count * t / n, end = file.count * (t + 1) / n;
      first_bad[t] = file.width == 2 ? FirstBadId(reinterpret_cast<const uint16_t*>(ids), begin, end, vocab_size)
                                     : FirstBadId(reinterpret_cast<const uint32_t*>(ids), begin, end, vocab_size);
      if (first_bad[t] == end) first_bad[t] = UINT64_MAX;
    });
  }
  for (std::thread& w : workers) w.join();
  const uint64_t bad = *std::min_element(first_bad.begin(), first_bad.end());
  std::string error;
  if (bad != UINT64_MAX) {
    uint32_t id = 0;
    memcpy(&id, ids + bad * file.width, file.width);
    error = file.path + ": token id " + std::to_string(id) + " at position " + std::to_string(bad) +
            " is >= model.vocab_size " + std::to_string(vocab_size);
  }
  munmap(map, bytes);
  return error;
}

std::string CheckRawWidth(const TokenFile& file, uint64_t vocab_size) {
  if (file.kind != "raw" || file.width != 2 || vocab_size == 0) return "";
  // uint32 ids read two bytes at a time are (low half, high half) pairs, and every half is below the vocabulary (for
  // vocabularies up to 2^32): the id check passes them. Their high halves are at most (vocab_size - 1) >> 16 (0 for
  // GPT-2's 50257, 1 for Llama 3's 128256); real uint16 text never has every second id that small for a thousand ids.
  const uint64_t high = (vocab_size - 1) >> 16;
  const uint64_t n = std::min<uint64_t>(file.count, 65536) & ~uint64_t{1};
  if (n < 1024) return "";
  std::vector<uint16_t> ids(n);
  std::ifstream in(file.path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(n * 2))) {
    return file.path + ": cannot read";
  }
  for (uint64_t i = 1; i < n; i += 2) {
    if (ids[i] > high) return "";
  }
  return file.path + ": every second uint16 of the first " + std::to_string(n) + " ids is " +
         (high == 0 ? "0" : "at most " + std::to_string(high)) +
         ", as uint32 ids read as uint16 are; set data.token_dtype: uint32";
}

std::string PlanTokenFiles(const std::vector<std::string>& inputs, const std::vector<std::string>& val_inputs,
                           double val_fraction, uint32_t raw_width, uint64_t vocab_size, int threads,
                           TokenManifest* manifest) {
  auto inspect = [&](const std::vector<std::string>& paths, std::vector<TokenFile>* files) -> std::string {
    for (const std::string& path : paths) {
      TokenFile file;
      if (std::string e = InspectTokenFile(path, raw_width, &file); !e.empty()) return e;
      if (std::string e = CheckRawWidth(file, vocab_size); !e.empty()) return e;
      if (std::string e = CheckTokenIds(file, vocab_size, threads); !e.empty()) return e;
      if (file.count > 0) files->push_back(file);
    }
    return "";
  };
  std::vector<TokenFile> train, val;
  if (std::string e = inspect(inputs, &train); !e.empty()) return e;
  if (std::string e = inspect(val_inputs, &val); !e.empty()) return e;
  manifest->documents = inputs.size() + val_inputs.size();
  auto segment = [](const TokenFile& f, uint64_t skip, uint64_t count) {
    return TokenSegment{f.path, f.offset + skip * f.width, f.width, count};
  };
  if (!val_inputs.empty()) {
    for (const TokenFile& f : train) manifest->train.push_back(segment(f, 0, f.count));
    for (const TokenFile& f : val) manifest->val.push_back(segment(f, 0, f.count));
  } else {
    if (!(val_fraction > 0 && val_fraction < 1)) return "--val-fraction must be in (0, 1) when there are no val files";
    uint64_t total = 0;
    for (const TokenFile& f : train) total += f.count;
    uint64_t train_left = static_cast<uint64_t>(static_cast<double>(total) * (1.0 - val_fraction));
    for (const TokenFile& f : train) {
      const uint64_t head = std::min(train_left, f.count);
      if (head > 0) manifest->train.push_back(segment(f, 0, head));
      if (head < f.count) manifest->val.push_back(segment(f, head, f.count - head));
      train_left -= head;
    }
  }
  if (manifest->train.empty()) return "the token files hold no training tokens";
  if (manifest->val.empty()) return "no validation tokens (raise data.val_fraction or set data.val_files)";
  return "";
}

}  // namespace diloco::tokenize
