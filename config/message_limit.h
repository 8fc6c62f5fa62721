// The largest gRPC message for a comm.chunk_bytes, shared by the config loader (which checks the coordinator's gRPC
// memory quota against it) and the wire settings (config/model_spec.h). Header-only; a pure function.
#pragma once

#include <cstdint>

namespace diloco {

// The largest message (bytes) the coordinator's gRPC server and TCP push listener accept: one chunk of
// comm.chunk_bytes plus 1 MiB for the chunk's header fields and the push header.
inline int64_t MaxMessageBytes(int64_t chunk_bytes) { return chunk_bytes + (int64_t{1} << 20); }

}  // namespace diloco
