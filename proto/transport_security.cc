#include "proto/transport_security.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

absl::StatusOr<std::string> ReadWhole(const char* key, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": cannot read '", path, "' (", std::strerror(errno), ")"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

BioPtr MemoryBio(const std::string& pem) { return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

// The first certificate of a PEM text, or null.
X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemoryBio(pem);
  return X509Ptr(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

// Parses the certificate, the key and the CA; checks that the key belongs to the certificate.
absl::Status CheckPem(const TransportSecurityFiles& files, const TransportSecurity& s) {
  X509Ptr cert;
  if (!s.cert_pem.empty()) {
    cert = FirstCertificate(s.cert_pem);
    if (!cert) {
      return absl::InvalidArgumentError(
          absl::StrCat("security.tls_cert: '", files.tls_cert, "' holds no PEM certificate"));
    }
  }
  if (!s.key_pem.empty()) {
    BioPtr bio = MemoryBio(s.key_pem);
    PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
    if (!key) {
      return absl::InvalidArgumentError(
          absl::StrCat("security.tls_key: '", files.tls_key, "' holds no PEM private key (or it is encrypted)"));
    }
    if (cert && X509_check_private_key(cert.get(), key.get()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("security.tls_key: '", files.tls_key,
                                                     "' does not match the certificate of security.tls_cert '",
                                                     files.tls_cert, "'"));
    }
  }
  if (!s.ca_pem.empty() && !FirstCertificate(s.ca_pem)) {
    return absl::InvalidArgumentError(absl::StrCat("security.tls_ca: '", files.tls_ca, "' holds no PEM certificate"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  auto text = ReadWhole("security.token_file", path);
  if (!text.ok()) return text.status();
  const std::string token(absl::StripAsciiWhitespace(*text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("security.token_file: '", path,
                                                   "' is empty; put the run's shared secret in it "
                                                   "(e.g. openssl rand -hex 32)"));
  }
  for (unsigned char c : token) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "security.token_file: '", path,
          "' holds a line break or a byte outside printable ASCII; use one line, e.g. from openssl rand -hex 32"));
    }
  }
  return token;
}

absl::StatusOr<TransportSecurity> LoadTransportSecurity(const TransportSecurityFiles& files) {
  TransportSecurity s;
  s.server_name = files.server_name;
  for (auto [key, path, dest] : {std::tuple{"security.tls_cert", &files.tls_cert, &s.cert_pem},
                                 std::tuple{"security.tls_key", &files.tls_key, &s.key_pem},
                                 std::tuple{"security.tls_ca", &files.tls_ca, &s.ca_pem}}) {
    if (path->empty()) continue;
    auto text = ReadWhole(key, *path);
    if (!text.ok()) return text.status();
    *dest = std::move(*text);
  }
  if (s.cert_pem.empty() != s.key_pem.empty()) {
    return absl::InvalidArgumentError(
        "security.tls_cert and security.tls_key: set both (a PEM certificate and its private key) or neither");
  }
  if (absl::Status ok = CheckPem(files, s); !ok.ok()) return ok;
  if (!files.token_file.empty()) {
    auto token = ReadTokenFile(files.token_file);
    if (!token.ok()) return token.status();
    s.token = std::move(*token);
  }
  return s;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TransportSecurity& security) {
  if (!security.server_tls()) {
    if (!security.ca_pem.empty()) {
      return absl::InvalidArgumentError(
          "security.tls_ca: set on the coordinator without security.tls_cert and security.tls_key; mutual TLS "
          "needs the coordinator's own certificate too");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions options(security.mutual_tls()
                                                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = security.ca_pem;
  options.pem_key_cert_pairs.push_back({security.key_pem, security.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TransportSecurity& security) {
  if (!security.client_tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = security.ca_pem;
  options.pem_private_key = security.key_pem;
  options.pem_cert_chain = security.cert_pem;
  return grpc::SslCredentials(options);
}

void ApplyChannelArguments(const TransportSecurity& security, grpc::ChannelArguments* args) {
  if (!security.server_name.empty()) args->SetSslTargetNameOverride(security.server_name);
}

void AttachToken(const TransportSecurity& security, grpc::ClientContext* ctx) {
  if (!security.token.empty()) ctx->AddMetadata(kAuthMetadataKey, "Bearer " + security.token);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char da[SHA256_DIGEST_LENGTH], db[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(a.data()), a.size(), da);
  SHA256(reinterpret_cast<const unsigned char*>(b.data()), b.size(), db);
  return CRYPTO_memcmp(da, db, SHA256_DIGEST_LENGTH) == 0;
}

bool IsLoopbackAddress(const std::string& host_port) {
  std::string host = host_port.substr(0, host_port.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (absl::StartsWith(host, "ipv4:")) host = host.substr(5);
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

bool LooksLikeTlsFailure(const absl::Status& status) {
  const std::string m = absl::AsciiStrToLower(status.message());
  // Not a bare "handshake": gRPC also says "handshaker shutdown" or "Handshake timed out" for a slow connection.
  for (const char* word : {"ssl", "certificate", "peer name"}) {
    if (absl::StrContains(m, word)) return true;
  }
  return false;
}

std::string TlsHint(const std::string& failure_message, bool client_tls) {
  const std::string m = absl::AsciiStrToLower(failure_message);
  if (!absl::StrContains(m, "socket closed") && !absl::StrContains(m, "connection reset")) return "";
  if (client_tls) {
    return "the coordinator closed the connection during the TLS handshake: it may refuse this client's certificate "
           "(security.tls_cert/tls_key must be signed by the coordinator's security.tls_ca; the coordinator's log "
           "names the reason)";
  }
  return "the coordinator closed the connection at once: if it serves TLS, set security.tls_ca (and "
         "security.tls_cert/tls_key if it requires client certificates)";
}

}  // namespace diloco
