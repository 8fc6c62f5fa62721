// The include rules (docs/development.md, "Layout"), checked on the source tree: coordinator and worker never include
// each other (one named exception: coordinator/model_host.{h,cc} hosts the model of worker/lm), proto/ and config/
// include neither, the launcher (scripts/launch) speaks only proto/ and config/, and diloco-ctl (scripts/ctl) only
// those and worker/lm's models and weight I/O. proto/ may include config/config_enums.h, the config's plain enum
// vocabulary (no code, no dependencies). A forbidden include fails this test with the file, the line and the rule it
// breaks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace diloco {
namespace {

namespace fs = std::filesystem;

struct Rule {
  std::string folder;                   // files under this folder of the tree ...
  std::vector<std::string> forbidden;   // ... may not include headers under these folders ...
  std::vector<std::string> exceptions;  // ... except these files (paths relative to the tree), which may
  std::vector<std::string> allowed;     // ... and these headers are allowed whatever the folder
  std::string why;
};

const std::vector<Rule>& Rules() {
  static const std::vector<Rule> rules = {
      {"coordinator",
       {"worker/"},
       {"coordinator/model_host.h", "coordinator/model_host.cc"},
       {},
       "the coordinator knows no model: only coordinator/model_host.{h,cc} may include worker/"},
      {"worker", {"coordinator/"}, {}, {}, "a worker never includes the coordinator"},
      {"proto",
       {"coordinator/", "worker/", "config/"},
       {},
       {"config/config_enums.h"},
       "proto/ is the bottom layer: it includes neither coordinator/, worker/ nor config/ (but config_enums.h)"},
      {"config", {"coordinator/", "worker/"}, {}, {}, "config/ includes neither coordinator/ nor worker/"},
      {"scripts/launch", {"coordinator/", "worker/"}, {}, {}, "the launcher is a front end of proto/ and config/"},
      {"scripts/ctl",
       {"coordinator/", "worker/"},
       {},
       {"worker/lm/generate.h", "worker/lm/init_from.h", "worker/lm/language_model.h", "worker/lm/safetensors.h",
        "worker/data/token_manifest.h"},
       "diloco-ctl is a front end of proto/ and config/; of the worker it uses only the models, their weight I/O and "
       "the token cache's manifest"},
  };
  return rules;
}

bool StartsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  for (const std::string& x : v) {
    if (x == s) return true;
  }
  return false;
}

// Every broken rule in the tree at `root`, as "file:line: #include \"header\" (why)".
std::vector<std::string> Violations(const fs::path& root) {
  static const std::regex kInclude(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<std::string> out;
  for (const Rule& rule : Rules()) {
    if (!fs::exists(root / rule.folder)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / rule.folder)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".h" && ext != ".cc")) continue;
      const std::string file = fs::relative(entry.path(), root).generic_string();
      if (Contains(rule.exceptions, file)) continue;
      std::ifstream in(entry.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        std::smatch m;
        if (!std::regex_search(line, m, kInclude)) continue;
        const std::string header = m[1];
        if (Contains(rule.allowed, header)) continue;
        for (const std::string& folder : rule.forbidden) {
          if (StartsWith(header, folder)) {
            out.push_back(file + ":" + std::to_string(n) + ": #include \"" + header + "\" (" + rule.why + ")");
          }
        }
      }
    }
  }
  return out;
}

TEST(IncludeRulesTest, TheSourceTreeKeepsDesignSection3) {
  const std::vector<std::string> violations = Violations(DILOCO_SOURCE_DIR);
  std::string all;
  for (const std::string& v : violations) all += v + "\n";
  EXPECT_TRUE(violations.empty()) << all;
}

// The checker itself: a scratch tree with one forbidden include of each kind and the allowed ones.
TEST(IncludeRulesTest, ReportsEveryForbiddenIncludeWithItsFileAndLine) {
  const fs::path root = fs::temp_directory_path() / ("include_rules_" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto write = [&](const std::string& file, const std::string& text) {
    fs::create_directories((root / file).parent_path());
    std::ofstream(root / file) << text;
  };
  write("coordinator/core.cc", "#include \"coordinator/core.h\"\n#include \"worker/lm/transformer.h\"\n");
  write("coordinator/model_host.cc", "#include \"worker/lm/transformer.h\"\n");  // the named exception
  write("worker/loop.cc",
        "// #include \"coordinator/x.h\" in a comment is not an include\n"
        "  #  include \"coordinator/round_policy.h\"\n");
  write("proto/codec.h", "#include \"config/config_enums.h\"\n#include \"config/config.h\"\n");
  write("config/config.h", "#include \"proto/codec.h\"\n");
  write("scripts/launch/launch.cc", "#include \"worker/worker_loop.h\"\n");
  write("scripts/ctl/ctl.cc", "#include \"worker/lm/generate.h\"\n#include \"coordinator/bootstrap.h\"\n");
  const std::vector<std::string> v = Violations(root);
  fs::remove_all(root);
  ASSERT_EQ(v.size(), 5u);
  std::string all;
  for (const std::string& s : v) all += s + "\n";
  EXPECT_NE(all.find("coordinator/core.cc:2: #include \"worker/lm/transformer.h\""), std::string::npos) << all;
  EXPECT_NE(all.find("worker/loop.cc:2: #include \"coordinator/round_policy.h\""), std::string::npos) << all;
  EXPECT_NE(all.find("proto/codec.h:2: #include \"config/config.h\""), std::string::npos) << all;
  EXPECT_NE(all.find("scripts/launch/launch.cc:1: #include \"worker/worker_loop.h\""), std::string::npos) << all;
  EXPECT_NE(all.find("scripts/ctl/ctl.cc:2: #include \"coordinator/bootstrap.h\""), std::string::npos) << all;
  EXPECT_EQ(all.find("coordinator/model_host.cc:"), std::string::npos) << all;
}

}  // namespace
}  // namespace diloco
