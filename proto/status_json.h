// StatusReply -> JSON, the one shape that `diloco-ctl status --json` prints and the coordinator writes to
// <run.output_dir>/summary.json at the end of a run. Numbers stay numbers (protobuf's own JSON printer would turn
// int64 into strings). Pure function; thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include "proto/diloco.pb.h"

namespace diloco {

nlohmann::json StatusToJson(const StatusReply& status);

}  // namespace diloco
