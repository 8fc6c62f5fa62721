#include "worker/tokenizer/hf_decoder.h"

#include "worker/tokenizer/hf_text.h"

namespace diloco::tokenize {
namespace {

// Replaces every `from` in s by `to`.
std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size()) {
    out.append(s, at, hit - at);
    out += to;
  }
  return out.append(s, at);
}

// The byte of a "<0xXX>" token, or -1.
int FallbackByte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = t[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// Strips up to n copies of the character c from the front (or back) of s, as tokenizers' Strip decoder.
std::string StripChars(const std::string& s, const std::string& c, int start, int stop) {
  size_t begin = 0, end = s.size();
  for (int i = 0; i < start && s.compare(begin, c.size(), c) == 0 && begin < end; ++i) begin += c.size();
  for (int i = 0; i < stop && end >= begin + c.size() && s.compare(end - c.size(), c.size(), c) == 0; ++i) {
    end -= c.size();
  }
  return s.substr(begin, end - begin);
}

}  // namespace

std::string HfDecoder::Parse(const nlohmann::json& j) {
  steps_.clear();
  present_ = !j.is_null();
  return present_ ? ParseOne(j) : "";
}

std::string HfDecoder::ParseOne(const nlohmann::json& j) {
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& d : j.at("decoders")) {
      if (std::string e = ParseOne(d); !e.empty()) return e;
    }
    return "";
  }
  if (type == "ByteLevel") {
    steps_.push_back({Kind::kByteLevel});
  } else if (type == "Metaspace") {
    const bool prefix = j.value("add_prefix_space", true);
    steps_.push_back(
        {Kind::kMetaspace, j.value("replacement", "\u2581"), j.value("prepend_scheme", prefix ? "always" : "never")});
  } else if (type == "Replace") {
    if (!j.at("pattern").contains("String")) return "the decoder Replace with a regex pattern is not supported";
    steps_.push_back({Kind::kReplace, j.at("pattern").at("String").get<std::string>(), j.at("content")});
  } else if (type == "ByteFallback") {
    steps_.push_back({Kind::kByteFallback});
  } else if (type == "Fuse") {
    steps_.push_back({Kind::kFuse});
  } else if (type == "Strip") {
    steps_.push_back({Kind::kStrip, j.value("content", " "), "", j.value("start", 0), j.value("stop", 0)});
  } else {
    return "the decoder " + (type.empty() ? j.dump() : type) +
           " is not supported (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)";
  }
  return "";
}

void HfDecoder::Apply(const Step& step, std::vector<std::string>& tokens) const {
  switch (step.kind) {
    case Kind::kByteLevel: {
      std::string bytes;
      for (const std::string& t : tokens) AppendFromByteLevel(t, &bytes);
      tokens = {RepairUtf8(bytes)};
      return;
    }
    case Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = ReplaceAll(tokens[i], step.a, i == 0 && step.b != "never" ? "" : " ");
      }
      return;
    case Kind::kReplace:
      for (std::string& t : tokens) t = ReplaceAll(t, step.a, step.b);
      return;
    case Kind::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens = {all};
      return;
    }
    case Kind::kStrip:
      for (std::string& t : tokens) t = StripChars(t, step.a, step.start, step.stop);
      return;
    case Kind::kByteFallback: {
      std::vector<std::string> out;
      std::string run;
      size_t run_bytes = 0;
      auto flush = [&] {
        if (run_bytes == 0) return;
        if (IsValidUtf8(run)) {
          out.push_back(run);
        } else {
          for (size_t i = 0; i < run_bytes; ++i) out.push_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_bytes = 0;
      };
      for (std::string& t : tokens) {
        if (const int b = FallbackByte(t); b >= 0) {
          run.push_back(static_cast<char>(b));
          ++run_bytes;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      tokens = std::move(out);
      return;
    }
  }
}

std::string HfDecoder::Decode(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const Step& s : steps_) Apply(s, tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace diloco::tokenize
