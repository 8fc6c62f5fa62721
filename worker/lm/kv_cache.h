// KvCache: the keys and values of the positions decoded so far, per layer, for incremental decoding (generation).
// keys[l], values[l]: [B, n_kv_head, length, head_dim] (absent before the layer's first call). Owned by the caller;
// not thread-safe.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace diloco {

struct KvCache {
  std::vector<torch::Tensor> keys, values;
  int64_t length = 0;  // positions already in the cache
};

}  // namespace diloco
