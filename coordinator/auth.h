// TokenAuthenticator: the coordinator's check of the shared-secret token (security.token_file) on every call of the
// diloco.Coordinator service. The token travels as metadata "authorization: Bearer <token>" (or
// "x-diloco-token: <token>") and is compared in constant time (proto/transport_security.h). A call without it, or
// with a wrong one, is refused with UNAUTHENTICATED; the first refusal from each peer (gRPC peer address, one per
// connection) is logged, later ones from the same peer are not. It works over plaintext and TLS alike (with TLS,
// certificates are checked earlier, by the transport). With no token configured every call passes.
// Thread-safety: Check may be called from any gRPC thread at once (the set of warned peers is under a mutex).
#pragma once

#include <grpcpp/grpcpp.h>

#include <set>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace diloco {

class TokenAuthenticator {
 public:
  explicit TokenAuthenticator(std::string token) : token_(std::move(token)) {}

  bool enabled() const { return !token_.empty(); }
  // OK, or UNAUTHENTICATED saying whether the token was missing or wrong. `method` and `who` (a worker id, if the
  // request names one) only go into the log line.
  grpc::Status Check(const grpc::ServerContextBase& ctx, std::string_view method, std::string_view who = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // At most this many peers are remembered; beyond it refusals are no longer logged (one line says so).
  static constexpr size_t kMaxWarnedPeers = 4096;

  const std::string token_;
  mutable absl::Mutex mu_;
  std::set<std::string> warned_peers_ ABSL_GUARDED_BY(mu_);
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

// Checks one unary call: a reactor already finished with UNAUTHENTICATED when the check fails, nullptr when the call
// may go on. Usage at the top of a handler: if (auto* r = RefuseUnary(auth, ctx, "Join", id)) return r;
grpc::ServerUnaryReactor* RefuseUnary(TokenAuthenticator& auth, grpc::CallbackServerContext* ctx,
                                      std::string_view method, std::string_view who = {});

// The same for a streaming call: Reactor is grpc::ServerWriteReactor<T> or grpc::ServerReadReactor<T>.
template <typename Reactor>
Reactor* RefuseStream(TokenAuthenticator& auth, grpc::CallbackServerContext* ctx, std::string_view method) {
  if (!auth.enabled()) return nullptr;
  grpc::Status status = auth.Check(*ctx, method);
  if (status.ok()) return nullptr;
  // A reactor that finishes at once with the refusal and deletes itself when gRPC is done with it.
  class Refused : public Reactor {
   public:
    explicit Refused(const grpc::Status& s) { this->Finish(s); }
    void OnDone() override { delete this; }
  };
  return new Refused(status);
}

}  // namespace diloco
