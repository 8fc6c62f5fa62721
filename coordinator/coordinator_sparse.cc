// CoordinatorCore, the sparse push path (coordinator.h): a topk chunk (comm.codec topk, proto/topk_codec.h) is folded
// into the round's sums from its kept values, w * value at each kept position, without a dense copy of the chunk.
// The round rule is ours by default, as for dense pushes: the token-weighted mean over all the round's pushes, a
// coordinate a worker did not send counting as 0 for it; comm.topk_average senders is SparseLoCo's, each coordinate
// over the pushes that sent it (round_accumulator.h). The checks are FoldChunk's (coordinator_push.cc), in the same
// order. Also the sparse pull's half that needs the core: building a round's update and choosing which pulls get it.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/aggregation_rule.h"
#include "coordinator/coordinator.h"

namespace diloco {

absl::Status CoordinatorCore::FoldSparseChunk(PushTicket& ticket, size_t index, int64_t offset, int64_t count,
                                              const SparseChunk& sparse, int64_t wire_bytes) {
  if (CoordinateWiseRounds()) {  // issue 32: the window holds dense chunks (coordinator_window.cc)
    return absl::InvalidArgumentError(absl::StrCat("outer.aggregation ",
                                                   std::string(EnumName(config_.outer.aggregation)),
                                                   " does not take topk pushes; set the worker's comm.codec to the "
                                                   "coordinator's (",
                                                   std::string(EnumName(config_.comm.codec)), ")"));
  }
  if (index >= model_.specs.size() || offset < 0 || count < 0 || offset + count > model_.specs[index].numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk outside the model: tensor ", index, " elements [", offset, ", ", offset + count, ")"));
  }
  if (!AllFinite(sparse.values)) {
    return absl::InvalidArgumentError(absl::StrCat("pseudo-gradient of '", model_.specs[index].name,
                                                   "' holds NaN or Inf near element ", offset, "; push refused"));
  }
  const double squared_norm = SquaredNorm(sparse.values);  // the values not sent are 0: the push's norm is theirs
  const uint64_t chunk_hash = ChunkHash(index, offset, sparse.values, sparse.index);
  const double momentum_dot = MomentumDot(ticket.momentum.get(), index, offset, sparse.values, sparse.index);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AdmitFold(ticket); !s.ok()) return s;
  // comm.topk_average senders counts the push's own weight at its positions (a clip scale shrinks only its values).
  accumulator_.FoldSparse(index, offset, sparse.index, sparse.values, ticket.weight * ticket.fold_scale, ticket.weight);
  ticket.momentum_dot += momentum_dot;  // outer.momentum_bound
  NoteFold(ticket, squared_norm, chunk_hash, wire_bytes);
  return absl::OkStatus();
}

std::shared_ptr<const SparseUpdate> CoordinatorCore::BuildRoundUpdate(const ParamSnapshot& theta,
                                                                      const std::vector<at::Tensor>& delta) const {
  if (!SparsePullsApply(config_)) return nullptr;
  const TopkParams topk{config_.comm.topk_chunk, config_.comm.topk_per_chunk};
  const int64_t chunk_elements = TopkChunkElements(std::max<int64_t>(config_.comm.chunk_bytes, 64), topk);
  auto update = BuildSparseUpdate(theta.round, theta.params, delta, static_cast<float>(-config_.outer.lr), topk.chunk,
                                  chunk_elements, SparseUpdateLimit(model_.num_params));
  if (update == nullptr) {
    spdlog::info("round {}: the update is not sparse enough for sparse pulls; pulls are dense", theta.round);
  } else {
    spdlog::debug("round {}: sparse update of {} positions, {} bytes", theta.round, update->changed, update->bytes);
  }
  return update;
}

std::shared_ptr<const SparseUpdate> CoordinatorCore::SparseUpdateFor(const PullRequest& request, int64_t round) const {
  if (!request.has_have_round() || request.has_range() || request.have_round() + 1 != round) return nullptr;
  absl::MutexLock lock(&mu_);
  if (sparse_update_ == nullptr || sparse_update_->round != round) return nullptr;
  return sparse_update_;
}

}  // namespace diloco
