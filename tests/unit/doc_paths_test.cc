// Every repository path that the docs and the code's comments name must exist: README.md, docs/*.md,
// deploy/**/README.md, proto/PROTOCOL.md and scripts/bench/results/*.md (all of their text, and their markdown links),
// and the comments of C++ (.h, .cc, .proto), Python, shell, CMake, YAML and the scripts under scripts/.
// A path is a token that starts with a top-level folder of the repository (coordinator/, worker/, proto/, config/,
// scripts/, tests/, deploy/, docs/, cmake/, .ci/), a "../" path (it must stay inside the repository: the product
// ships without anything beside it), or an upper-case markdown name such as README.md. Trailing punctuation is
// dropped; `a.{h,cc}` names both files; `*` and `<name>` match any name within one folder, `**/` any folders. A broken
// reference fails the test as "file:line: path". The checker runs on a scratch tree too, so a checker that finds
// nothing fails. Single-threaded; reads the tree, writes only its scratch tree.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace diloco {
namespace {

namespace fs = std::filesystem;

// Paths made by the build or at run time that a comment may name although no checkout holds them.
const std::vector<std::string> kGeneratedGlobs = {"*.pb.h", "*.pb.cc"};

// Folders never read: version control, build trees, virtual environments, runs.
bool Skipped(const fs::path& rel) {
  const std::string first = rel.begin()->string();
  return first == ".git" || first.rfind("build", 0) == 0 || first == ".venv" || first == "runs" ||
         first == ".gpu-deps" || rel.filename() == "__pycache__";
}

// The repository's files and folders (relative, '/'-separated) and the file names.
struct TreeIndex {
  std::set<std::string> paths;
  std::set<std::string> names;
  std::vector<std::string> files;
};

TreeIndex IndexTree(const fs::path& root) {
  TreeIndex index;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path rel = fs::relative(it->path(), root);
    if (Skipped(rel)) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    index.paths.insert(rel.generic_string());
    if (it->is_regular_file()) {
      index.files.push_back(rel.generic_string());
      index.names.insert(rel.filename().string());
    }
  }
  return index;
}

// A glob ('*' and '?' within one folder, '**/' any folders) as a regex.
std::regex GlobRegex(const std::string& glob) {
  std::string re;
  for (std::size_t i = 0; i < glob.size(); ++i) {
    const char c = glob[i];
    if (glob.compare(i, 3, "**/") == 0) {  // any number of folders, none included
      re += "(.*/)?";
      i += 2;
    } else if (c == '*') {
      re += "[^/]*";
    } else if (c == '?') {
      re += "[^/]";
    } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '_' || c == '-') {
      re += c;
    } else {
      re += std::string("\\") + c;
    }
  }
  return std::regex(re);
}

bool GlobMatchesAny(const std::string& glob, const std::set<std::string>& paths) {
  const std::regex re = GlobRegex(glob);
  for (const std::string& p : paths) {
    if (std::regex_match(p, re)) return true;
  }
  return false;
}

// `a.{h,cc}` -> a.h, a.cc (every brace group, left to right); `<name>` -> `*`.
std::vector<std::string> Expand(const std::string& token) {
  const std::size_t lt = token.find('<');
  const std::size_t gt = token.find('>', lt == std::string::npos ? 0 : lt);
  if (lt != std::string::npos && gt != std::string::npos) {
    return Expand(token.substr(0, lt) + "*" + token.substr(gt + 1));
  }
  const std::size_t open = token.find('{');
  const std::size_t close = token.find('}', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || close == std::string::npos) return {token};
  std::vector<std::string> out;
  const std::string body = token.substr(open + 1, close - open - 1);
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = body.find(',', start);
    const std::string alt = body.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    for (std::string& e : Expand(token.substr(0, open) + alt + token.substr(close + 1))) out.push_back(e);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Whether one expanded path (from the repository root) exists in the tree; "../" paths lead outside it.
bool Exists(const TreeIndex& index, std::string path) {
  if (path == ".." || path.rfind("../", 0) == 0) return false;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.find('/') == std::string::npos && path.size() > 3 && path.compare(path.size() - 3, 3, ".md") == 0) {
    return index.names.count(path) > 0;  // a bare README.md, PROTOCOL.md: some file of that name
  }
  for (const std::string& g : kGeneratedGlobs) {
    if (std::regex_match(path, GlobRegex("*" + g.substr(1))) || std::regex_match(path, GlobRegex("*/" + g))) {
      return true;
    }
  }
  if (path.find_first_of("*?") != std::string::npos) return GlobMatchesAny(path, index.paths);
  return index.paths.count(path) > 0;
}

// Drops trailing punctuation, and a closing '}' or '>' without its opening one.
std::string Trim(std::string t) {
  const std::string punct = ".,;:)]'\"`!?";
  while (!t.empty()) {
    const char c = t.back();
    const auto count = [&](char x) { return std::count(t.begin(), t.end(), x); };
    if (punct.find(c) != std::string::npos || (c == '}' && count('{') < count('}')) ||
        (c == '>' && count('<') < count('>'))) {
      t.pop_back();
    } else {
      break;
    }
  }
  // A comma ends the token unless it is inside braces.
  int depth = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '{') ++depth;
    if (t[i] == '}') --depth;
    if (t[i] == ',' && depth == 0) return Trim(t.substr(0, i));
  }
  return t;
}

// The path-like tokens of one piece of text. A token preceded by a path character (build/tests/x, 1a2b3c:worker/x
// in `git show`) is part of something else and is not taken.
std::vector<std::string> PathTokens(const std::string& text) {
  static const std::regex kToken(
      R"((\.\./)+[A-Za-z0-9_.{},*<>@+/-]+|(coordinator|worker|proto|config|scripts|tests|deploy|docs|cmake|\.ci)/)"
      R"([A-Za-z0-9_.{},*<>@+/-]*|[A-Z][A-Z_]*\.md)");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kToken); it != std::sregex_iterator(); ++it) {
    const std::size_t pos = it->position(0);
    if (pos > 0) {
      const char before = text[pos - 1];
      if (std::isalnum(static_cast<unsigned char>(before)) ||
          std::string("_./-~$:@").find(before) != std::string::npos) {
        continue;
      }
    }
    const std::string token = Trim(it->str(0));
    if (!token.empty()) out.push_back(token);
  }
  return out;
}

// A path relative to `file` (a markdown link's target, a "../" token) as a path from the repository root; it
// starts with "../" when it leads outside the repository.
std::string LinkPath(const std::string& file, const std::string& target) {
  return (fs::path(file).parent_path() / target).lexically_normal().generic_string();
}

struct Link {
  std::string target;  // "" for an anchor in the same file
  std::string anchor;  // without the '#'; "" for none
};

// Markdown links with a relative target: [text](target), [text](target#anchor), [text](#anchor).
std::vector<Link> Links(const std::string& line) {
  static const std::regex kLink(R"(\]\(([^)\s#]*)(#([^)\s]*))?\))");
  std::vector<Link> out;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), kLink); it != std::sregex_iterator(); ++it) {
    Link link{(*it)[1], (*it)[3]};
    if (link.target.find("://") != std::string::npos || link.target.rfind("mailto:", 0) == 0) continue;
    if (link.target.empty() && link.anchor.empty()) continue;
    out.push_back(link);
  }
  return out;
}

// The anchors of a markdown file's headings as GitHub makes them: lower case, punctuation dropped, blanks as '-';
// a repeated heading gets -1, -2, ... Headings inside ``` blocks do not count.
std::set<std::string> Anchors(const fs::path& md) {
  std::set<std::string> out;
  std::map<std::string, int> seen;
  std::ifstream in(md);
  std::string line;
  bool fenced = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced || line.empty() || line[0] != '#') continue;
    const std::size_t text = line.find_first_not_of('#');
    if (text == std::string::npos || line[text] != ' ') continue;
    std::string slug;
    for (char c : line.substr(text + 1)) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (std::isalnum(u) || c == '-' || c == '_') slug += static_cast<char>(std::tolower(u));
      if (c == ' ') slug += '-';
    }
    const int n = seen[slug]++;
    out.insert(n == 0 ? slug : slug + "-" + std::to_string(n));
  }
  return out;
}

// The links of one line of `file` whose anchor names no heading of the markdown file it points to.
std::vector<std::string> BrokenAnchors(const fs::path& root, const TreeIndex& index, const std::string& file,
                                       const std::vector<Link>& links) {
  std::vector<std::string> out;
  for (const Link& link : links) {
    if (link.anchor.empty()) continue;
    const std::string path = link.target.empty() ? file : LinkPath(file, link.target);
    if (path.size() < 3 || path.compare(path.size() - 3, 3, ".md") != 0 || !Exists(index, path)) continue;
    if (Anchors(root / path).count(link.anchor) == 0) out.push_back(link.target + "#" + link.anchor);
  }
  return out;
}

enum class Kind { kNone, kDoc, kCpp, kHash };

Kind KindOf(const std::string& file) {
  static const std::regex kDoc(R"(README\.md|docs/[^/]+\.md|deploy/(.*/)?README\.md|proto/PROTOCOL\.md|)"
                               R"(scripts/bench/results/[^/]+\.md)");
  if (std::regex_match(file, kDoc)) return Kind::kDoc;
  const fs::path p(file);
  const std::string ext = p.extension().string();
  if (ext == ".h" || ext == ".cc" || ext == ".proto") return Kind::kCpp;
  if (ext == ".py" || ext == ".sh" || ext == ".cmake" || ext == ".yaml" || p.filename() == "CMakeLists.txt") {
    return Kind::kHash;
  }
  if (file.rfind("scripts/", 0) == 0 && ext.empty()) return Kind::kHash;
  return Kind::kNone;
}

// The comment text of one C++ line: after a `//` outside string and char literals, and inside /* */ (which may span
// lines: `in_block` carries over). Raw strings are taken to end on their line.
std::string CppComment(const std::string& line, bool& in_block) {
  std::string out;
  char quote = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_block) {
      if (line.compare(i, 2, "*/") == 0) {
        in_block = false;
        ++i;
      } else {
        out += c;
      }
    } else if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == 'R' && line.compare(i, 2, "R\"") == 0) {
      const std::size_t paren = line.find('(', i);
      if (paren == std::string::npos) break;
      const std::size_t end = line.find(")" + line.substr(i + 2, paren - i - 2) + "\"", paren);
      if (end == std::string::npos) break;
      i = end + (paren - i - 2) + 1;
    } else if (c == '"' || (c == '\'' && (i == 0 || !std::isalnum(static_cast<unsigned char>(line[i - 1]))))) {
      quote = c;
    } else if (line.compare(i, 2, "//") == 0) {
      return out + " " + line.substr(i + 2);
    } else if (line.compare(i, 2, "/*") == 0) {
      in_block = true;
      ++i;
    }
  }
  return out;
}

// The comment text of one line of a '#'-comment language: after a '#' at the start or after a blank.
std::string HashComment(const std::string& line) {
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (line[i] == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) return line.substr(i + 1);
  }
  return "";
}

// The broken path references of one line's text (and, in a doc, of its markdown links): each named as written, or
// as expanded for the brace forms.
std::vector<std::string> BrokenPaths(const TreeIndex& index, const std::string& file, const std::string& text,
                                     const std::vector<Link>& links) {
  std::map<std::string, std::string> tokens;  // resolved path (from the repository root) -> the text that named it
  for (const std::string& token : PathTokens(text)) {
    tokens.emplace(token.rfind("../", 0) == 0 ? LinkPath(file, token) : token, token);
  }
  for (const Link& link : links) {
    if (!link.target.empty()) tokens.emplace(LinkPath(file, link.target), link.target);
  }
  std::vector<std::string> out;
  for (const auto& [resolved, named] : tokens) {
    for (const std::string& path : Expand(resolved)) {
      if (!Exists(index, path)) out.push_back(resolved == named ? path : named);
    }
  }
  return out;
}

// Every broken reference under `root`, as "file:line: path" (or "file:line: target#anchor").
std::vector<std::string> BrokenReferences(const fs::path& root) {
  const TreeIndex index = IndexTree(root);
  std::vector<std::string> files = index.files;
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  for (const std::string& file : files) {
    const Kind kind = KindOf(file);
    if (kind == Kind::kNone) continue;
    std::ifstream in(root / file);
    std::string line;
    bool in_block = false;
    for (int n = 1; std::getline(in, line); ++n) {
      const std::string text = kind == Kind::kDoc   ? line
                               : kind == Kind::kCpp ? CppComment(line, in_block)
                                                    : HashComment(line);
      const std::vector<Link> links = kind == Kind::kDoc ? Links(line) : std::vector<Link>{};
      const std::string where = file + ":" + std::to_string(n) + ": ";
      for (const std::string& bad : BrokenPaths(index, file, text, links)) out.push_back(where + bad);
      for (const std::string& bad : BrokenAnchors(root, index, file, links)) out.push_back(where + bad);
    }
  }
  return out;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const std::string& l : lines) all += l + "\n";
  return all;
}

TEST(DocPathsTest, EveryPathTheDocsAndCommentsNameExists) {
  const std::vector<std::string> broken = BrokenReferences(DILOCO_SOURCE_DIR);
  EXPECT_TRUE(broken.empty()) << "paths named but not in the repository (file:line: path):\n" << Joined(broken);
}

// The checker itself, on a scratch tree holding one reference of each kind, good and broken.
TEST(DocPathsTest, ReportsEveryBrokenReferenceWithItsFileAndLine) {
  const fs::path root = fs::temp_directory_path() / ("doc_paths_" + std::to_string(::getpid()));
  fs::remove_all(root);
  auto write = [&](const std::string& file, const std::string& text) {
    fs::create_directories((root / file).parent_path());
    std::ofstream(root / file) << text;
  };
  write("README.md",
        "## Quick start\nRun build/tests/x; see [ops](docs/ops.md), [dev](docs/dev.md) and docs/ops.md.\n"
        "deploy/**/README.md, not tests/**/nothing.cc\n");
  write("docs/ops.md",
        "[up](../README.md) [x](missing.md) [out](../../x.md) worker/lm/, proto/diloco.pb.h\n"
        "## Running by hand, fast\n"
        "[a](#running-by-hand-fast) [b](#nope) [c](../README.md#quick-start) [d](../README.md#missing)\n"
        "```\n# not a heading\n```\n[e](#not-a-heading)\n");
  write("config/demo.yaml", "# the demo\n");
  write("deploy/k8s/README.md", "k8s\n");
  write("coordinator/model_host.h", "");
  write("coordinator/a.h",
        "// Owns x; see worker/b.h, coordinator/model_host.{h,cc} and worker/gone.h.\n"
        "const char* s = \"worker/in_string.h // config/x\";  // and tests/missing_test.cc\n"
        "/* a block comment naming\n"
        "   scripts/nothing */ int x;  // config/demo.yaml exists\n");
  write("worker/b.h", "// worker/lm/arch_<name>.cc, worker/lm/arch_*.cc: one file an architecture\n");
  write("worker/lm/arch_gpt.cc", "// git show 1a2b3c:worker/lm/old.h; ../shared/REFERENCE.md is outside\n");
  write("scripts/tool", "#!/bin/sh\n# reads config/nope.yaml (DESIGN.md, README.md)\necho worker/nope\n");
  write("tests/t.py", "x = \"#\"  # tests/data/ holds data; tests/gone.py does not exist\n");
  write("tests/data/f.txt", "worker/not_scanned\n");
  write("build/x.h", "// worker/in_the_build_tree\n");
  std::vector<std::string> got = BrokenReferences(root);
  fs::remove_all(root);
  std::sort(got.begin(), got.end());
  const std::vector<std::string> want = {
      "README.md:2: docs/dev.md",
      "README.md:3: tests/**/nothing.cc",
      "coordinator/a.h:1: coordinator/model_host.cc",
      "coordinator/a.h:1: worker/gone.h",
      "coordinator/a.h:2: tests/missing_test.cc",
      "coordinator/a.h:4: scripts/nothing",
      "docs/ops.md:1: ../../x.md",
      "docs/ops.md:1: missing.md",
      "docs/ops.md:3: #nope",
      "docs/ops.md:3: ../README.md#missing",
      "docs/ops.md:7: #not-a-heading",
      "scripts/tool:2: DESIGN.md",
      "scripts/tool:2: config/nope.yaml",
      "tests/t.py:1: tests/gone.py",
      "worker/lm/arch_gpt.cc:1: ../shared/REFERENCE.md",
  };
  EXPECT_EQ(got, want) << Joined(got);
}

}  // namespace
}  // namespace diloco
