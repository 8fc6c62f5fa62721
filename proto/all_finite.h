// AllFinite: whether a tensor holds no NaN and no Inf, without a temporary the size of the tensor (at::isfinite on a
// whole model makes a bool copy, and before LibTorch 2.x an abs() copy too: 5 bytes a parameter). Used on every push
// chunk the coordinator folds and on a worker's parameters after its inner steps. Pure function; thread-safe.
#pragma once

#include <ATen/ATen.h>

namespace diloco {

// Contiguous float32 on the CPU: one pass over the bits. Anything else (another dtype, a strided view, a CUDA
// tensor): at::isfinite over windows of at most 16M elements (one device sync a window).
bool AllFinite(const at::Tensor& values);

}  // namespace diloco
