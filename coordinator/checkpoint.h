// The coordinator's checkpoint file format lives in proto/checkpoint.h (the data-parallel baseline in worker/ reads
// it too, for model.init_from, and worker/ may not include coordinator/). This header keeps the old include path.
#pragma once

#include "proto/checkpoint.h"
