#include "worker/tokenizer/hf_text.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <array>
#include <unordered_map>

namespace diloco::tokenize {
namespace {

// The code point of byte b in GPT-2's map: printable Latin-1 bytes stand for themselves, the others for 256 + n.
std::array<uint32_t, 256> ByteCodePoints() {
  std::array<uint32_t, 256> cps{};
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cps[b] = printable ? static_cast<uint32_t>(b) : next++;
  }
  return cps;
}

struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::unordered_map<uint32_t, unsigned char> bytes;  // code point -> byte
  ByteLevelTables() {
    const auto cps = ByteCodePoints();
    for (int b = 0; b < 256; ++b) {
      AppendUtf8(cps[b], &chars[b]);
      bytes[cps[b]] = static_cast<unsigned char>(b);
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables tables;
  return tables;
}

// The code point at text[*i] (advancing *i); false for an invalid sequence (then *i advances by one).
bool DecodeUtf8(std::string_view text, size_t* i, uint32_t* cp) {
  const auto c = static_cast<unsigned char>(text[*i]);
  const size_t n = Utf8Length(c);
  if (n == 1) {
    ++*i;
    *cp = c;
    return c < 0x80;
  }
  if (*i + n > text.size()) {
    ++*i;
    return false;
  }
  uint32_t v = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(text[*i + k]);
    if ((d & 0xC0) != 0x80) {
      ++*i;
      return false;
    }
    v = (v << 6) | (d & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
    ++*i;
    return false;
  }
  *i += n;
  *cp = v;
  return true;
}

}  // namespace

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp = 0;
    if (!DecodeUtf8(text, &i, &cp)) return false;
  }
  return true;
}

std::string RepairUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    uint32_t cp = 0;
    if (DecodeUtf8(text, &i, &cp)) {
      out.append(text.substr(at, i - at));
    } else {
      AppendUtf8(0xFFFD, &out);
    }
  }
  return out;
}

const std::string& ByteLevelChar(unsigned char b) { return Tables().chars[b]; }

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const auto& chars = Tables().chars;
  for (char c : bytes) out->append(chars[static_cast<unsigned char>(c)]);
}

void AppendFromByteLevel(std::string_view text, std::string* out) {
  const auto& bytes = Tables().bytes;
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    uint32_t cp = 0;
    const bool valid = DecodeUtf8(text, &i, &cp);
    const auto it = valid ? bytes.find(cp) : bytes.end();
    if (it != bytes.end()) {
      out->push_back(static_cast<char>(it->second));
    } else {
      out->append(text.substr(at, i - at));
    }
  }
}

std::string NormalizeNfc(std::string_view text) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) return std::string(text);
  const icu::UnicodeString in = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
  if (nfc->isNormalized(in, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  const icu::UnicodeString normalized = nfc->normalize(in, status);
  std::string out;
  normalized.toUTF8String(out);
  return U_FAILURE(status) ? std::string(text) : out;
}

}  // namespace diloco::tokenize
