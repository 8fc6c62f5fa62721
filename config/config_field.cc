#include "config/config_field.h"

#include <cmath>
#include <sstream>

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

StringRule HostPortOrEmpty() {
  return {"HOST:PORT (e.g. 127.0.0.1:9464; port 0 picks a free one) or \"\" (off)", [](const std::string& m) {
            if (m.empty()) return true;
            const size_t colon = m.rfind(':');
            if (colon == std::string::npos || colon == 0) return false;
            const std::string port = m.substr(colon + 1);
            return AllDigits(port) && port.size() <= 5 && std::stoi(port) <= 65535;
          }};
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
