#include "worker/error_feedback.h"

#include "proto/tensor_chunks.h"

namespace diloco {

void ErrorFeedback::Compensate(NamedTensors& delta) {
  if (residual_.empty()) {
    for (const auto& [name, d] : delta) residual_.push_back(torch::zeros_like(d));
  }
  const int64_t chunk_elements = ChunkElements(codec_, std::max(chunk_bytes_, kMinChunkBytes), sizeof(float));
  for (size_t i = 0; i < delta.size(); ++i) {
    torch::Tensor compensated = (delta[i].second + residual_[i]).contiguous();
    torch::Tensor sent = RoundTrip(compensated.view({-1}), codec_, chunk_elements).view_as(compensated);
    residual_[i] = compensated - sent;
    delta[i].second = compensated;
  }
}

}  // namespace diloco
