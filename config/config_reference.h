// The configuration reference as Markdown: every key of Fields() (config_fields.h) with its type, default, allowed
// values and doc, one table per section. `diloco-ctl config-reference` prints it and docs/configuration.md is its
// committed output (ctest config_reference fails when they differ). A pure function; thread-safe.
#pragma once

#include <string>

namespace diloco {

std::string ConfigReferenceMarkdown();

}  // namespace diloco
