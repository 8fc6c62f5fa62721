// The inner learning-rate schedule: linear warmup over warmup_steps, then cosine decay from lr to
// lr * min_lr_ratio at the last step, total_steps - 1. `step` is the worker's global inner step (round x H + i), so a
// worker joining mid-run continues the schedule instead of re-warming (DiLoCo paper §3). Pure function; thread-safe.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace diloco {

double InnerLearningRate(const InnerConfig& inner, int64_t step, int64_t total_steps);

// The schedule position of a round's first inner step: the global model's progress, so fast and slow workers anneal
// together. S = the inner steps between syncs (H, or H / comm.fragments with Streaming DiLoCo, whose rounds are
// fragment syncs). Sync: round x S + carried (steps of this round already trained while the last push was in
// flight). Async (`round` is the version pulled, advancing with every push): version x S / workers.count, the
// version's share of the run's outer.rounds x workers.count pushes.
int64_t ScheduleStart(const Config& config, int64_t round, int64_t carried_steps);

}  // namespace diloco
