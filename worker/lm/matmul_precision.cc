#include "worker/lm/matmul_precision.h"

#include <ATen/Context.h>

namespace diloco {

std::string ApplyMatmulPrecision(const std::string& device, bool allow_tf32) {
  const std::string precision = allow_tf32 && device.rfind("cuda", 0) == 0 ? "high" : "highest";
  at::globalContext().setFloat32MatmulPrecision(precision);
  return precision;
}

}  // namespace diloco
