// The figures of one round on their way from the trainer to the coordinator, mapped once each way:
//   StepStats    what a run of inner steps did (InnerTrainer::TrainSteps); the runs between two pushes add up
//   RoundReport  what a push reports about its round: ReportRound builds it from the round's StepStats
//   PushHeader   the wire form (proto/diloco.proto): FillPushHeader writes it from a RoundReport
// The coordinator weighs the pseudo-gradient by `tokens` and logs the rest. No LibTorch: the client
// (worker/client.h) includes this. Plain data and pure functions: thread-safe.
#pragma once

#include <cstdint>

#include "proto/diloco.pb.h"

namespace diloco {

struct StepStats {
  int64_t tokens = 0;  // this process's tokens
  int64_t steps = 0;
  double first_loss = 0;
  double loss_sum = 0;
  double last_lr = 0;
  double seconds = 0;
  bool abandoned = false;  // stopped early because *stop became true
  void Add(const StepStats& later);
};

struct RoundReport {
  int fragment = 0;    // the fragment the pseudo-gradient belongs to (0 without comm.fragments)
  int64_t tokens = 0;  // every rank of the worker's cluster
  int64_t steps = 0;
  double first_loss = 0;
  double mean_loss = 0;  // over the round's inner steps
  double last_lr = 0;
  double seconds = 0;      // training (inner steps)
  double data_epochs = 0;  // passes over the shard so far (InnerTrainer::epochs())
  double norm = 0;         // the pushed pseudo-gradient's L2 norm (PushHeader.claimed_norm), set by the worker
};

// The report of a round trained as `stats` by each of cluster_size ranks (1: a plain worker).
RoundReport ReportRound(const StepStats& stats, int fragment, int cluster_size, double data_epochs);

// Writes the report's figures into `header` (its meta is the caller's).
void FillPushHeader(const RoundReport& report, PushHeader* header);

}  // namespace diloco
