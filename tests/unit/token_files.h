// Token files for the data tests: a token shard whose ids equal their positions (so a batch tells where it was drawn
// from) and a version-2 token manifest (worker/data/token_manifest.h) around it. Plain functions; gtest assertions.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "worker/data/token_manifest.h"
#include "worker/data/token_shard.h"

namespace diloco {

// Writes a manifest at `path` whose train and val splits are `train` and `val` (val defaults to train).
inline std::string WriteManifest(const std::string& path, const std::vector<TokenSegment>& train,
                                 std::vector<TokenSegment> val = {}) {
  TokenManifest m;
  m.vocab_size = 1 << 20;
  m.train = train;
  m.val = val.empty() ? train : val;
  std::string error;
  EXPECT_TRUE(WriteTokenManifest(path, m, &error)) << error;
  return path;
}

// Writes <dir>/pos.tok holding ids 0..n-1 (uint16 while n <= 65536, else uint32) and <dir>/pos.json, the manifest
// with that shard as both splits; returns the manifest's path.
inline std::string WritePositionsManifest(const std::string& dir, int64_t n) {
  std::vector<uint32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<uint32_t>(i);
  const uint32_t vocab = n <= 65536 ? 65536 : static_cast<uint32_t>(n);
  std::string error;
  EXPECT_TRUE(WriteTokenShard(dir + "/pos.tok", ids, vocab, &error)) << error;
  const TokenSegment all{dir + "/pos.tok", 24, vocab <= 65536 ? 2u : 4u, static_cast<uint64_t>(n)};
  return WriteManifest(dir + "/pos.json", {all});
}

}  // namespace diloco
