// WriteTextFileAtomically: writes a small text file (a summary, an address file) so that readers see the old
// content or the new one, never a part: it creates the parent directories, writes "<path>.tmp", then renames it over
// `path`. Errors name the path. Thread-safe for distinct paths.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace diloco {

absl::Status WriteTextFileAtomically(const std::string& path, const std::string& text);

}  // namespace diloco
