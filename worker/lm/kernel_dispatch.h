// Whether the model uses its fused CPU kernels (worker/lm/causal_attention.h) at all, and which build of them runs:
// the AVX2+FMA one where the CPU has both, the baseline x86-64 one otherwise. On by default; tests switch the AVX2
// build off to check the baseline one, and diloco-bench-train --composite-ops switches the kernels off to measure what
// they gain; --sdpa-on-cpu sends the CPU float32 attention to at::scaled_dot_product_attention instead (LibTorch 2.x),
// to measure which is faster there. Thread-safe (atomic flags); switch them only while no kernel runs.
#pragma once

namespace diloco {

bool UseFusedKernels();
void AllowFusedKernels(bool allow);

// CPU float32 attention through at::scaled_dot_product_attention rather than our kernel (off by default; 2.x only).
bool PreferSdpaOnCpu();
void SetPreferSdpaOnCpu(bool prefer);

bool UseAvx2Kernels();
void AllowAvx2Kernels(bool allow);

}  // namespace diloco
