// The run settings the wire protocol publishes (proto/PROTOCOL.md "Run settings"): the ModelSpec a worker declares
// at Join (and the coordinator reports in JoinReply and StatusReply), and the largest gRPC message either side
// accepts for a given comm.chunk_bytes. Pure functions of the config; thread-safe.
#pragma once

#include <cstdint>

#include "config/config.h"
#include "proto/diloco.pb.h"

namespace diloco {

// The model's settings with every default resolved (n_kv_head, ffn_hidden, max_positions filled in), so a client
// can copy it into its JoinRequest unchanged.
ModelSpec ModelSpecOf(const ModelConfig& model);

// The largest message (bytes) the coordinator's gRPC server and TCP push listener accept: one chunk of
// comm.chunk_bytes plus 1 MiB for the chunk's header fields and the push header.
int64_t MaxMessageBytes(int64_t chunk_bytes);

}  // namespace diloco
