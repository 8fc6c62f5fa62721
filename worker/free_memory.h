// ReturnFreeMemory: hands the memory the process's allocator keeps after frees back to the kernel, so that it stops
// counting in the resident set. The worker and the coordinator link tcmalloc (CMakeLists.txt), which keeps freed
// spans in its page heap and returns them only slowly; without it (the sanitizer builds) glibc's malloc_trim does the
// same for glibc's heap. Used where a large block was freed that nothing will reuse soon (FlatAdamW's set-up frees
// the model's first copy of the parameters). Costs a walk of the allocator's free lists: call it rarely.
// Thread-safe (both allocators lock their own state).
#pragma once

namespace diloco {

void ReturnFreeMemory();

}  // namespace diloco
