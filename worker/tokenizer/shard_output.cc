#include "worker/tokenizer/shard_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace diloco::tokenize {
namespace {

constexpr const char* kSplitNames[2] = {"train", "val"};

std::string WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  close(fd);
  if (!written || std::rename(tmp.c_str(), path.c_str()) != 0) return "cannot write " + path + ": " + strerror(errno);
  return "";
}

nlohmann::json ToJson(const ResumeRecord& r) {
  return {{"args", r.args},
          {"split", r.split},
          {"range", r.position.range},
          {"offset", r.position.offset},
          {"line", r.position.line},
          {"train_shards", r.shards[kTrain]},
          {"val_shards", r.shards[kVal]},
          {"documents", r.documents},
          {"bad_records", r.bad_records},
          {"bytes_done", r.bytes_done}};
}

ResumeRecord FromJson(const nlohmann::json& j) {
  ResumeRecord r;
  r.args = j.at("args");
  r.split = j.at("split").get<int>();
  r.position = {j.at("range").get<size_t>(), j.at("offset").get<uint64_t>(), j.at("line").get<uint64_t>()};
  r.shards[kTrain] = j.at("train_shards").get<std::vector<uint64_t>>();
  r.shards[kVal] = j.at("val_shards").get<std::vector<uint64_t>>();
  r.documents = j.at("documents").get<uint64_t>();
  r.bad_records = j.at("bad_records").get<uint64_t>();
  r.bytes_done = j.at("bytes_done").get<uint64_t>();
  return r;
}

// Why a saved record cannot be resumed with `args` ("" when it can).
std::string Mismatch(const nlohmann::json& saved, const nlohmann::json& args) {
  for (const auto& [key, value] : args.items()) {
    if (!saved.contains(key)) return "it has no '" + key + "'";
    if (saved.at(key) != value) return "its '" + key + "' differs (" + saved.at(key).dump() + ")";
  }
  return saved.size() == args.size() ? "" : "it has other arguments";
}

}  // namespace

std::string ShardOutput::ShardPath(int split, size_t index) const {
  char name[32];
  snprintf(name, sizeof(name), "%s-%05zu.tok", kSplitNames[split], index);
  return partial_ + "/" + name;
}

std::string ShardOutput::Open(const std::string& out_dir, const nlohmann::json& args, uint64_t vocab_size,
                              uint64_t shard_tokens, bool* resumed) {
  out_ = out_dir;
  partial_ = out_dir + ".partial";
  vocab_size_ = vocab_size;
  shard_tokens_ = shard_tokens;
  *resumed = false;
  const std::string record_path = partial_ + "/progress.json";
  std::error_code ec;
  if (std::filesystem::exists(record_path, ec)) {
    std::string why;
    try {
      std::ifstream in(record_path);
      record_ = FromJson(nlohmann::json::parse(in));
      why = Mismatch(record_.args, args);
    } catch (const std::exception& e) {
      why = std::string("it cannot be read (") + e.what() + ")";
    }
    if (why.empty() && !std::filesystem::exists(partial_ + "/tokenizer.model", ec) &&
        !std::filesystem::exists(partial_ + "/tokenizer.json", ec)) {
      why = "it has no tokenizer.model or tokenizer.json";
    }
    for (int s = 0; s < 2 && why.empty(); ++s) {
      for (size_t i = 0; i < record_.shards[s].size() && why.empty(); ++i) {
        const uint64_t want = kTokenShardHeaderBytes + record_.shards[s][i] * TokenShardWidth(vocab_size);
        if (std::filesystem::file_size(ShardPath(s, i), ec) != want || ec) why = ShardPath(s, i) + " is not complete";
      }
    }
    if (why.empty()) {
      *resumed = true;
      return "";
    }
    std::cerr << "diloco-tokenize: discarding the unfinished " << partial_ << ": " << why << "\n";
  } else if (std::filesystem::exists(partial_, ec)) {
    std::cerr << "diloco-tokenize: discarding the unfinished " << partial_ << ": it has no progress record\n";
  }
  std::filesystem::remove_all(partial_, ec);
  std::filesystem::create_directories(partial_, ec);
  if (ec) return "cannot create " + partial_ + ": " + ec.message();
  record_ = ResumeRecord{};
  record_.args = args;
  return "";
}

std::string ShardOutput::Save() { return WriteAtomically(partial_ + "/progress.json", ToJson(record_).dump(1)); }

std::string ShardOutput::FinishShard(int split, const SplitPosition& next) {
  std::string error;
  if (writer_.is_open()) {
    const uint64_t count = writer_.count();
    if (!writer_.Finish(&error)) return error;
    record_.shards[split].push_back(count);
    ++shards_finished_here_;
  }
  record_.position = next;
  record_.documents += pending_documents_;
  record_.bad_records += pending_bad_;
  record_.bytes_done += pending_bytes_;
  pending_documents_ = pending_bad_ = pending_bytes_ = 0;
  return Save();
}

std::string ShardOutput::Add(int split, const EncodedItem& item) {
  std::string error;
  if (!writer_.is_open() && !writer_.Open(ShardPath(split, record_.shards[split].size()), vocab_size_, &error)) {
    return error;
  }
  if (!writer_.Append(item.ids.data(), item.ids.size(), &error)) return error;
  pending_documents_ += item.documents;
  pending_bad_ += item.bad_records;
  pending_bytes_ += item.bytes;
  if (writer_.count() >= shard_tokens_) return FinishShard(split, item.next);
  return "";
}

std::string ShardOutput::EndSplit(int split, const SplitPosition& next_split_start) {
  record_.split = split + 1;
  return FinishShard(split, next_split_start);
}

std::string ShardOutput::Finish(TokenManifest manifest) {
  const uint32_t width = TokenShardWidth(vocab_size_);
  for (int s = 0; s < 2; ++s) {
    auto& segments = s == kTrain ? manifest.train : manifest.val;
    for (size_t i = 0; i < record_.shards[s].size(); ++i) {
      if (record_.shards[s][i] == 0) continue;
      segments.push_back({std::filesystem::path(ShardPath(s, i)).filename().string(), kTokenShardHeaderBytes, width,
                          record_.shards[s][i]});
    }
    if (segments.empty())
      return std::string("the ") + (s == kTrain ? "training" : "validation") + " split has no tokens";
  }
  manifest.documents = record_.documents;
  manifest.bad_records = record_.bad_records;
  std::string error;
  if (!WriteTokenManifest(partial_ + "/meta.json", manifest, &error)) return error;
  std::error_code ec;
  std::filesystem::remove(partial_ + "/progress.json", ec);
  std::filesystem::rename(partial_, out_, ec);
  if (ec) {
    if (std::filesystem::is_directory(out_)) {  // another process finished first
      std::filesystem::remove_all(partial_, ec);
      return "";
    }
    return "cannot rename " + partial_ + " to " + out_ + ": " + ec.message();
  }
  return "";
}

}  // namespace diloco::tokenize
