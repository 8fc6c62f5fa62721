#include "worker/tokenizer/hf_text.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
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

// The code point at text[*i] (advancing *i past it); false for an ill-formed sequence, after which *i has advanced
// past its maximal subpart (Unicode's Table 3-7 and "U+FFFD Substitution of Maximal Subparts", as Python's
// decode(errors="replace"), Rust's from_utf8_lossy and WHATWG do): the longest prefix of a well-formed sequence, or
// one byte when the first byte can start none (C0, C1, F5..FF, a lone continuation byte).
bool DecodeUtf8(std::string_view text, size_t* i, uint32_t* cp) {
  const auto c = static_cast<unsigned char>(text[*i]);
  if (c < 0x80) {
    ++*i;
    *cp = c;
    return true;
  }
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range (Table 3-7); later bytes are always 80..BF
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // no overlong forms
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    ++*i;
    return false;
  }
  uint32_t v = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    const size_t at = *i + k;
    const auto d = at < text.size() ? static_cast<unsigned char>(text[at]) : 0;
    const bool fits = at < text.size() && (k == 1 ? d >= lo && d <= hi : (d & 0xC0) == 0x80);
    if (!fits) {
      *i += k;  // the maximal subpart: the lead byte and the continuation bytes that fit so far
      return false;
    }
    v = (v << 6) | (d & 0x3F);
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

uint32_t CodePointAt(std::string_view text, size_t pos, size_t* length) {
  size_t i = pos;
  uint32_t cp = 0xFFFD;
  DecodeUtf8(text, &i, &cp);
  *length = i - pos;
  return cp;
}

uint32_t CodePointBefore(std::string_view text, size_t pos, size_t* length) {
  size_t start = pos - 1;
  while (start > 0 && pos - start < 4 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  size_t n = 0;
  const uint32_t cp = CodePointAt(text, start, &n);
  if (start + n != pos) {  // not one whole code point: the byte before pos alone
    *length = 1;
    return 0xFFFD;
  }
  *length = n;
  return cp;
}

bool IsWordChar(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  const int8_t type = u_charType(c);
  return type == U_NON_SPACING_MARK || type == U_COMBINING_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION;
}

bool IsWhiteSpace(uint32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE); }

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
