#include "coordinator/outer_step.h"

#include <spdlog/spdlog.h>

#include "coordinator/delayed_nesterov.h"
#include "coordinator/outer_optimizer.h"

namespace diloco {

std::unique_ptr<OuterStep> MakeOuterStep(const Config& config) {
  if (config.outer.mode == OuterMode::kAsync && config.outer.optimizer == OuterOptimizerKind::kNesterov) {
    const int64_t n = config.outer.delay_n > 0 ? config.outer.delay_n : config.workers.count;
    spdlog::info("asynchronous rounds: Delayed Nesterov, momentum every {} pushes; max staleness {} versions", n,
                 config.outer.max_staleness);
    return std::make_unique<DelayedNesterov>(config.outer.lr, config.outer.momentum, n);
  }
  return std::make_unique<OuterOptimizer>(config.outer.optimizer, config.outer.lr, config.outer.momentum);
}

}  // namespace diloco
