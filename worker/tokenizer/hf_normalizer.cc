#include "worker/tokenizer/hf_normalizer.h"

#include "worker/tokenizer/hf_text.h"

namespace diloco::tokenize {

std::string HfNormalizer::Parse(const nlohmann::json& j) {
  steps_.clear();
  return j.is_null() ? "" : ParseOne(j);
}

std::string HfNormalizer::ParseOne(const nlohmann::json& j) {
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& n : j.at("normalizers")) {
      if (std::string e = ParseOne(n); !e.empty()) return e;
    }
    return "";
  }
  if (type == "Prepend") {
    steps_.push_back({Kind::kPrepend, "", j.at("prepend").get<std::string>()});
    return "";
  }
  if (type == "Replace") {
    const auto& pattern = j.at("pattern");
    if (!pattern.contains("String")) return "the normalizer Replace with a regex pattern is not supported";
    steps_.push_back({Kind::kReplace, pattern.at("String").get<std::string>(), j.at("content").get<std::string>()});
    if (steps_.back().from.empty()) return "the normalizer Replace with an empty pattern is not supported";
    return "";
  }
  if (type == "NFC") {
    steps_.push_back({Kind::kNfc, "", ""});
    return "";
  }
  return "the normalizer " + (type.empty() ? j.dump() : type) +
         " is not supported (supported: Sequence, Prepend, Replace, NFC)";
}

void HfNormalizer::Apply(std::string* text, bool continued) const {
  for (const Step& s : steps_) {
    if (text->empty()) return;
    switch (s.kind) {
      case Kind::kPrepend:
        if (!continued) text->insert(0, s.to);
        break;
      case Kind::kReplace: {
        if (text->find(s.from) == std::string::npos) break;
        std::string out;
        out.reserve(text->size() + text->size() / 4);
        size_t at = 0;
        for (size_t hit; (hit = text->find(s.from, at)) != std::string::npos; at = hit + s.from.size()) {
          out.append(*text, at, hit - at);
          out += s.to;
        }
        out.append(*text, at);
        *text = std::move(out);
        break;
      }
      case Kind::kNfc:
        *text = NormalizeNfc(*text);
        break;
    }
  }
}

}  // namespace diloco::tokenize
