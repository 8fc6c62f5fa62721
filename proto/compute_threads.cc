#include "proto/compute_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

namespace diloco {

bool SetComputeThreads(int threads) {
  at::set_num_threads(threads);
  using SetFn = void (*)(int);
  auto set_blas = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set_blas == nullptr) return false;
  set_blas(threads);
  return true;
}

}  // namespace diloco
