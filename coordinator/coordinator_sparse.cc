// CoordinatorCore, the sparse push path (coordinator.h): a topk chunk (comm.codec topk, proto/topk_codec.h) is folded
// into the round's sums from its kept values, w * value at each kept position, without a dense copy of the chunk.
// The round rule is ours, as for dense pushes: the token-weighted mean over all the round's pushes, a coordinate a
// worker did not send counting as 0 for it. The checks are FoldChunk's (coordinator_push.cc), in the same order.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "coordinator/aggregation_rule.h"
#include "coordinator/coordinator.h"

namespace diloco {

absl::Status CoordinatorCore::FoldSparseChunk(PushTicket& ticket, size_t index, int64_t offset, int64_t count,
                                              const SparseChunk& sparse, int64_t wire_bytes) {
  if (CoordinateWiseRounds()) {  // issue 32: the window holds dense chunks (coordinator_window.cc)
    return absl::FailedPreconditionError("a coordinate-wise outer.aggregation does not take topk pushes; push dense");
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
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AdmitFold(ticket); !s.ok()) return s;
  accumulator_.FoldSparse(index, offset, sparse.index, sparse.values, ticket.weight * ticket.fold_scale);
  NoteFold(ticket, squared_norm, wire_bytes);
  return absl::OkStatus();
}

}  // namespace diloco
