// SettledRound: for the integration tests' hand-written gRPC clients (a hostile or foreign member). Header-only;
// thread-safe as the stub is.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "proto/diloco.grpc.pb.h"

namespace diloco::testing {

// The round the open round is based on, once no close is in flight (GetStatus phase "training"), polled for up to
// 60 s: a Join that lands while the other members' round closes answers the round before the step, and pulls and
// pushes against it would be stale. From the caller's Join on, the open round waits for its push.
inline int64_t SettledRound(Coordinator::Stub& stub) {
  StatusReply status;
  for (int i = 0; i < 600; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status s = stub.GetStatus(&ctx, StatusRequest(), &status);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (s.ok() && status.phase() == "training") return status.round();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "the coordinator stayed in phase " << status.phase();
  return status.round();
}

}  // namespace diloco::testing
