// MakeNcclGroup in builds whose LibTorch has no CUDA (Debian's 1.13): there is no NCCL to make a group with.
// workers.device is checked at start-up (worker/lm/device_choice.h), so a run never gets here; the error is a guard.
#include <stdexcept>

#include "worker/collective_group.h"

namespace diloco {

std::unique_ptr<CollectiveGroup> MakeNcclGroup(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                               std::chrono::milliseconds, const torch::Device& device) {
  throw std::runtime_error(
      "a cluster on " + device.str() +
      " needs NCCL, which this build's LibTorch lacks (CPU build; see docs/operations.md, Two LibTorch builds)");
}

}  // namespace diloco
