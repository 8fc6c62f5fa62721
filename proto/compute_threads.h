// SetComputeThreads: how many threads one process computes with. LibTorch's at::set_num_threads sizes its own
// intra-op pool but not the BLAS library's: Debian's LibTorch calls libblas.so.3, which scripts/setup points at
// OpenBLAS (pthreads), and OpenBLAS starts one thread per core of its own. With several workers on one machine that
// oversubscribes the cores (a 1-thread worker was seen using ~1.3 cores). So this also calls
// openblas_set_num_threads when the loaded BLAS has it (looked up at run time; a no-op with another BLAS).
// Call once at start-up, before training. Not thread-safe.
#pragma once

namespace diloco {

// Returns whether an OpenBLAS was found and set.
bool SetComputeThreads(int threads);

}  // namespace diloco
