// The run settings the wire protocol publishes (proto/PROTOCOL.md "Run settings"): the ModelSpec a worker declares
// at Join (and the coordinator reports in JoinReply and StatusReply), the DataSpec both sides compare at Join, and the
// largest gRPC message either side accepts for a given comm.chunk_bytes (config/message_limit.h). Pure functions of the
// config; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "config/message_limit.h"  // MaxMessageBytes
#include "proto/diloco.pb.h"

namespace diloco {

// The model's settings with every default resolved (n_kv_head, ffn_hidden, max_positions filled in), so a client
// can copy it into its JoinRequest unchanged.
ModelSpec ModelSpecOf(const ModelConfig& model);

// A process's data: `vocab_digest` (its token cache's tokenizer, config/data_cache.h VocabDigestOf; "" for
// data.format tokens) and data.split.
DataSpec DataSpecOf(const Config& config, const std::string& vocab_digest);

}  // namespace diloco
