#include "worker/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace diloco {

double InnerLearningRate(const InnerConfig& inner, int64_t step, int64_t total_steps) {
  if (inner.warmup_steps > 0 && step < inner.warmup_steps) {
    return inner.lr * static_cast<double>(step + 1) / static_cast<double>(inner.warmup_steps);
  }
  // The last step that runs is total_steps - 1: it gets lr * min_lr_ratio.
  const double span = std::max<double>(1.0, static_cast<double>(total_steps - 1 - inner.warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - inner.warmup_steps) / span, 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return inner.lr * (inner.min_lr_ratio + (1.0 - inner.min_lr_ratio) * cosine);
}

int64_t ScheduleStart(const Config& config, int64_t round, int64_t carried_steps) {
  if (config.outer.mode == OuterMode::kAsync)
    return round * config.StepsPerSync() / std::max<int64_t>(1, config.workers.count);
  return round * config.StepsPerSync() + carried_steps;
}

}  // namespace diloco
