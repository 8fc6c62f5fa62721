// Transport security shared by the coordinator, the workers and diloco-ctl (docs/operations.md "Security"): TLS
// credentials
// (server side, with mutual TLS when a CA is given; client side) built from PEM files, the shared-secret token that
// every RPC carries as metadata ("authorization: Bearer <token>"), the constant-time token comparison the server
// uses, and the loopback test behind the "plaintext on a public address" warning.
// Knows nothing of config/: callers copy the security.* keys into TransportSecurityFiles.
// Stateless functions over immutable values; thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace diloco {

// Paths as configured (security.tls_cert, tls_key, tls_ca, token_file) and the TLS name override; "" = not set.
struct TransportSecurityFiles {
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  std::string token_file;
  std::string server_name;
};

// The loaded material. Immutable once loaded; copy freely.
struct TransportSecurity {
  std::string cert_pem;     // certificate chain: the server's identity, or the client's for mutual TLS
  std::string key_pem;      // private key of cert_pem
  std::string ca_pem;       // CA bundle verifying the peer
  std::string token;        // shared secret; "" = no token
  std::string server_name;  // client: TLS name to verify instead of the target's host

  // Client side: TLS is on when a CA (to verify the coordinator) or a client certificate is configured.
  bool client_tls() const { return !ca_pem.empty() || !cert_pem.empty(); }
  // Server side: TLS is on when the coordinator has a certificate; with a CA it requires client certificates.
  bool server_tls() const { return !cert_pem.empty(); }
  bool mutual_tls() const { return server_tls() && !ca_pem.empty(); }
};

// The metadata key of the token; the value is "Bearer <token>". "x-diloco-token: <token>" is accepted too.
inline constexpr char kAuthMetadataKey[] = "authorization";
inline constexpr char kTokenMetadataKey[] = "x-diloco-token";

// Reads every file that is set; checks that the PEM files parse, that the key matches the certificate, and that the
// token is non-empty printable ASCII (surrounding whitespace, e.g. a trailing newline, is dropped). Errors name the
// config key and the path: "security.tls_key: 'k.pem' does not match the certificate of security.tls_cert".
absl::StatusOr<TransportSecurity> LoadTransportSecurity(const TransportSecurityFiles& files);

// The token in `path` without surrounding whitespace; an error naming security.token_file if unreadable, empty, or
// holding bytes that cannot travel in gRPC metadata.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Coordinator: TLS with cert/key, requiring and verifying client certificates against the CA when one is set;
// plaintext when no certificate is set. Error if a CA is set without a certificate (it would be ignored silently).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TransportSecurity& security);

// Workers and diloco-ctl: TLS verifying the coordinator against the CA (system roots when none), presenting the
// client certificate when set; plaintext when neither a CA nor a certificate is set.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TransportSecurity& security);
// Adds the TLS target-name override (security.server_name) to a channel's arguments, if set.
void ApplyChannelArguments(const TransportSecurity& security, grpc::ChannelArguments* args);
// Attaches the token (if any) to one call.
void AttachToken(const TransportSecurity& security, grpc::ClientContext* ctx);

// a == b, in time that depends on neither the contents nor the lengths: both are hashed with SHA-256 and the
// digests compared with CRYPTO_memcmp.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// True for a listen address on the loopback interface: localhost, 127.0.0.0/8, ::1 (HOST:PORT or [HOST]:PORT).
bool IsLoopbackAddress(const std::string& host_port);

// True if a failed call's message says this client's own TLS checks failed (an SSL error: the coordinator's
// certificate is not signed by tls_ca or lacks the name dialled), as opposed to a coordinator that is not up.
bool LooksLikeTlsFailure(const absl::Status& status);

// For a connection the coordinator closed at once ("Socket closed"): with TLS 1.3 a client whose certificate the
// coordinator refuses sees only that. Returns a hint for the error line ("" for other failures): with client TLS
// on, the coordinator may refuse this client's certificate; with it off, the coordinator may serve TLS.
std::string TlsHint(const std::string& failure_message, bool client_tls);

}  // namespace diloco
