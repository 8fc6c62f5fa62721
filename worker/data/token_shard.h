// Token shard files: the pre-tokenized training and validation data that workers and the coordinator read.
//
// Format (little endian): 8-byte magic "DLCOTOK\0", uint32 version (1), uint32 dtype (2 = uint16, 4 = uint32),
// uint64 token count, then the raw token ids. Plain C++ with no protobuf or abseil, because the tokenizer (which links
// SentencePiece) writes these files. The functions are stateless and thread-safe; a TokenShardWriter is one file
// being written by one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace diloco {

constexpr uint64_t kTokenShardHeaderBytes = 24;

// Bytes per id in a shard for a vocabulary: 2 up to 65,536 ids, else 4.
inline uint32_t TokenShardWidth(uint64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

// Streams ids into one shard file: Open() creates <path>.tmp, Append() adds ids in the shard's width, Finish() writes
// the header's count, fsyncs and renames the file to `path` (so a reader never sees a half-written shard). An
// unfinished writer removes its temp file when destroyed. Not thread-safe (one writer thread).
class TokenShardWriter {
 public:
  TokenShardWriter() = default;
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  bool Open(const std::string& path, uint64_t vocab_size, std::string* error);
  bool Append(const uint32_t* ids, size_t n, std::string* error);
  bool Finish(std::string* error);
  bool is_open() const { return file_ != nullptr; }
  uint64_t count() const { return count_; }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  uint32_t width_ = 2;
  uint64_t count_ = 0;
  std::vector<uint16_t> narrow_;
};

// Writes ids atomically (temp file + rename). Returns false and sets *error on failure.
bool WriteTokenShard(const std::string& path, const std::vector<uint32_t>& ids, uint32_t vocab_size,
                     std::string* error);

// Reads a shard; checks magic, version, dtype and that the file holds exactly `count` tokens.
bool ReadTokenShard(const std::string& path, std::vector<int32_t>* ids, std::string* error);

}  // namespace diloco
