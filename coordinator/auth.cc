#include "coordinator/auth.h"

#include <spdlog/spdlog.h>

#include "proto/peer_text.h"
#include "proto/transport_security.h"

namespace diloco {
namespace {

// The token the call presents, and whether it presented one at all.
bool PresentedToken(const grpc::ServerContextBase& ctx, std::string* token) {
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find(kAuthMetadataKey); it != metadata.end()) {
    const std::string value(it->second.data(), it->second.size());
    constexpr std::string_view kBearer = "Bearer ";
    *token = value.compare(0, kBearer.size(), kBearer) == 0 ? value.substr(kBearer.size()) : value;
    return true;
  }
  if (auto it = metadata.find(kTokenMetadataKey); it != metadata.end()) {
    token->assign(it->second.data(), it->second.size());
    return true;
  }
  return false;
}

}  // namespace

grpc::Status TokenAuthenticator::Check(const grpc::ServerContextBase& ctx, std::string_view method,
                                       std::string_view who) {
  if (token_.empty()) return grpc::Status::OK;
  std::string presented;
  const bool has_token = PresentedToken(ctx, &presented);
  if (has_token && ConstantTimeEquals(presented, token_)) return grpc::Status::OK;
  const std::string why = has_token ? "wrong token (the caller's security.token_file differs)"
                                    : "no token (the caller has no security.token_file)";
  const std::string peer = ctx.peer();
  {
    absl::MutexLock lock(&mu_);
    ++refused_;
    if (warned_peers_.size() < kMaxWarnedPeers && warned_peers_.insert(peer).second) {
      spdlog::warn("refused {} from {}{}{}: {}, UNAUTHENTICATED; further refusals from this peer are not logged",
                   method, peer, who.empty() ? "" : " as worker ", Truncated(absl::string_view(who.data(), who.size())),
                   why);
      if (warned_peers_.size() == kMaxWarnedPeers) {
        spdlog::warn("{} peers refused for their token; refusals from new peers are no longer logged", kMaxWarnedPeers);
      }
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      has_token ? "wrong token: security.token_file does not hold this coordinator's token"
                                : "no token: this coordinator requires the token of security.token_file");
}

int64_t TokenAuthenticator::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

grpc::ServerUnaryReactor* RefuseUnary(TokenAuthenticator& auth, grpc::CallbackServerContext* ctx,
                                      std::string_view method, std::string_view who) {
  if (!auth.enabled()) return nullptr;
  grpc::Status status = auth.Check(*ctx, method, who);
  if (status.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace diloco
