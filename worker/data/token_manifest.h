// The token manifest (meta.json in a token cache directory): which token ids make up a run's training and validation
// splits, and where they lie on disk. It is the one contract between the tokenizer (diloco-tokenize writes it) and
// the readers (worker/data/token_data.h maps every segment read-only). A split is the concatenation of its segments in
// order; a segment is `count` little-endian ids of `width` bytes starting `offset` bytes into `path` (a token shard
// we wrote, an llm.c or nanoGPT .bin, or a raw id file), so pre-tokenized inputs are used in place, never copied.
//
// meta.json, version 2:
//   {"version": 2, "vocab_size": 512, "bos_id": 1, "eos_id": 2, "newline_id": 3,   (-1: none)
//    "tokenizer": "tokenizer.model" ("" for format tokens), "documents": 1234, "bad_records": 0,
//    "train": [{"path": "train-00000.tok", "offset": 24, "width": 2, "count": 1000000}, ...],
//    "val": [...]}
// Relative paths are relative to the manifest's directory. Plain C++ (nlohmann-json, no protobuf or abseil: the
// tokenizer links it next to SentencePiece). Stateless functions and plain data; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace diloco {

struct TokenSegment {
  std::string path;     // absolute, or relative to the manifest's directory
  uint64_t offset = 0;  // byte offset of the first id
  uint32_t width = 2;   // bytes per id: 2 (uint16) or 4 (uint32)
  uint64_t count = 0;   // ids in the segment
};

struct TokenManifest {
  int64_t vocab_size = 0;
  int64_t bos_id = -1, eos_id = -1, newline_id = -1;
  std::string tokenizer;  // the SentencePiece model used, relative to the manifest's directory; "" for format tokens
  uint64_t documents = 0;
  uint64_t bad_records = 0;  // jsonl lines skipped (data.on_bad_record skip)
  std::vector<TokenSegment> train, val;

  uint64_t TrainTokens() const;
  uint64_t ValTokens() const;
};

// Writes `manifest` to `path` atomically (temp file, fsync, rename). False and *error on failure.
bool WriteTokenManifest(const std::string& path, const TokenManifest& manifest, std::string* error);

// Reads and checks a manifest (version, widths, non-empty splits); segment paths come back absolute (resolved
// against the manifest's directory). False and *error (naming the file and what is wrong) on failure.
bool ReadTokenManifest(const std::string& path, TokenManifest* manifest, std::string* error);

}  // namespace diloco
