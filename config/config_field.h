// One key of the config schema (config.h) as a Field: how to set it from a YAML node (the type check), how to print
// it, which values it allows beyond its type (its range check) and its one-line doc. Fields() (config_fields.h) is
// the table of every key; the loader (config_loader.cc) parses, validates, renders and hashes through it and
// `diloco-ctl config-reference` prints it (config_reference.h). Internal to config/. Rules and Fields are immutable
// once built; thread-safe.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "config/config.h"

namespace diloco {

// The values a numeric key allows: a predicate and its words for errors and the reference ("> 0", "in [0, 1)").
struct NumberRule {
  std::string text;
  std::function<bool(double)> allows;
};

// The values a string key allows, likewise ("cpu, cuda or cuda:N").
struct StringRule {
  std::string text;
  std::function<bool(const std::string&)> allows;
};

NumberRule Above(double lo);    // > lo
NumberRule AtLeast(double lo);  // >= lo
// lo..hi; `bounds` "[]", "[)", "(]" or "()" says which ends are allowed.
NumberRule InRange(double lo, double hi, const char* bounds = "[]");
StringRule DeviceName();  // cpu, cuda or cuda:N (whether the machine has it is checked where it runs)
StringRule HostPort();
StringRule Utf8Text();  // status, status.json and exports carry it as text
StringRule HostPortOrEmpty();
StringRule NotEmpty();

struct Field {
  std::string key;      // "section.name"
  std::string type;     // "integer", "number", "bool", "string", "list of strings" or "enum"
  std::string allowed;  // the values allowed beyond the type ("> 0", "'sync' or 'async'"); "" = any of the type
  std::vector<std::string> choices;  // an enum's names (config_enums.h), in declaration order; else empty
  std::string doc;                   // one line: what the key does
  std::function<absl::Status(Config&, const YAML::Node&)> set;  // fails on a wrong type or an unknown enum name
  std::function<absl::Status(const Config&)> check;             // fails when the value is outside `allowed`
  std::function<std::string(const Config&)> get;
  std::function<void(Config& to, const Config& from)> copy;
  std::function<bool(const Config&, const Config&)> equal;
};

namespace field_internal {

using StringList = std::vector<std::string>;

template <typename T, typename = void>
struct IsConfigEnum : std::false_type {};
template <typename T>
struct IsConfigEnum<T, std::void_t<decltype(EnumNames<T>::kNames)>> : std::true_type {};

std::string Show(const StringList& v);
std::string Show(const std::string& v);
std::string Show(bool v);
std::string Show(int64_t v);
std::string Show(double v);
template <typename E, typename = std::enable_if_t<IsConfigEnum<E>::value>>
std::string Show(E v) {
  return std::string(EnumName(v));
}

// "a value of type T" in error messages, and T's name in the reference.
template <typename T>
const char* TypeWords() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) return "an integer";
  if constexpr (std::is_floating_point_v<T>) return "a number";
  return "a string";
}
template <typename T>
const char* TypeName() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) return "integer";
  if constexpr (std::is_floating_point_v<T>) return "number";
  if constexpr (std::is_same_v<T, StringList>) return "list of strings";
  if constexpr (IsConfigEnum<T>::value) return "enum";
  return "string";
}

absl::Status DecodeStringList(const std::string& key, const YAML::Node& n, StringList* out);
// An integer written with a leading zero ("010", "-07"): yaml-cpp reads it as octal (8), as YAML 1.1 does, where YAML
// 1.2 reads decimal (10); integer keys refuse it rather than pick one.
bool HasLeadingZero(const std::string& scalar);
absl::Status OutsideRule(const std::string& key, const std::string& rule, const std::string& got);

// Decodes `n` into a T: the type check of every key (and the name check of an enum).
template <typename T>
absl::Status Decode(const std::string& key, const YAML::Node& n, T* value) {
  if constexpr (std::is_same_v<T, StringList>) {
    return DecodeStringList(key, n, value);
  } else if constexpr (IsConfigEnum<T>::value) {
    if (n.IsScalar() && EnumFromName(n.Scalar(), value)) return absl::OkStatus();
    const std::string got = n.IsScalar() ? "'" + n.Scalar() + "'" : n.IsNull() ? "''" : "a list or map";
    return absl::InvalidArgumentError(key + ": expected " + EnumChoices<T>() + ", got " + got);
  } else {
    if constexpr (std::is_same_v<T, std::string>) {
      if (n.IsNull()) {
        value->clear();
        return absl::OkStatus();
      }
    }
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (n.IsScalar() && HasLeadingZero(n.Scalar())) {
        return absl::InvalidArgumentError(key + ": '" + n.Scalar() +
                                          "' has a leading zero, which YAML 1.1 tools read as octal and YAML 1.2 "
                                          "ones as decimal; write the number without it");
      }
    }
    if (n.IsScalar() && YAML::convert<T>::decode(n, *value)) {
      if constexpr (std::is_floating_point_v<T>) {  // YAML's .inf and .nan: no key takes them (outer.lr: .inf
        if (!std::isfinite(*value)) {               // would fail every outer step's finiteness check)
          return absl::InvalidArgumentError(key + ": expected a finite number, got '" + n.Scalar() + "'");
        }
      }
      return absl::OkStatus();
    }
    const std::string got = n.IsScalar() ? "'" + n.Scalar() + "'" : n.IsNull() ? "nothing" : "a list or map";
    return absl::InvalidArgumentError(key + ": expected " + TypeWords<T>() + ", got " + got);
  }
}

// The range check of a key: OK when `rule` allows the value (every value when the rule is absent).
template <typename T, typename Rule>
absl::Status Check(const std::string& key, const T& v, const Rule& rule) {
  if constexpr (std::is_same_v<Rule, NumberRule>) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "a NumberRule needs a numeric key");
    return rule.allows(static_cast<double>(v)) ? absl::OkStatus() : OutsideRule(key, rule.text, Show(v));
  } else if constexpr (std::is_same_v<Rule, StringRule>) {
    static_assert(std::is_same_v<T, std::string>, "a StringRule needs a string key");
    return rule.allows(v) ? absl::OkStatus() : OutsideRule(key, rule.text, "'" + v + "'");
  } else {
    return absl::OkStatus();
  }
}

struct NoRule {
  std::string text;
};

}  // namespace field_internal

// The Field of Config::*section.*member, named `key`; `rule` (a NumberRule or a StringRule) bounds its values, an
// enum's allowed values are its names (config_enums.h).
template <typename Section, typename T, typename Rule = field_internal::NoRule>
Field MakeField(std::string key, Section Config::*section, T Section::*member, Rule rule, std::string doc) {
  namespace fi = field_internal;
  Field f;
  f.key = key;
  f.type = fi::TypeName<T>();
  if constexpr (fi::IsConfigEnum<T>::value) {
    f.allowed = EnumChoices<T>();
    for (const auto& [value, name] : EnumNames<T>::kNames) f.choices.emplace_back(name);
  } else {
    f.allowed = rule.text;
  }
  f.doc = std::move(doc);
  f.set = [key, section, member](Config& c, const YAML::Node& n) -> absl::Status {
    T value{};
    absl::Status s = fi::Decode(key, n, &value);
    if (s.ok()) (c.*section).*member = std::move(value);
    return s;
  };
  f.check = [key, section, member, rule](const Config& c) { return fi::Check(key, (c.*section).*member, rule); };
  f.get = [section, member](const Config& c) { return fi::Show((c.*section).*member); };
  f.copy = [section, member](Config& to, const Config& from) { (to.*section).*member = (from.*section).*member; };
  f.equal = [section, member](const Config& a, const Config& b) {
    return (a.*section).*member == (b.*section).*member;
  };
  return f;
}

// A key with no range beyond its type (or an enum).
template <typename Section, typename T>
Field MakeField(std::string key, Section Config::*section, T Section::*member, std::string doc) {
  return MakeField(std::move(key), section, member, field_internal::NoRule{}, std::move(doc));
}

}  // namespace diloco
