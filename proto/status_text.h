// StatusReply -> the human-readable table that `diloco-ctl status` prints (and redraws under --watch): the run, the
// model, the protocol, traffic, one row per member, then one line per member that needs an operator's eye
// (quarantined, duplicate pushes, a push in parts, far beyond the robust limits or suspect) and one line for all the
// members clipped or bounded a little (outer.aggregation clip: about half of the honest pushes are, every round).
// Pure function; thread-safe. status --json prints StatusToJson (status_json.h) instead.
#pragma once

#include <string>

#include "proto/diloco.pb.h"

namespace diloco {

std::string StatusToText(const StatusReply& s);

}  // namespace diloco
