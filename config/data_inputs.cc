#include "config/data_inputs.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  return ec ? path : abs.lexically_normal().string();
}

bool HasGlobChars(const std::string& pattern) { return pattern.find_first_of("*?[") != std::string::npos; }

// Every regular file below dir, sorted by path.
absl::Status FilesBelow(const std::string& dir, const std::string& key, std::vector<std::string>* out) {
  std::vector<std::string> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(
           dir, std::filesystem::directory_options::follow_directory_symlink, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(Absolute(it->path().string()));
  }
  if (ec) return absl::NotFoundError(absl::StrCat(key, ": cannot list directory '", dir, "': ", ec.message()));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(key, ": directory '", dir, "' holds no file; put the inputs in it"));
  }
  std::sort(files.begin(), files.end());
  out->insert(out->end(), files.begin(), files.end());
  return absl::OkStatus();
}

// One path (a file or a directory).
absl::Status AddPath(const std::string& path, const std::string& key, std::vector<std::string>* out) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(key, ": '", path, "' does not exist; fix the path in ", key));
  }
  if (S_ISDIR(st.st_mode)) return FilesBelow(path, key, out);
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(key, ": '", path, "' is not a file"));
  out->push_back(Absolute(path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandInputs(const std::vector<std::string>& patterns,
                                                      const std::string& key) {
  std::vector<std::string> out;
  for (const std::string& pattern : patterns) {
    if (!HasGlobChars(pattern)) {
      if (absl::Status s = AddPath(pattern, key, &out); !s.ok()) return s;
      continue;
    }
    glob_t matches{};
    const int rc = glob(pattern.c_str(), 0, nullptr, &matches);
    std::vector<std::string> paths(matches.gl_pathv, matches.gl_pathv + (rc == 0 ? matches.gl_pathc : 0));
    globfree(&matches);
    if (paths.empty()) return absl::NotFoundError(absl::StrCat(key, ": '", pattern, "' matches no file"));
    for (const std::string& path : paths) {  // glob(3) sorts them
      if (absl::Status s = AddPath(path, key, &out); !s.ok()) return s;
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> TrainingInputs(const Config& config) {
  if (!config.data.files.empty()) return ExpandInputs(config.data.files, "data.files");
  struct stat st;
  if (stat(config.data.text.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat("data.text: cannot read '", config.data.text,
                                            "'; set data.text to an existing file (or data.files)"));
  }
  return std::vector<std::string>{Absolute(config.data.text)};
}

}  // namespace diloco
