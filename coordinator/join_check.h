// The checks of a JoinRequest against the coordinator's config, before the worker becomes a member: its model
// (ModelSpec) and its data (DataSpec). Each returns one line naming every setting that differs, with the worker's and
// the coordinator's value, or "" when the worker may join. Pure functions; thread-safe.
#pragma once

#include <string>

#include "config/config.h"
#include "proto/diloco.pb.h"

namespace diloco {

// The model settings of `worker` that differ from `coordinator` (proto defaults read as config defaults; a client
// that sends no rope_type, an older one, is not checked on the shape-free settings).
std::string ModelMismatch(const ModelSpec& worker, const ModelConfig& coordinator);

// The data settings of `worker` that differ from `coordinator`'s: a vocabulary digest whose token ids mean other
// pieces, or another data.split; each checked only when both said it. `coordinator` is the coordinator's own
// (config/model_spec.h DataSpecOf).
std::string DataMismatch(const DataSpec& worker, const DataSpec& coordinator);

}  // namespace diloco
