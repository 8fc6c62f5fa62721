// Token shard files: the pre-tokenized training and validation data that workers and the coordinator read.
//
// Format (little endian): 8-byte magic "DLCOTOK\0", uint32 version (1), uint32 dtype (2 = uint16, 4 = uint32),
// uint64 token count, then the raw token ids. Plain C++ with no protobuf or abseil, because the tokenizer (which links
// SentencePiece) writes these files. Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace diloco {

// Writes ids atomically (temp file + rename). Returns false and sets *error on failure.
bool WriteTokenShard(const std::string& path, const std::vector<uint32_t>& ids, uint32_t vocab_size,
                     std::string* error);

// Reads a shard; checks magic, version, dtype and that the file holds exactly `count` tokens.
bool ReadTokenShard(const std::string& path, std::vector<int32_t>* ids, std::string* error);

}  // namespace diloco
