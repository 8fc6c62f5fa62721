#include "worker/tokenizer/hf_bpe.h"

#include <atomic>
#include <cstdio>
#include <queue>

#include "worker/tokenizer/hf_text.h"

namespace diloco::tokenize {
namespace {

constexpr size_t kCacheEntries = 1 << 18;  // a thread's word cache is emptied when it grows past this
constexpr size_t kCachedWordBytes = 256;   // longer words are not cached

// One thread's cache of encoded words (the tokenizers library keeps one too), for one model at a time.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int>> words;
};

std::atomic<uint64_t> next_instance{1};

// A symbol of a word being merged (tokenizers' Symbol): its id, neighbours and whether it still exists.
struct Symbol {
  int id, prev, next;
  bool alive;
};

struct QueuedMerge {
  int rank, pos, new_id;
  bool operator>(const QueuedMerge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

std::string HfBpe::Parse(const nlohmann::json& model) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") return "the model " + type + " is not supported (supported: BPE)";
  if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout").get<double>() != 0.0) {
    return "the BPE model's dropout is not supported";
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && !model.at(key).get<std::string>().empty()) {
      return std::string("the BPE model's ") + key + " is not supported";
    }
  }
  for (const auto& [token, id] : model.at("vocab").items()) {
    const int i = id.get<int>();
    if (i < 0) return "the BPE vocabulary has a negative id for '" + token + "'";
    vocab_[token] = i;
    if (static_cast<size_t>(i) >= tokens_.size()) tokens_.resize(i + 1);
    tokens_[i] = token;
  }
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("unk_token") && model.at("unk_token").is_string()) {
    unk_id_ = TokenToId(model.at("unk_token").get<std::string>());
    if (unk_id_ < 0) return "the BPE unk_token is not in the vocabulary";
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_fallback_ids_[b] = TokenToId(name);
    byte_level_ids_[b] = TokenToId(ByteLevelChar(static_cast<unsigned char>(b)));
  }
  instance_ = next_instance.fetch_add(1);
  return ParseMerges(model.at("merges"));
}

std::string HfBpe::ParseMerges(const nlohmann::json& merges) {
  merges_.reserve(merges.size());
  int rank = 0;
  for (const auto& m : merges) {
    std::string a, b;
    if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return "BPE merge " + std::to_string(rank + 1) + " ('" + line + "') is not two tokens";
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    }
    const int ia = TokenToId(a), ib = TokenToId(b), in = TokenToId(a + b);
    if (ia < 0 || ib < 0 || in < 0) {
      return "BPE merge " + std::to_string(rank + 1) + " ('" + a + "' '" + b + "') names a token not in the vocabulary";
    }
    merges_[PairKey(ia, ib)] = Merge{rank++, in};
  }
  return "";
}

int HfBpe::TokenToId(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* HfBpe::IdToToken(int id) const {
  if (id < 0 || id >= size() || (tokens_[id].empty() && TokenToId("") != id)) return nullptr;
  return &tokens_[id];
}

void HfBpe::InitialIds(std::string_view word, bool byte_level, std::vector<int>* ids) const {
  int unk_pending = -1;  // tokenizers keeps one unk back to fuse it with the next
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    int id;
    if (byte_level) {
      const auto b = static_cast<unsigned char>(word[i++]);
      id = byte_level_ids_[b];
      ch = ByteLevelChar(b);
    } else {
      const size_t n = std::min(Utf8Length(static_cast<unsigned char>(word[i])), word.size() - i);
      ch.assign(word.substr(i, n));
      i += n;
      id = TokenToId(ch);
    }
    if (id >= 0) {
      if (unk_pending >= 0) ids->push_back(unk_pending);
      unk_pending = -1;
      ids->push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : ch) ids->push_back(byte_fallback_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk_pending >= 0 && !fuse_unk_) ids->push_back(unk_pending);
      unk_pending = unk_id_;
    }
  }
  if (unk_pending >= 0) ids->push_back(unk_pending);
}

void HfBpe::MergeAll(std::vector<int>* ids) const {
  const int n = static_cast<int>(ids->size());
  if (n < 2) return;
  std::vector<Symbol> symbols(n);
  std::priority_queue<QueuedMerge, std::vector<QueuedMerge>, std::greater<QueuedMerge>> queue;
  for (int i = 0; i < n; ++i) {
    symbols[i] = {(*ids)[i], i - 1, i + 1 < n ? i + 1 : -1, true};
    if (i + 1 < n) {
      const auto it = merges_.find(PairKey((*ids)[i], (*ids)[i + 1]));
      if (it != merges_.end()) queue.push({it->second.rank, i, it->second.new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& s = symbols[top.pos];
    if (!s.alive || s.next < 0) continue;
    const Symbol right = symbols[s.next];
    const auto it = merges_.find(PairKey(s.id, right.id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // an expired entry
    s.id = top.new_id;
    symbols[s.next].alive = false;
    s.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (s.prev >= 0) {
      const auto p = merges_.find(PairKey(symbols[s.prev].id, s.id));
      if (p != merges_.end()) queue.push({p->second.rank, s.prev, p->second.new_id});
    }
    if (s.next >= 0) {
      const auto q = merges_.find(PairKey(s.id, symbols[s.next].id));
      if (q != merges_.end()) queue.push({q->second.rank, top.pos, q->second.new_id});
    }
  }
  ids->clear();
  for (const Symbol& s : symbols) {
    if (s.alive) ids->push_back(s.id);
  }
}

void HfBpe::EncodeUncached(std::string_view word, bool byte_level, std::vector<int>* ids) const {
  if (ignore_merges_) {
    std::string whole;
    if (byte_level) {
      AppendByteLevel(word, &whole);
    } else {
      whole.assign(word);
    }
    if (const int id = TokenToId(whole); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  InitialIds(word, byte_level, ids);
  MergeAll(ids);
}

void HfBpe::Encode(std::string_view word, bool byte_level, std::vector<int>* ids) const {
  if (word.size() > kCachedWordBytes) {  // merged on its own: `ids` holds the words before it
    std::vector<int> word_ids;
    EncodeUncached(word, byte_level, &word_ids);
    ids->insert(ids->end(), word_ids.begin(), word_ids.end());
    return;
  }
  thread_local WordCache cache;
  if (cache.owner != instance_) {
    cache.words.clear();
    cache.owner = instance_;
  }
  const std::string key(word);
  const auto hit = cache.words.find(key);
  if (hit != cache.words.end()) {
    ids->insert(ids->end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<int> word_ids;
  EncodeUncached(word, byte_level, &word_ids);
  ids->insert(ids->end(), word_ids.begin(), word_ids.end());
  if (cache.words.size() >= kCacheEntries) cache.words.clear();
  cache.words.emplace(key, std::move(word_ids));
}

}  // namespace diloco::tokenize
