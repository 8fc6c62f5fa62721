// Text helpers of the tokenizer.json path (hf_tokenizer.h): UTF-8 walking and repair, GPT-2's byte-to-character map
// of the ByteLevel pre-tokenizer and decoder, and Unicode NFC (ICU, the one normalizer form we implement). Stateless
// functions over immutable tables built once; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace diloco::tokenize {

// The length in bytes of the UTF-8 character starting with byte c (1 for a stray continuation or invalid byte).
inline size_t Utf8Length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

// Appends code point cp as UTF-8.
void AppendUtf8(uint32_t cp, std::string* out);

// True when text is valid UTF-8.
bool IsValidUtf8(std::string_view text);

// In valid UTF-8 `text`, the code point that starts at byte `pos` / ends just before it, and its length in bytes.
uint32_t CodePointAt(std::string_view text, size_t pos, size_t* length);
uint32_t CodePointBefore(std::string_view text, size_t pos, size_t* length);
// As the Rust regex crate's Unicode \w (Alphabetic, a mark Mn / Mc / Me, Nd, Pc such as '_', Join_Control; not No
// such as superscript two, U+00B2): what the tokenizers library's single_word added tokens must not touch (its
// added_vocabulary tests its neighbours with \w; ICU's properties here).
bool IsWordChar(uint32_t cp);
// As Rust's char::is_whitespace() (the White_Space property): what lstrip / rstrip added tokens take in.
bool IsWhiteSpace(uint32_t cp);

// text with each maximal subpart of an ill-formed UTF-8 sequence replaced by U+FFFD (as Rust's
// String::from_utf8_lossy and Python's decode(errors="replace") do).
std::string RepairUtf8(std::string_view text);

// GPT-2's bytes_to_unicode(): the UTF-8 of the printable character that stands for byte b.
const std::string& ByteLevelChar(unsigned char b);

// Appends the byte-level form of raw bytes (each byte as its ByteLevelChar).
void AppendByteLevel(std::string_view bytes, std::string* out);

// Appends the bytes a byte-level string stands for; a character outside the map is kept as its own UTF-8.
void AppendFromByteLevel(std::string_view text, std::string* out);

// text in Unicode normalization form C (ICU); ASCII text is returned as is.
std::string NormalizeNfc(std::string_view text);

}  // namespace diloco::tokenize
