// Fields(): the one table of the config schema (DESIGN §7). Each key of config.h is one row: its name, its type, the
// values it allows and its one-line doc. Parsing, validation of single keys, rendering, hashing
// (config_loader.h) and the generated reference docs/configuration.md (config_reference.h) all read this table, in
// its order, which is also the order of RenderConfig (the config hash is computed over it: append new keys, reorder
// none). Adding a key: a member with its default in config.h and one row here. Built once; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "config/config_field.h"

namespace diloco {

const std::vector<Field>& Fields();

// The field named `key` ("section.name"), or nullptr.
const Field* FindField(const std::string& key);

}  // namespace diloco
