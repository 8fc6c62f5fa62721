// ErrorFeedback: keeps what quantization dropped from a worker's pseudo-gradient and adds it back next round
// (comm.error_feedback), so the coordinator receives, summed over rounds, the pseudo-gradients themselves:
//   compensated = delta + residual;  sent = Q(compensated);  residual = compensated - sent
// where Q is exactly what the coordinator decodes (codec.h RoundTrip with the push's chunk boundaries).
// Shapes: one float32 residual per parameter. Not thread-safe: owned by the worker's main loop.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "proto/codec.h"
#include "proto/named_tensors.h"

namespace diloco {

class ErrorFeedback {
 public:
  ErrorFeedback(Codec codec, int64_t chunk_bytes) : codec_(codec), chunk_bytes_(chunk_bytes) {}

  // Replaces each delta by delta + residual (the tensor to push) and stores the new residual.
  void Compensate(NamedTensors& delta);

  const std::vector<torch::Tensor>& residual() const { return residual_; }

 private:
  Codec codec_;
  int64_t chunk_bytes_;
  std::vector<torch::Tensor> residual_;
};

}  // namespace diloco
