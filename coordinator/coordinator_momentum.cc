// CoordinatorCore, the pushes along the outer momentum (outer.momentum_bound; coordinator.h, aggregation_rule.h
// MomentumBound, docs/operations.md "Robust aggregation and the non-finite guard"): clip's bound, and under every
// robust rule the suspect flag's test along the momentum.
//
// A pseudo-gradient computed from an older theta (the previous round's delta pushed again, or a worker training from
// a stale base) has an honest norm, so the norm clip passes it; what gives it away is that it leans on the outer
// momentum, to which fresh deltas, computed after the last outer step, are nearly orthogonal (config/tiny.yaml, 8
// workers, 2 of them stale: in round 10 the stale pushes' cosines with the momentum were 0.12-0.13, the round's
// median 0.002; docs/benchmarks.md "The bound along the outer momentum").
//   - While a push folds, the dot of each chunk with the momentum is added up: the momentum is read in place (no
//     copy), outside the lock as the chunk's norm is (a step writes the momentum only while the round closes, and a
//     chunk that arrives then is refused by AdmitFold, its dot dropped).
//   - At the close each counted push's projection onto the unit momentum is lowered to at most the round's median
//     projection + k robust standard deviations, and the excess leaves the round's average along the momentum: one
//     pass over the model, under the lock, while no push folds.
//   - One-sided: a push that points against the momentum (a sign flip) is the norm clip's to bound; raising its
//     projection would add to the step what no worker sent.
//   - Under trimmed_mean and centered_clip the projections and their bound are taken the same way (from each push's
//     values, after centered_clip's norm clip), but nothing is taken out: their result is not a weighted sum of the
//     pushes. A push far beyond the bound counts toward the suspect flag there too (outer.flag_margin), which is
//     what shows a stale delta under these rules (its norm and its trimmed share are honest).
// Sync rounds only, with an outer momentum (nothing to lean on in round 1 or with outer.momentum 0), comm.fragments 1
// and one weight per push (not comm.topk_average senders).
#include <spdlog/spdlog.h>

#include <cmath>

#include "absl/strings/str_format.h"
#include "coordinator/aggregation_rule.h"
#include "coordinator/coordinator.h"

namespace diloco {

bool CoordinatorCore::MomentumWatched() const {
  const Aggregation rule = config_.outer.aggregation;
  return (rule == Aggregation::kClip || IsCoordinateWise(rule)) && config_.outer.momentum_bound > 0 &&
         config_.outer.mode == OuterMode::kSync && fragments() <= 1 &&
         config_.comm.topk_average != TopkAverage::kSenders;
}

bool CoordinatorCore::MomentumBoundApplies() const {
  return MomentumWatched() && config_.outer.aggregation == Aggregation::kClip;
}

std::shared_ptr<const MomentumAxis> CoordinatorCore::ReadMomentumAxis() const {
  if (!MomentumWatched()) return nullptr;
  auto axis = std::make_shared<MomentumAxis>();
  (void)theta_->ReadSteady([&axis](const SteadyTheta& steady) {
    axis->tensors = steady.momentum;
    double squared = 0;
    for (const at::Tensor& m : axis->tensors) squared += SquaredNorm(m);
    axis->norm = std::sqrt(squared);
    return absl::OkStatus();
  });
  if (!(axis->norm > 0) || !std::isfinite(axis->norm)) return nullptr;
  return axis;
}

std::set<std::string> CoordinatorCore::JudgeAlongMomentum(ClosingRound& closing) {
  std::set<std::string> far_ids;
  if (axis_ == nullptr || closing.contributors.empty() || !(closing.tokens > 0)) return far_ids;
  const MomentumAxis& axis = *axis_;
  const bool apply = MomentumBoundApplies();
  std::vector<double> q;  // each push's projection onto the unit momentum, as folded (after its clip scale)
  for (const auto& [id, t] : closing.contributors) q.push_back(t.fold_scale * t.momentum_dot / axis.norm);
  const std::vector<double> bounded = MomentumBound(q, config_.outer.momentum_bound);
  const double median = Median(q);
  double excess = 0;  // sum_i w_i (q_i - q'_i)
  std::string moved;
  std::vector<double> cosines;
  size_t i = 0;
  for (const auto& [id, t] : closing.contributors) {
    const double norm = std::sqrt(t.squared_norm);
    const double cosine = norm > 0 ? t.momentum_dot / (axis.norm * norm) : 0;
    cosines.push_back(cosine);
    const bool over = bounded[i] != q[i];
    const bool far = over && FarBeyond(q[i], bounded[i], median, config_.outer.flag_margin);
    if (Member* m = membership_.Find(id)) {
      m->momentum_cosine = cosine;
      m->momentum_bounded = apply && over;
      m->momentum_far = far;
    }
    if (far) far_ids.insert(id);
    if (over && (apply || far)) {  // under a coordinate-wise rule only the far ones are worth a log line
      excess += t.weight * (q[i] - bounded[i]);
      absl::StrAppendFormat(&moved, "%s%s %.4g -> %.4g (cosine %.3f%s)", moved.empty() ? "" : ", ", id, q[i],
                            bounded[i], cosine, far ? ", far beyond" : "");
    }
    ++i;
  }
  if (moved.empty()) return far_ids;
  if (!apply) {
    spdlog::info(
        "round {}: pushes far beyond the bound along the outer momentum (projection -> bound; outer.momentum_bound "
        "{}, not applied under {}: counted toward the suspect flag): {}; the round's median projection {:.4g}, "
        "median cosine with the momentum {:.3f}",
        theta_->round() + 1, config_.outer.momentum_bound, EnumName(config_.outer.aggregation), moved, median,
        Median(cosines));
    return far_ids;
  }
  // The average is sum_i w_i s_i d_i / W: its component along m / |m| loses sum_i w_i (q_i - q'_i) / W.
  const double alpha = excess / closing.tokens / axis.norm;
  for (size_t k = 0; k < closing.delta.size() && k < axis.tensors.size(); ++k) {
    closing.delta[k].sub_(axis.tensors[k], alpha);
  }
  spdlog::info(
      "round {}: pushes bounded along the outer momentum (projection -> bound; outer.momentum_bound {}): {}; the "
      "round's median projection {:.4g}, median cosine with the momentum {:.3f}",
      theta_->round() + 1, config_.outer.momentum_bound, moved, median, Median(cosines));
  return far_ids;
}

}  // namespace diloco
