#include "worker/tokenizer/hf_pretokenizer.h"

namespace diloco::tokenize {
namespace {

// GPT-2's pre-tokenizer regex, as the tokenizers library's ByteLevel uses it.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A literal string as a PCRE2 pattern (\Q...\E, with any \E in it spelled out).
std::string QuoteLiteral(const std::string& s) {
  std::string out = "\\Q";
  for (size_t at = 0;;) {
    const size_t e = s.find("\\E", at);
    if (e == std::string::npos) {
      out.append(s, at);
      break;
    }
    out.append(s, at, e - at);
    out += "\\E\\\\E\\Q";
    at = e + 2;
  }
  return out + "\\E";
}

}  // namespace

std::string HfPreTokenizer::Parse(const nlohmann::json& j) {
  steps_.clear();
  byte_level_ = false;
  return j.is_null() ? "" : ParseOne(j);
}

std::string HfPreTokenizer::ParseOne(const nlohmann::json& j) {
  const std::string type = j.value("type", "");
  if (byte_level_) return "the pre-tokenizer " + type + " after ByteLevel is not supported";
  if (type == "Sequence") {
    for (const auto& p : j.at("pretokenizers")) {
      if (std::string e = ParseOne(p); !e.empty()) return e;
    }
    return "";
  }
  Step step;
  if (type == "ByteLevel") {
    byte_level_ = true;
    if (j.value("add_prefix_space", false)) steps_.push_back(Step{Kind::kByteLevelPrefix});
    if (!j.value("use_regex", true)) return "";
    step.kind = Kind::kRegexSplit;
    if (std::string e = step.regex.Compile(kGpt2Pattern); !e.empty()) return e;
    steps_.push_back(std::move(step));
    return "";
  }
  if (type == "Split") {
    const std::string behavior = j.value("behavior", "");
    if (behavior != "Isolated" && behavior != "Removed") {
      return "the pre-tokenizer Split with behavior " + behavior + " is not supported (Isolated, Removed)";
    }
    if (j.value("invert", false)) return "the pre-tokenizer Split with invert: true is not supported";
    const auto& pattern = j.at("pattern");
    const std::string regex = pattern.contains("Regex") ? pattern.at("Regex").get<std::string>()
                                                        : QuoteLiteral(pattern.at("String").get<std::string>());
    step.kind = Kind::kRegexSplit;
    step.removed = behavior == "Removed";
    if (std::string e = step.regex.Compile(regex); !e.empty()) return e;
    steps_.push_back(std::move(step));
    return "";
  }
  if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = j.value("replacement", "\u2581");
    step.prepend = j.value("prepend_scheme", j.value("add_prefix_space", true) ? "always" : "never");
    step.split = j.value("split", true);
    steps_.push_back(std::move(step));
    return "";
  }
  return "the pre-tokenizer " + (type.empty() ? j.dump() : type) +
         " is not supported (supported: ByteLevel, Split, Metaspace, Sequence)";
}

void HfPreTokenizer::Apply(const Step& step, std::vector<Piece>& pieces) const {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    if (step.kind == Kind::kByteLevelPrefix) {
      if (!p.continued && !p.text.empty() && p.text[0] != ' ') p.text.insert(0, " ");
      out.push_back(std::move(p));
      continue;
    }
    if (step.kind == Kind::kRegexSplit) {
      size_t gap = 0;
      step.regex.FindAll(p.text, [&](size_t begin, size_t end) {
        // continued is not passed on: a work item is cut where this split cuts too (work_items.h), so its first
        // piece is a piece of its own in the whole text, and a prefix step after the split gives it its prefix.
        if (begin > gap) out.push_back({p.text.substr(gap, begin - gap), p.first && gap == 0});
        if (!step.removed && end > begin) out.push_back({p.text.substr(begin, end - begin), p.first && begin == 0});
        gap = end;
      });
      if (gap < p.text.size()) out.push_back({p.text.substr(gap), p.first && gap == 0});
      continue;
    }
    std::string text;  // kMetaspace: spaces replaced, the replacement prepended, split before each replacement
    for (char c : p.text) c == ' ' ? text += step.replacement : text += c;
    const bool starts = text.compare(0, step.replacement.size(), step.replacement) == 0;
    if (!starts && !p.continued && (step.prepend == "always" || (step.prepend == "first" && p.first))) {
      text.insert(0, step.replacement);
    }
    if (!step.split) {
      out.push_back({std::move(text), p.first, p.continued});
      continue;
    }
    size_t begin = 0;
    for (size_t at = text.find(step.replacement, 1); at != std::string::npos;
         at = text.find(step.replacement, at + 1)) {
      out.push_back({text.substr(begin, at - begin), p.first && begin == 0, p.continued && begin == 0});
      begin = at;
    }
    if (begin < text.size()) out.push_back({text.substr(begin), p.first && begin == 0, p.continued && begin == 0});
  }
  pieces = std::move(out);
}

void HfPreTokenizer::ForEachWord(const std::string& piece, bool at_start, bool continued,
                                 const std::function<void(std::string_view)>& on_word) const {
  if (steps_.size() == 1 && steps_[0].kind == Kind::kRegexSplit) {  // the common case, without copies
    const Step& s = steps_[0];
    size_t gap = 0;
    s.regex.FindAll(piece, [&](size_t begin, size_t end) {
      if (begin > gap) on_word(std::string_view(piece).substr(gap, begin - gap));
      if (!s.removed && end > begin) on_word(std::string_view(piece).substr(begin, end - begin));
      gap = end;
    });
    if (gap < piece.size()) on_word(std::string_view(piece).substr(gap));
    return;
  }
  std::vector<Piece> pieces = {{piece, at_start, continued}};
  for (const Step& s : steps_) Apply(s, pieces);
  for (const Piece& p : pieces) {
    if (!p.text.empty()) on_word(p.text);
  }
}

}  // namespace diloco::tokenize
