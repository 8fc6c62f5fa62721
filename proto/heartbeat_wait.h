// The longest a coordinator holds a heartbeat (HeartbeatRequest.wait_ms, PROTOCOL.md "Waiting for the round to
// close"), whatever the request asks; our worker asks for exactly this. Far below any lease and RPC deadline.
// Constant data; thread-safe.
#pragma once

#include <cstdint>

namespace diloco {

inline constexpr int64_t kMaxHeartbeatHoldMs = 1000;

}  // namespace diloco
