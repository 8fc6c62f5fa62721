// The key table Fields() (config/config_fields.h): every key carries a type, a doc and its range, the loader enforces
// each range on the resolved config with a message naming the key and what is allowed, and the Markdown reference
// (config/config_reference.h, docs/configuration.md) lists every key. The committed docs/configuration.md is compared
// with `diloco-ctl config-reference` by the ctest config_reference (tests/unit/check_config_reference.cmake).
#include "config/config_fields.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>

#include "config/config_loader.h"
#include "config/config_reference.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ConfigFieldsTest, EveryKeyHasATypeAOneLineDocAndKnownSection) {
  std::set<std::string> keys;
  for (const Field& f : Fields()) {
    EXPECT_TRUE(keys.insert(f.key).second) << f.key << " twice";
    EXPECT_NE(f.key.find('.'), std::string::npos) << f.key;
    EXPECT_FALSE(f.type.empty()) << f.key;
    EXPECT_FALSE(f.doc.empty()) << f.key;
    EXPECT_EQ(f.doc.find('\n'), std::string::npos) << f.key << ": one line";
    EXPECT_EQ(FindField(f.key), &f);
    if (f.type == "enum") {
      ASSERT_FALSE(f.choices.empty()) << f.key;
      for (const std::string& name : f.choices) EXPECT_THAT(f.allowed, HasSubstr("'" + name + "'")) << f.key;
    } else {
      EXPECT_TRUE(f.choices.empty()) << f.key;
    }
  }
  EXPECT_EQ(FindField("inner.lrr"), nullptr);
  EXPECT_EQ(FindField("inner.lr")->type, "number");
  EXPECT_EQ(FindField("inner.steps")->type, "integer");
  EXPECT_EQ(FindField("data.files")->type, "list of strings");
  EXPECT_EQ(FindField("outer.mode")->allowed, "'sync' or 'async'");
  EXPECT_EQ(FindField("outer.momentum")->allowed, "in [0, 1)");
  EXPECT_EQ(FindField("comm.chunk_bytes")->allowed, "in [1, 268435456]");
}

// Every numeric range of the table, at both ends: the first value outside is refused with "KEY: must be RANGE, got V"
// (from the file and from --set alike), the bound itself passes when the range includes it.
TEST(ConfigFieldsTest, EveryNumericRangeIsEnforcedAtItsBounds) {
  const std::regex one_sided(R"(^(>=?) (-?[0-9.]+)$)");
  const std::regex interval(R"(^in ([\[(])(-?[0-9.]+), (-?[0-9.]+)([\])])$)");
  int ranged = 0;
  for (const Field& f : Fields()) {
    std::smatch m;
    std::vector<std::pair<std::string, bool>> cases;  // value, allowed
    if (std::regex_match(f.allowed, m, one_sided)) {
      const double lo = std::stod(m[2].str());
      cases = {{m[2].str(), m[1] == ">="}, {std::to_string(static_cast<int64_t>(lo) - 1), false}};
    } else if (std::regex_match(f.allowed, m, interval)) {
      const double lo = std::stod(m[2].str()), hi = std::stod(m[3].str());
      cases = {{m[2].str(), m[1] == "["},
               {m[3].str(), m[4] == "]"},
               {std::to_string(static_cast<int64_t>(lo) - 1), false},
               {std::to_string(static_cast<int64_t>(hi) + 1), false}};
    } else {
      continue;
    }
    ++ranged;
    const std::string section = f.key.substr(0, f.key.find('.'));
    for (const auto& [value, allowed] : cases) {
      absl::StatusOr<Config> from_flag = ParseConfig("", "my.yaml", {f.key + "=" + value});
      const std::string yaml = section + ": {" + f.key.substr(section.size() + 1) + ": " + value + "}";
      absl::StatusOr<Config> from_file = ParseConfig(yaml, "my.yaml");
      if (allowed) {
        // An allowed bound may still break a cross-key rule (e.g. comm.fragments), never its own range.
        if (!from_flag.ok()) EXPECT_THAT(Message(from_flag.status()), Not(HasSubstr(f.key + ": must be "))) << value;
        continue;
      }
      const std::string expected = f.key + ": must be " + f.allowed + ", got ";
      ASSERT_FALSE(from_flag.ok()) << f.key << "=" << value;
      EXPECT_THAT(Message(from_flag.status()), HasSubstr(expected)) << value;
      ASSERT_FALSE(from_file.ok()) << yaml;
      EXPECT_THAT(Message(from_file.status()), HasSubstr("my.yaml: " + expected)) << yaml;
    }
  }
  EXPECT_GE(ranged, 40) << "the table's numeric ranges";
}

TEST(ConfigFieldsTest, RangesNameTheKeyTheRuleAndTheValue) {
  struct Case {
    std::string set;
    std::string expected;  // "" = loads
  };
  for (const Case& k : {
           Case{"inner.lr=0", "--set inner.lr=0: inner.lr: must be > 0, got 0"},
           Case{"inner.lr=.nan", "inner.lr: expected a finite number, got '.nan'"},
           Case{"inner.weight_decay=.nan", "inner.weight_decay: expected a finite number, got '.nan'"},
           Case{"outer.momentum=0", ""},
           Case{"outer.momentum=1", "outer.momentum: must be in [0, 1), got 1"},
           Case{"data.val_fraction=0.5", ""},
           Case{"data.val_fraction=1", "data.val_fraction: must be in (0, 1), got 1"},
           Case{"model.vocab_size=5000000000", "model.vocab_size: must be in [1, 4294967296], got 5000000000"},
           Case{"workers.slowdown=0.5", "workers.slowdown: must be >= 1, got 0.5"},
           Case{"workers.device=cuda:1", ""},
           Case{"workers.device=gpu0", "workers.device: must be cpu, cuda or cuda:N, got 'gpu0'"},
           Case{"coordinator.device=cuda:x", "coordinator.device: must be cpu, cuda or cuda:N, got 'cuda:x'"},
           Case{"coordinator.metrics_listen=:9464", "coordinator.metrics_listen: must be HOST:PORT"},
           Case{"run.output_dir=", "run.output_dir: must be a non-empty path, got ''"},
           Case{"model.bos_token_id=-1", ""},
           Case{"model.bos_token_id=-2", "model.bos_token_id: must be >= -1, got -2"},
           Case{"model.eos_token_id=512", "model.bos_token_id / eos_token_id: -1 (none) or a token id below"},
           Case{"comm.overlap_steps=-1", "comm.overlap_steps: must be >= 0, got -1"},
           Case{"comm.overlap_steps=51", "comm.overlap_steps: must be in [0, inner.steps / comm.fragments = 50]"},
       }) {
    absl::StatusOr<Config> c = ParseConfig("", "my.yaml", {k.set});
    if (k.expected.empty()) {
      EXPECT_TRUE(c.ok()) << k.set << ": " << c.status();
    } else {
      ASSERT_FALSE(c.ok()) << k.set;
      EXPECT_THAT(Message(c.status()), HasSubstr(k.expected)) << k.set;
    }
  }
}

// Ranges apply to the resolved config: a value out of range in the file that --set replaces is no error.
TEST(ConfigFieldsTest, RangesApplyToTheResolvedConfig) {
  absl::StatusOr<Config> c =
      ParseConfig("inner: {steps: 0}\nworkers: {device: gpu0}\n", "my.yaml", {"inner.steps=5", "workers.device=cpu"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->inner.steps, 5);
}

TEST(ConfigReferenceTest, ListsEveryKeyWithTypeDefaultAllowedValuesAndDoc) {
  const std::string md = ConfigReferenceMarkdown();
  EXPECT_THAT(md, HasSubstr("Generated by `diloco-ctl config-reference`"));
  for (const auto& [key, value] : ConfigKeysWithDefaults()) {
    const Field* f = FindField(key);
    ASSERT_NE(f, nullptr) << key;
    EXPECT_THAT(md, HasSubstr("| `" + key + "` | " + f->type + " | `" + value + "` | ")) << key;
  }
  EXPECT_THAT(md, HasSubstr("| `outer.momentum` | number | `0.9` | in [0, 1) | outer momentum |\n"));
  EXPECT_THAT(md, HasSubstr("| `comm.codec` | enum | `fp32` | `fp32`, `bf16`, `fp16`, `int8`, `int4`, `topk` | "));
  EXPECT_THAT(md, HasSubstr("| `coordinator.metrics_listen` | string | `\"\"` | HOST:PORT"));
  EXPECT_THAT(md, HasSubstr("\\<run.output_dir>/data")) << "'<' escaped: it would open an HTML tag";
  // Every section opens with its one-line doc before its table.
  std::string section;
  for (const Field& f : Fields()) {
    const std::string s = f.key.substr(0, f.key.find('.'));
    if (s == section) continue;
    section = s;
    const size_t at = md.find("\n## " + section + "\n\n");
    ASSERT_NE(at, std::string::npos) << section;
    EXPECT_NE(md[at + section.size() + 6], '|') << section << " has no doc line";
  }
}

}  // namespace
}  // namespace diloco
