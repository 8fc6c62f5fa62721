// The run settings the wire protocol publishes (proto/PROTOCOL.md "Run settings"): the ModelSpec a worker declares
// at Join (and the coordinator reports in JoinReply and StatusReply), and the largest gRPC message either side
// accepts for a given comm.chunk_bytes (config/message_limit.h). Pure functions of the config; thread-safe.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "config/message_limit.h"  // MaxMessageBytes
#include "proto/diloco.pb.h"

namespace diloco {

// The model's settings with every default resolved (n_kv_head, ffn_hidden, max_positions filled in), so a client
// can copy it into its JoinRequest unchanged.
ModelSpec ModelSpecOf(const ModelConfig& model);

}  // namespace diloco
