#include "coordinator/inner_steps.h"

#include <algorithm>
#include <cmath>

namespace diloco {

std::map<std::string, int64_t> AssignInnerSteps(const std::map<std::string, double>& steps_per_second, int64_t H) {
  double fastest = 0;
  for (const auto& [id, v] : steps_per_second) {
    if (std::isfinite(v)) fastest = std::max(fastest, v);
  }
  std::map<std::string, int64_t> out;
  for (const auto& [id, v] : steps_per_second) {
    if (!(fastest > 0) || !std::isfinite(v) || v <= 0) {
      out[id] = H;
      continue;
    }
    const auto h = static_cast<int64_t>(std::floor(v / fastest * static_cast<double>(H) + 1e-9));
    out[id] = std::clamp<int64_t>(h, 1, H);
  }
  return out;
}

}  // namespace diloco
