#include "config/config_field.h"

#include <cmath>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace diloco {
namespace {

// A bound as the reference prints it: integers in full (4294967296, not 4.29497e+09).
std::string Number(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  return absl::StrCat(v);
}

bool AllDigits(const std::string& s, size_t from = 0) {
  return s.size() > from && s.find_first_not_of("0123456789", from) == std::string::npos;
}

}  // namespace

NumberRule Above(double lo) {
  return {absl::StrCat("> ", Number(lo)), [lo](double v) { return v > lo; }};
}

NumberRule AtLeast(double lo) {
  return {absl::StrCat(">= ", Number(lo)), [lo](double v) { return v >= lo; }};
}

NumberRule InRange(double lo, double hi, const char* bounds) {
  const bool lo_in = bounds[0] == '[';
  const bool hi_in = bounds[1] == ']';
  return {absl::StrCat("in ", std::string(1, bounds[0]), Number(lo), ", ", Number(hi), std::string(1, bounds[1])),
          [lo, hi, lo_in, hi_in](double v) { return (lo_in ? v >= lo : v > lo) && (hi_in ? v <= hi : v < hi); }};
}

StringRule DeviceName() {
  return {"cpu, cuda or cuda:N", [](const std::string& d) {
            return d == "cpu" || d == "cuda" || (absl::StartsWith(d, "cuda:") && AllDigits(d, 5));
          }};
}

namespace {
bool IsHostPort(const std::string& m) {
  const size_t colon = m.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string port = m.substr(colon + 1);
  return AllDigits(port) && port.size() <= 5 && std::stoi(port) <= 65535;
}

// Well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points above U+10FFFF).
bool IsUtf8(const std::string& text) {
  static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};  // the smallest code point of each length
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    const int n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;  // more
    if (n < 0 || end - p < n + 1) return false;
    uint32_t cp = n == 0 ? c : c & (0x3Fu >> n);
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3Fu);
    }
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    p += n + 1;
  }
  return true;
}
}  // namespace

StringRule Utf8Text() { return {"UTF-8 text", IsUtf8}; }

StringRule HostPort() { return {"HOST:PORT", IsHostPort}; }

StringRule HostPortOrEmpty() {
  return {"HOST:PORT (e.g. 127.0.0.1:9464; port 0 picks a free one) or \"\" (off)",
          [](const std::string& m) { return m.empty() || IsHostPort(m); }};
}

StringRule NotEmpty() {
  return {"a non-empty path", [](const std::string& s) { return !s.empty(); }};
}

namespace field_internal {

std::string Show(const StringList& v) { return absl::StrCat("[", absl::StrJoin(v, ", "), "]"); }
std::string Show(const std::string& v) { return v.empty() ? "\"\"" : v; }
std::string Show(bool v) { return v ? "true" : "false"; }
std::string Show(int64_t v) { return absl::StrCat(v); }
std::string Show(double v) {
  std::ostringstream os;  // the rendering the config hash was first defined over
  os << v;
  return os.str();
}

// A list key (data.files): a YAML sequence of strings, or one string for a list of one; null is the empty list.
bool HasLeadingZero(const std::string& scalar) {
  size_t i = !scalar.empty() && (scalar[0] == '-' || scalar[0] == '+') ? 1 : 0;
  return scalar.size() >= i + 2 && scalar[i] == '0' && absl::ascii_isdigit(static_cast<unsigned char>(scalar[i + 1]));
}

absl::Status DecodeStringList(const std::string& key, const YAML::Node& n, StringList* out) {
  out->clear();
  if (n.IsNull()) return absl::OkStatus();
  if (n.IsScalar()) {
    out->push_back(n.Scalar());
    return absl::OkStatus();
  }
  if (n.IsSequence()) {
    for (const YAML::Node& item : n) {
      if (!item.IsScalar()) return absl::InvalidArgumentError(absl::StrCat(key, ": expected a list of strings"));
      out->push_back(item.Scalar());
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(key, ": expected a list of strings, got a map"));
}

absl::Status OutsideRule(const std::string& key, const std::string& rule, const std::string& got) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": must be ", rule, ", got ", got));
}

}  // namespace field_internal
}  // namespace diloco
