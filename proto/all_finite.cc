#include "proto/all_finite.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace diloco {

bool AllFinite(const at::Tensor& values) {
  if (values.scalar_type() == at::kFloat && values.is_contiguous() && values.device().is_cpu()) {
    const float* v = values.data_ptr<float>();
    const int64_t n = values.numel();
    constexpr uint32_t kExponent = 0x7f800000u;  // all exponent bits set: Inf or NaN
    uint32_t bad = 0;
    for (int64_t j = 0; j < n; ++j) {
      uint32_t bits;
      std::memcpy(&bits, v + j, sizeof(bits));
      bad |= static_cast<uint32_t>((bits & kExponent) == kExponent);
    }
    return bad == 0;
  }
  constexpr int64_t kWindow = int64_t{1} << 24;
  const at::Tensor flat = values.reshape({-1});  // a copy only when a strided view cannot be flattened
  for (int64_t begin = 0; begin < flat.numel(); begin += kWindow) {
    const int64_t n = std::min(kWindow, flat.numel() - begin);
    if (!at::isfinite(flat.narrow(0, begin, n)).all().item<bool>()) return false;
  }
  return true;
}

}  // namespace diloco
