#include "coordinator/sparse_pull.h"

#include <algorithm>

#include "proto/sparse_update.h"

namespace diloco {

std::string SparsePullsOffReason(const Config& config) {
  if (!config.comm.sparse_pulls) return "comm.sparse_pulls is false";
  if (config.comm.codec != WireCodec::kTopk) {
    return "this coordinator's comm.codec is not topk (it reads its own comm.codec, not the workers': with topk "
           "pushes, set it on the coordinator too)";
  }
  if (config.outer.mode != OuterMode::kSync) return "outer.mode is async";
  if (config.outer.momentum != 0) return "outer.momentum is not 0 (the step changes every coordinate)";
  if (config.outer.lr <= 0) return "outer.lr is not > 0";
  if (config.comm.fragments != 1) return "comm.fragments is not 1";
  if (config.comm.pull_codec != WireCodec::kFp32) return "comm.pull_codec is not fp32";
  return "";
}

bool SparsePullsApply(const Config& config) { return SparsePullsOffReason(config).empty(); }

int64_t SparseUpdateLimit(int64_t num_params) { return num_params * 4 / 8; }

std::shared_ptr<const SparseUpdate> BuildSparseUpdate(int64_t round, const NamedTensors& theta,
                                                      const std::vector<at::Tensor>& delta, float minus_lr,
                                                      int64_t block, int64_t chunk_elements, int64_t max_bytes) {
  auto update = std::make_shared<SparseUpdate>();
  update->round = round;
  PullMessage message;
  for (size_t i = 0; i < theta.size() && i < delta.size(); ++i) {
    const at::Tensor d = delta[i].contiguous();
    const float* p = d.data_ptr<float>();
    const int64_t n = d.numel();
    for (int64_t offset = 0; offset < n; offset += chunk_elements) {  // zero-element tensors: no chunk
      TensorChunk* chunk = message.mutable_chunk();
      chunk->Clear();
      chunk->set_name(theta[i].first);
      chunk->set_dtype(FLOAT32);
      for (int64_t s : theta[i].second.sizes()) chunk->add_shape(s);
      chunk->set_offset(offset);
      chunk->set_count(std::min(chunk_elements, n - offset));
      update->changed += EncodeUpdate(p + offset, chunk->count(), minus_lr, block, chunk);
      update->payload_bytes.push_back(static_cast<int64_t>(chunk->data().size()));
      update->bytes += update->payload_bytes.back();
      if (update->bytes > max_bytes) return nullptr;
      update->messages.push_back(message.SerializeAsString());
    }
  }
  update->theta_hash = ThetaHash(theta);
  return update;
}

}  // namespace diloco
