// Pre-tokenized inputs (data.format tokens): recognises each file's layout, checks it, and builds the token manifest
// whose segments point at the files in place (nothing is copied).
//   llm.c .bin: a 256 x int32 header; magic 20240520 version 1 = uint16 ids, magic 20240801 version 7 = uint32 ids
//               (llm.c's llama3 branch); header[2] = the token count, checked against the file size.
//   our shard:  magic "DLCOTOK\0" (worker/data/token_shard.h); its count is checked against the file size.
//   otherwise:  raw little-endian ids of --token-dtype (nanoGPT's .bin is uint16); the size must be a multiple of it.
// Every id is checked < vocab_size, on `threads` threads over a read-only mapping. Validation: the val files, else
// the last val_fraction of the tokens (a segment may then start in the middle of a file). Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/data/token_manifest.h"

namespace diloco::tokenize {

struct TokenFile {
  std::string path;  // absolute
  uint64_t offset = 0;
  uint32_t width = 2;
  uint64_t count = 0;
  std::string kind;  // "llm.c", "shard", "raw"
};

// Reads the header (if any) and checks the size; raw_width is 2 or 4. An error naming the file on failure.
std::string InspectTokenFile(const std::string& path, uint32_t raw_width, TokenFile* out);

// A raw file read as uint16 ids: "" when it can be, else an error naming it when its first ids look like uint32 ids
// (every second one no larger than a uint32 id's high half can be: those would pass every id check).
std::string CheckRawWidth(const TokenFile& file, uint64_t vocab_size);

// Checks that every id of the file is below vocab_size; the one-line error names the first offending position.
std::string CheckTokenIds(const TokenFile& file, uint64_t vocab_size, int threads);

// Inspects and checks every file and fills manifest->train / val (and documents = the number of files).
std::string PlanTokenFiles(const std::vector<std::string>& inputs, const std::vector<std::string>& val_inputs,
                           double val_fraction, uint32_t raw_width, uint64_t vocab_size, int threads,
                           TokenManifest* manifest);

}  // namespace diloco::tokenize
