#include "worker/free_memory.h"

#include <malloc.h>

// tcmalloc's C entry point (gperftools/malloc_extension_c.h), weak: null in a process that does not link tcmalloc.
extern "C" void MallocExtension_ReleaseFreeMemory(void) __attribute__((weak));

namespace diloco {

void ReturnFreeMemory() {
  if (MallocExtension_ReleaseFreeMemory != nullptr) {
    MallocExtension_ReleaseFreeMemory();
  } else {
    malloc_trim(0);
  }
}

}  // namespace diloco
