// The input files of a run: data.files / data.val_files expanded (a directory = every regular file below it, sorted;
// a glob = its matches via glob(3), sorted; a file = itself), or the legacy data.text. Paths come back absolute.
// Errors are one line naming the key and the path or pattern: a missing file, a glob that matches nothing, a
// directory with no file. Stateless; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"

namespace diloco {

// Expands the patterns of one key ("data.files", "data.val_files").
absl::StatusOr<std::vector<std::string>> ExpandInputs(const std::vector<std::string>& patterns, const std::string& key);

// The run's training inputs: data.files expanded, or data.text when data.files is empty.
absl::StatusOr<std::vector<std::string>> TrainingInputs(const Config& config);

}  // namespace diloco
