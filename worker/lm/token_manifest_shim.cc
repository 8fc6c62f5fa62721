// TokenManifestPath (declared in worker/lm/token_data.h): a bridge for token caches written before the manifest
// (issue 16): their meta.json is version 1 and the ids are in train.tok / val.tok. Delete this file once
// diloco-tokenize writes a version-2 meta.json.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "worker/lm/token_data.h"
#include "worker/lm/token_manifest.h"

namespace diloco {
namespace {

// meta.json as JSON (null when missing or unreadable).
nlohmann::json ReadMeta(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json();
}

// The one segment of a token shard file (worker/lm/token_shard.h): its ids after the 24-byte header.
bool ShardSegment(const std::string& path, TokenSegment* segment, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  char header[24];
  if (!in.read(header, sizeof(header)) || std::memcmp(header, "DLCOTOK", 8) != 0) {
    *error = "token shard " + path + ": " + (in ? "not a token shard (bad magic)" : "cannot read its header");
    return false;
  }
  uint32_t width = 0;
  std::memcpy(&width, header + 12, sizeof(width));
  std::memcpy(&segment->count, header + 16, sizeof(segment->count));
  segment->path = std::filesystem::path(path).filename().string();  // relative to the manifest, beside it
  segment->offset = sizeof(header);
  segment->width = width;
  return true;
}

}  // namespace

std::string TokenManifestPath(const TokenCache& cache, std::string* error) {
  const nlohmann::json meta = ReadMeta(cache.meta_path());
  if (meta.is_object() && meta.value("version", 0) == 2) return cache.meta_path();
  std::string e;
  TokenManifest manifest;
  if (meta.is_object()) {
    manifest.vocab_size = meta.value("vocab_size", int64_t{0});
    manifest.newline_id = meta.value("newline_id", int64_t{-1});
  }
  manifest.train.emplace_back();
  manifest.val.emplace_back();
  const std::string path = cache.dir + "/manifest-v1.json";
  const std::string mine = path + "." + std::to_string(getpid());
  if (ShardSegment(cache.train_path(), &manifest.train[0], &e) &&
      ShardSegment(cache.val_path(), &manifest.val[0], &e) && WriteTokenManifest(mine, manifest, &e)) {
    if (std::rename(mine.c_str(), path.c_str()) == 0) return path;
    e = "cannot rename " + mine + " to " + path + ": " + std::strerror(errno);
  }
  std::remove(mine.c_str());
  if (error != nullptr) *error = e;
  return cache.meta_path();
}

}  // namespace diloco
