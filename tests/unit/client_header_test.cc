// worker/client.h (and the round report and heartbeat thread built on it) compile without LibTorch: the first
// includes of this file bring no c10/ATen header with them (c10/macros/Macros.h comes with every one of them).
#include "worker/client.h"
#include "worker/heartbeat_thread.h"
#include "worker/round_report.h"

#ifdef C10_MACROS_MACROS_H_
#error "worker/client.h, worker/heartbeat_thread.h or worker/round_report.h includes a LibTorch header"
#endif

#include <gtest/gtest.h>

namespace diloco {
namespace {

TEST(ClientHeaderTest, CompilesWithoutLibTorch) { EXPECT_EQ(PullResult().inner_steps, 0); }

}  // namespace
}  // namespace diloco
