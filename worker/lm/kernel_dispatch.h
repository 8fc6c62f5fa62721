// Which build of the model's CPU kernels (worker/lm/*_kernels.cc) runs: the AVX2+FMA one where the CPU has both, the
// baseline x86-64 one otherwise. Tests switch the AVX2 build off to check the baseline one on machines that have AVX2.
// Thread-safe (an atomic flag); switch it only while no kernel runs.
#pragma once

namespace diloco {

bool UseAvx2Kernels();
void AllowAvx2Kernels(bool allow);

}  // namespace diloco
