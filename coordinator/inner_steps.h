// Dynamic Local Updates (DyLU, arXiv 2401.09135, inner.adaptive_steps): a worker of speed v (inner steps per second,
// measured from its last push) trains H_i = floor(v / v_max x H) inner steps in its next round, at least 1, so that
// all workers finish a round at about the same time and the fastest is not left waiting. A worker with no measured
// speed yet gets H. Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace diloco {

std::map<std::string, int64_t> AssignInnerSteps(const std::map<std::string, double>& steps_per_second, int64_t H);

}  // namespace diloco
