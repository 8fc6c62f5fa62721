// The precision of float32 matrix products in this process (workers.allow_tf32): TF32 on a CUDA device, as PyTorch
// users set it with torch.set_float32_matmul_precision("high") (the GPU's tensor cores multiply with a 10-bit
// mantissa and accumulate in fp32: several times the fp32 throughput of an H100/H200), full fp32 ("highest")
// otherwise. CPU workers are never changed. Sets a process-wide LibTorch setting: call it once at start-up, before
// any model runs (not thread-safe against concurrent matmuls).
#pragma once

#include <string>

namespace diloco {

// Sets the precision for `device` ("cpu", "cuda", "cuda:N") and returns its name ("high" or "highest").
std::string ApplyMatmulPrecision(const std::string& device, bool allow_tf32);

}  // namespace diloco
