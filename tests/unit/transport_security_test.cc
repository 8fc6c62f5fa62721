// Transport security (proto/transport_security.h) and the security.* keys of the config loader: the token compare,
// the token file, loading and checking PEM files (certificates from scripts/make-certs), the loopback test, and
// the one-line errors naming the key and the path.
#include "proto/transport_security.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "config/config_loader.h"
#include "tests/unit/scratch_dir_test.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(ConstantTimeEqualsTest, EqualOnlyForIdenticalStrings) {
  EXPECT_TRUE(ConstantTimeEquals("s3cret-token", "s3cret-token"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("s3cret-token", "s3cret-tokem"));   // last byte differs
  EXPECT_FALSE(ConstantTimeEquals("s3cret-token", "t3cret-token"));   // first byte differs
  EXPECT_FALSE(ConstantTimeEquals("s3cret-token", "s3cret-token "));  // a prefix of the other
  EXPECT_FALSE(ConstantTimeEquals("s3cret-token", "s3cret"));
  EXPECT_FALSE(ConstantTimeEquals("", "s3cret-token"));
  const std::string with_nul("ab\0cd", 5);
  EXPECT_FALSE(ConstantTimeEquals(with_nul, "ab"));  // not a C-string compare
  EXPECT_TRUE(ConstantTimeEquals(with_nul, std::string("ab\0cd", 5)));
}

TEST(IsLoopbackAddressTest, LoopbackHostsOnly) {
  for (const char* a : {"127.0.0.1:50051", "127.1.2.3:0", "localhost:1", "[::1]:50051"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50051", "10.0.0.5:1", "[::]:50051", "example.com:443", "128.0.0.1:5"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(LooksLikeTlsFailureTest, HandshakeMessagesOnly) {
  EXPECT_TRUE(LooksLikeTlsFailure(absl::UnavailableError("Ssl handshake failed: SSL_ERROR_SSL")));
  EXPECT_TRUE(LooksLikeTlsFailure(absl::UnavailableError("tlsv13 alert certificate required")));
  EXPECT_FALSE(LooksLikeTlsFailure(absl::UnavailableError("failed to connect to all addresses; Connection refused")));
  EXPECT_TRUE(LooksLikeTlsFailure(absl::UnavailableError("Peer name foo.example is not in peer certificate")));
  EXPECT_FALSE(LooksLikeTlsFailure(absl::UnavailableError("failed to connect to all addresses; Handshake timed out")));
}

TEST(TlsHintTest, ClosedSocketHintsDependOnClientTls) {
  const std::string closed =
      "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:5: Socket closed";
  EXPECT_THAT(TlsHint(closed, true), HasSubstr("may refuse this client's certificate"));
  EXPECT_THAT(TlsHint(closed, false), HasSubstr("if it serves TLS, set security.tls_ca"));
  EXPECT_EQ(TlsHint("failed to connect to all addresses; Connection refused", true), "");
  EXPECT_EQ(TlsHint("failed to connect to all addresses; Connection refused", false), "");
}

class TransportSecurityTest : public ScratchDirTest {
 protected:
  // Certificates of scripts/make-certs, made once for the suite.
  static void SetUpTestSuite() {
    certs_ = new std::string(std::filesystem::temp_directory_path() / ("diloco-certs-" + std::to_string(getpid())));
    const std::string command = std::string(DILOCO_SOURCE_DIR) + "/scripts/make-certs " + *certs_ + " >/dev/null";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*certs_);
    delete certs_;
  }
  static std::string Cert(const std::string& name) { return *certs_ + "/" + name; }

  static std::string* certs_;
};
std::string* TransportSecurityTest::certs_ = nullptr;

TEST_F(TransportSecurityTest, TokenFileIsTrimmedAndMustHoldPrintableText) {
  WriteText(Path("token"), "  abc123\n\n");
  auto token = ReadTokenFile(Path("token"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "abc123");

  WriteText(Path("empty"), "\n");
  auto empty = ReadTokenFile(Path("empty"));
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(Message(empty.status()), HasSubstr("security.token_file: '" + Path("empty") + "' is empty"));

  WriteText(Path("binary"), std::string("ab\x01x", 4));
  auto binary = ReadTokenFile(Path("binary"));
  ASSERT_FALSE(binary.ok());
  EXPECT_THAT(Message(binary.status()), HasSubstr("printable ASCII"));

  auto missing = ReadTokenFile(Path("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(Message(missing.status()), HasSubstr("security.token_file: cannot read '" + Path("nope") + "'"));
}

TEST_F(TransportSecurityTest, LoadsMutualTlsMaterial) {
  WriteText(Path("token"), "tok\n");
  auto s = LoadTransportSecurity(
      {Cert("coordinator.pem"), Cert("coordinator.key"), Cert("ca.pem"), Path("token"), "localhost"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->server_tls());
  EXPECT_TRUE(s->mutual_tls());
  EXPECT_TRUE(s->client_tls());
  EXPECT_EQ(s->token, "tok");
  EXPECT_EQ(s->server_name, "localhost");
  EXPECT_THAT(s->cert_pem, HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_TRUE(MakeServerCredentials(*s).ok());

  auto plain = LoadTransportSecurity({});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->server_tls());
  EXPECT_FALSE(plain->client_tls());
  EXPECT_TRUE(plain->token.empty());

  auto client_ca_only = LoadTransportSecurity({"", "", Cert("ca.pem"), "", ""});
  ASSERT_TRUE(client_ca_only.ok()) << client_ca_only.status();
  EXPECT_TRUE(client_ca_only->client_tls());
  EXPECT_FALSE(client_ca_only->server_tls());
  // A coordinator with a CA but no certificate of its own would serve plaintext: refused, naming the key.
  auto server = MakeServerCredentials(*client_ca_only);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(Message(server.status()), HasSubstr("security.tls_ca"));
}

TEST_F(TransportSecurityTest, BadPemFilesAreOneLineErrorsNamingKeyAndPath) {
  auto mismatch = LoadTransportSecurity({Cert("coordinator.pem"), Cert("worker.key"), "", "", ""});
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(Message(mismatch.status()),
              HasSubstr("security.tls_key: '" + Cert("worker.key") + "' does not match the certificate"));

  WriteText(Path("junk.pem"), "not a certificate\n");
  auto junk_cert = LoadTransportSecurity({Path("junk.pem"), Cert("worker.key"), "", "", ""});
  ASSERT_FALSE(junk_cert.ok());
  EXPECT_THAT(Message(junk_cert.status()), HasSubstr("security.tls_cert: '" + Path("junk.pem") + "'"));

  auto junk_key = LoadTransportSecurity({Cert("worker.pem"), Path("junk.pem"), "", "", ""});
  ASSERT_FALSE(junk_key.ok());
  EXPECT_THAT(Message(junk_key.status()), HasSubstr("security.tls_key: '" + Path("junk.pem") + "'"));

  auto junk_ca = LoadTransportSecurity({"", "", Path("junk.pem"), "", ""});
  ASSERT_FALSE(junk_ca.ok());
  EXPECT_THAT(Message(junk_ca.status()), HasSubstr("security.tls_ca: '" + Path("junk.pem") + "'"));

  auto missing = LoadTransportSecurity({"", "", Path("absent.pem"), "", ""});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(Message(missing.status()), HasSubstr("security.tls_ca: cannot read '" + Path("absent.pem") + "'"));
  EXPECT_EQ(Message(missing.status()).find('\n'), std::string::npos);
}

TEST_F(TransportSecurityTest, ConfigLoaderChecksSecurityKeys) {
  const std::string cert = Cert("worker.pem"), key = Cert("worker.key"), ca = Cert("ca.pem");
  WriteText(Path("token"), "secret\n");
  auto good = ParseConfig("security:\n  tls_cert: " + cert + "\n  tls_key: " + key + "\n  tls_ca: " + ca +
                              "\n  token_file: " + Path("token") + "\n  server_name: localhost\n",
                          "run.yaml");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->security.tls_cert, cert);
  EXPECT_EQ(good->security.tls_key, key);
  EXPECT_EQ(good->security.tls_ca, ca);
  EXPECT_EQ(good->security.token_file, Path("token"));
  EXPECT_EQ(good->security.server_name, "localhost");
  EXPECT_THAT(RenderConfig(*good), HasSubstr("security.tls_ca: " + ca));

  auto defaults = ParseConfig("", "run.yaml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_TRUE(defaults->security.tls_cert.empty());
  EXPECT_TRUE(defaults->security.token_file.empty());

  auto half = ParseConfig("", "run.yaml", {"security.tls_cert=" + cert});
  ASSERT_FALSE(half.ok());
  EXPECT_THAT(Message(half.status()), HasSubstr("security.tls_key: must be set together with security.tls_cert"));

  auto missing = ParseConfig("", "run.yaml", {"security.tls_ca=" + Path("absent.pem")});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(Message(missing.status()), HasSubstr("security.tls_ca: cannot read '" + Path("absent.pem") + "'"));

  WriteText(Path("empty-token"), "\n");
  auto empty = ParseConfig("", "run.yaml", {"security.token_file=" + Path("empty-token")});
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(Message(empty.status()), HasSubstr("security.token_file: '" + Path("empty-token") + "' is empty"));

  auto unknown = ParseConfig("security:\n  tls: x\n", "run.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(Message(unknown.status()), HasSubstr("unknown key 'security.tls'"));
}

}  // namespace
}  // namespace diloco
