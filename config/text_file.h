// WriteTextFileAtomically: writes a small text file (a summary, an address file, a token manifest) so that readers
// see the old content or the new one, never a part, even after a power loss: it creates the parent directories,
// writes and fsyncs "<path>.tmp", renames it over `path` and fsyncs the directory. Errors name the path.
// Thread-safe for distinct paths.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace diloco {

absl::Status WriteTextFileAtomically(const std::string& path, const std::string& text);

}  // namespace diloco
