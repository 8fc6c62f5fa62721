// The inner learning-rate schedule: linear warmup over warmup_steps, then cosine decay from lr to
// lr * min_lr_ratio at the last step, total_steps - 1. `step` is the worker's global inner step (round x H + i), so a worker joining
// mid-run continues the schedule instead of re-warming (DiLoCo paper §3). Pure function; thread-safe.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace diloco {

double InnerLearningRate(const InnerConfig& inner, int64_t step, int64_t total_steps);

}  // namespace diloco
