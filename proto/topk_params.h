// TopkParams: the two numbers of the sparse top-k codec (comm.topk_chunk, comm.topk_per_chunk; proto/topk_codec.h
// has the codec). Header-only, without LibTorch, so that the worker's client can carry them. Plain data.
#pragma once

#include <cstdint>

namespace diloco {

struct TopkParams {
  int64_t chunk = 4096;  // B: elements per block (comm.topk_chunk)
  int64_t keep = 64;     // k: values kept per block (comm.topk_per_chunk)
};

}  // namespace diloco
