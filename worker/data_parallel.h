// RunDataParallel: the fully synchronous baseline DiLoCo is measured against (diloco-launch --mode ddp). One c10d
// cluster of workers.count x workers.cluster_size ranks (worker/cluster.h, ProcessGroupGloo) and no coordinator:
// every rank starts from the same theta_0 (model: and run.seed, as the coordinator builds it), reads the same part
// of the corpus the DiLoCo worker of that rank would read (InnerTrainer::ForShard), and all-reduces its gradients
// every inner step, for outer.rounds x inner.steps steps with the same inner optimizer and learning-rate schedule.
// Rank 0 evaluates the validation loss at the same points the coordinator would (before step 1 and every
// coordinator.eval_every x inner.steps steps) and writes <run.output_dir>/summary.json with the fields the DiLoCo
// summary has (round, rounds_total, evals, workers, bytes), mode "ddp", and the bytes a ring all-reduce of fp32
// gradients sends: per rank and step 2 (k - 1) / k x 4 bytes x params. Every rank starts from model.init_from when set
// (our checkpoint or a Hugging Face directory, worker/lm/init_from.h); the run writes no checkpoints.
// Errors as RunWorker's (a status carrying its exit code, worker/worker_options.h). Call once per process.
#pragma once

#include <atomic>

#include "absl/status/status.h"
#include "config/config.h"
#include "config/data_cache.h"
#include "worker/worker_options.h"

namespace diloco {

absl::Status RunDataParallel(const Config& config, const TokenCache& cache, const WorkerOptions& options,
                             const std::atomic<bool>& stop);

}  // namespace diloco
