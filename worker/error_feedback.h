// ErrorFeedback: keeps what compression dropped from a worker's pseudo-gradient and adds it back next round
// (comm.error_feedback with int8/int4; always with comm.codec topk), so the coordinator receives, summed over rounds,
// the pseudo-gradients themselves:
//   compensated = delta + beta * residual;  sent = Q(compensated);  residual = compensated - sent
// where Q is exactly what the coordinator decodes (codec.h RoundTrip, or topk_codec.h TopkRoundTrip, with the push's
// chunk boundaries). beta = 1 for int8/int4 (the classic error feedback); comm.error_decay (default 0.95) for topk,
// where the residual is SparseLoCo's error-feedback accumulator e <- beta * e + delta (arXiv 2508.15706).
// The new residual stands only if the push that left it out was counted: Settle(false) (the push was refused: late,
// quarantined, the round closed without it) gives back the residual from before Compensate, so nothing the coordinator
// never received is dropped from the sums, and nothing is counted twice when the worker's local parameters go on
// (outer.late_policy reuse_local). Between Compensate and Settle both residuals are held (one more float32 copy of
// the parameters, on the CPU). Shapes: one float32 residual per parameter. Not thread-safe: owned by the worker's
// main loop.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "proto/codec.h"
#include "proto/named_tensors.h"
#include "proto/topk_codec.h"

namespace diloco {

class ErrorFeedback {
 public:
  ErrorFeedback(Codec codec, int64_t chunk_bytes, TopkParams topk = {}, double beta = 1.0)
      : codec_(codec), chunk_bytes_(chunk_bytes), topk_(topk), beta_(beta) {}

  // What Compensate sent: with topk, the push's wire chunks, encoded once here (the client replays them instead of
  // encoding again, worker/round_result.h; empty for int8/int4), and the squared L2 norm of the decoded values (the
  // push's claimed norm, PushHeader.claimed_norm).
  struct Sent {
    std::vector<TensorChunk> chunks;
    double squared_norm = 0;
  };
  // Replaces each delta by delta + beta * residual (the tensor to push) and stores the new residual, keeping the
  // previous one until Settle; fills *sent when given.
  void Compensate(NamedTensors& delta, Sent* sent = nullptr);
  // After the push of the last Compensate: counted keeps the new residual, else the previous one comes back. Without
  // a Compensate since the last Settle, nothing changes.
  void Settle(bool counted);

  const std::vector<torch::Tensor>& residual() const { return residual_; }
  // The residual as one flat float32 tensor (the tensors concatenated in push order); undefined before the first
  // Compensate. For the worker's resumable state.
  torch::Tensor Flat() const;
  // Restores a residual saved by Flat: it is split along the next Compensate's tensors, or dropped there with a
  // warning when its size does not match them.
  void Restore(torch::Tensor flat) { pending_ = std::move(flat); }

 private:
  // topk: encodes tensor `name` (its compensated values) into its wire chunks (appended to sent->chunks) and returns
  // what the coordinator decodes from them, on the CPU.
  torch::Tensor EncodeTopkChunks(const std::string& name, const torch::Tensor& compensated, int64_t chunk_bytes,
                                 Sent* sent) const;

  Codec codec_;
  int64_t chunk_bytes_;
  TopkParams topk_;
  double beta_;
  std::vector<torch::Tensor> residual_;
  std::vector<torch::Tensor> previous_;  // the residual before the last Compensate, until Settle
  torch::Tensor previous_pending_;       // ... when that was still a restored one (pending_)
  bool unsettled_ = false;               // a Compensate since the last Settle
  torch::Tensor pending_;                // a restored residual, until the first Compensate
};

}  // namespace diloco
