#include "worker/data/token_manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace diloco {
namespace {

constexpr int kManifestVersion = 2;

nlohmann::json SegmentsToJson(const std::vector<TokenSegment>& segments) {
  nlohmann::json out = nlohmann::json::array();
  for (const TokenSegment& s : segments) {
    out.push_back({{"path", s.path}, {"offset", s.offset}, {"width", s.width}, {"count", s.count}});
  }
  return out;
}

bool SegmentsFromJson(const nlohmann::json& j, const std::filesystem::path& dir, std::vector<TokenSegment>* out,
                      std::string* error) {
  if (!j.is_array()) {
    *error = "a split must be a list of segments";
    return false;
  }
  for (const nlohmann::json& s : j) {
    TokenSegment seg;
    seg.path = s.at("path").get<std::string>();
    seg.offset = s.at("offset").get<uint64_t>();
    seg.width = s.at("width").get<uint32_t>();
    seg.count = s.at("count").get<uint64_t>();
    if (seg.width != 2 && seg.width != 4) {
      *error = "segment " + seg.path + ": width " + std::to_string(seg.width) + " (must be 2 or 4)";
      return false;
    }
    if (std::filesystem::path(seg.path).is_relative()) seg.path = (dir / seg.path).string();
    out->push_back(std::move(seg));
  }
  return true;
}

uint64_t Sum(const std::vector<TokenSegment>& segments) {
  uint64_t n = 0;
  for (const TokenSegment& s : segments) n += s.count;
  return n;
}

}  // namespace

uint64_t TokenManifest::TrainTokens() const { return Sum(train); }
uint64_t TokenManifest::ValTokens() const { return Sum(val); }

bool WriteTokenManifest(const std::string& path, const TokenManifest& m, std::string* error) {
  const nlohmann::json j = {
      {"version", kManifestVersion}, {"vocab_size", m.vocab_size},       {"bos_id", m.bos_id},
      {"eos_id", m.eos_id},          {"newline_id", m.newline_id},       {"tokenizer", m.tokenizer},
      {"documents", m.documents},    {"bad_records", m.bad_records},     {"train_tokens", m.TrainTokens()},
      {"val_tokens", m.ValTokens()}, {"train", SegmentsToJson(m.train)}, {"val", SegmentsToJson(m.val)}};
  const std::string text = j.dump(2) + "\n";
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot write " + tmp + ": " + std::strerror(errno);
    return false;
  }
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  close(fd);
  if (!written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot write " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

bool ReadTokenManifest(const std::string& path, TokenManifest* m, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "token manifest " + path + ": cannot read (" + std::strerror(errno) + ")";
    return false;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    const int version = j.at("version").get<int>();
    if (version != kManifestVersion) {
      *error = "token manifest " + path + ": version " + std::to_string(version) + ", expected " +
               std::to_string(kManifestVersion) + " (delete the cache directory to tokenize again)";
      return false;
    }
    *m = TokenManifest{};
    m->vocab_size = j.at("vocab_size").get<int64_t>();
    m->bos_id = j.at("bos_id").get<int64_t>();
    m->eos_id = j.at("eos_id").get<int64_t>();
    m->newline_id = j.at("newline_id").get<int64_t>();
    m->tokenizer = j.at("tokenizer").get<std::string>();
    m->documents = j.at("documents").get<uint64_t>();
    m->bad_records = j.at("bad_records").get<uint64_t>();
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    std::string e;
    if (!SegmentsFromJson(j.at("train"), dir, &m->train, &e) || !SegmentsFromJson(j.at("val"), dir, &m->val, &e)) {
      *error = "token manifest " + path + ": " + e;
      return false;
    }
  } catch (const nlohmann::json::exception& e) {
    *error = "token manifest " + path + ": " + e.what();
    return false;
  }
  if (m->train.empty() || m->val.empty()) {
    *error = "token manifest " + path + ": the " + std::string(m->train.empty() ? "training" : "validation") +
             " split has no segments";
    return false;
  }
  return true;
}

}  // namespace diloco
