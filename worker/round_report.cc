#include "worker/round_report.h"

#include <algorithm>

namespace diloco {

void StepStats::Add(const StepStats& later) {
  if (steps == 0) first_loss = later.first_loss;
  tokens += later.tokens;
  steps += later.steps;
  loss_sum += later.loss_sum;
  if (later.steps > 0) last_lr = later.last_lr;
  seconds += later.seconds;
  abandoned = abandoned || later.abandoned;
}

RoundReport ReportRound(const StepStats& stats, int fragment, int cluster_size, double data_epochs) {
  RoundReport report;
  report.fragment = fragment;
  report.tokens = stats.tokens * cluster_size;  // every rank trained on as many tokens
  report.steps = stats.steps;
  report.first_loss = stats.first_loss;
  report.mean_loss = stats.loss_sum / static_cast<double>(std::max<int64_t>(1, stats.steps));
  report.last_lr = stats.last_lr;
  report.seconds = stats.seconds;
  report.data_epochs = data_epochs;
  return report;
}

void FillPushHeader(const RoundReport& report, PushHeader* header) {
  header->set_tokens(report.tokens);
  header->set_inner_steps(report.steps);
  header->set_loss(report.mean_loss);
  header->set_claimed_norm(report.norm);
  header->set_seconds(report.seconds);
  header->set_fragment(report.fragment);
  header->set_data_epochs(report.data_epochs);
}

}  // namespace diloco
