#include "worker/lm/kernel_dispatch.h"

#include <atomic>

namespace diloco {
namespace {

std::atomic<bool> fused_allowed{true};
std::atomic<bool> avx2_allowed{true};
std::atomic<bool> sdpa_on_cpu{false};

}  // namespace

bool UseFusedKernels() { return fused_allowed.load(std::memory_order_relaxed); }

void AllowFusedKernels(bool allow) { fused_allowed.store(allow, std::memory_order_relaxed); }

bool PreferSdpaOnCpu() { return sdpa_on_cpu.load(std::memory_order_relaxed); }

void SetPreferSdpaOnCpu(bool prefer) { sdpa_on_cpu.store(prefer, std::memory_order_relaxed); }

bool UseAvx2Kernels() {
  static const bool cpu_has_them = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return cpu_has_them && avx2_allowed.load(std::memory_order_relaxed);
}

void AllowAvx2Kernels(bool allow) { avx2_allowed.store(allow, std::memory_order_relaxed); }

}  // namespace diloco
