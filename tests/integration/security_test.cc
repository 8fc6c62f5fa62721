// Transport security of a real run (docs/operations.md "Security"): a diloco-coordinator on 127.0.0.1 with mutual TLS
// and a
// shared token (certificates from scripts/make-certs) trains config/tiny.yaml with two good workers while
// intruders try to get in: a worker without a client certificate, one whose certificate another CA signed, one with
// a wrong token, a plaintext worker, diloco-ctl without the token, and a raw gRPC client with a wrong token. Each is
// refused with a clear message and the run completes every round with both good workers. Also: the start-up
// errors of bad security.* keys, the warning for plaintext on a non-loopback address, and server-only TLS with
// security.server_name.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "proto/diloco.grpc.pb.h"
#include "proto/transport_security.h"
#include "tests/process_harness.h"

namespace diloco::testing {
namespace {

int CountOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class Security : public ::testing::Test {
 protected:
  // One set of certificates for the suite: ca, coordinator, worker, other-ca, rogue-worker, token.
  static void SetUpTestSuite() {
    certs_ = new std::string(ScratchDir("security-certs"));
    const std::string command = SourceDir() + "/scripts/make-certs " + *certs_ + " >/dev/null";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    std::ofstream(*certs_ + "/wrong-token") << "not-the-token\n";
  }
  static void TearDownTestSuite() { delete certs_; }
  static std::string C(const std::string& name) { return *certs_ + "/" + name; }

  // --set overrides for a process presenting `identity` (coordinator, worker, rogue-worker; "" = no certificate),
  // verifying its peer with ca.pem, and presenting `token` ("" = none).
  static std::vector<std::string> Tls(const std::string& identity, const std::string& token = "token") {
    std::vector<std::string> out = {"security.tls_ca=" + C("ca.pem")};
    if (!identity.empty()) {
      out.push_back("security.tls_cert=" + C(identity + ".pem"));
      out.push_back("security.tls_key=" + C(identity + ".key"));
    }
    if (!token.empty()) out.push_back("security.token_file=" + C(token));
    return out;
  }
  static std::vector<std::string> Plus(std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  static std::string* certs_;
};
std::string* Security::certs_ = nullptr;

// A raw client of the Coordinator service over mutual TLS, calling GetStatus with `metadata` on one channel.
struct RawClient {
  RawClient(const std::string& address, const std::string& cert, const std::string& key, const std::string& ca) {
    auto security = LoadTransportSecurity({cert, key, ca, "", ""});
    EXPECT_TRUE(security.ok()) << security.status();
    stub = diloco::Coordinator::NewStub(grpc::CreateChannel(address, MakeChannelCredentials(*security)));
  }
  grpc::Status GetStatus(const std::string& key, const std::string& value, StatusReply* reply) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!key.empty()) ctx.AddMetadata(key, value);
    return stub->GetStatus(&ctx, StatusRequest(), reply);
  }
  std::unique_ptr<diloco::Coordinator::Stub> stub;
};

TEST_F(Security, MutualTlsRunWithTokenCompletesWhileIntrudersAreRefused) {
  const std::string dir = ScratchDir("security_mtls");
  RunningProcess coordinator("diloco-coordinator",
                             With(TinyArgs(dir, Tls("coordinator")), {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  EXPECT_TRUE(coordinator.WaitForOutput("transport: mutual TLS (client certificates required); token required", 5))
      << coordinator.output();

  // w0 joins and trains round 1; tiny.yaml's min_workers 2 keeps the round open until w1 joins, after the
  // intruders, so they all knock while the run goes on.
  RunningProcess w0("diloco-worker", With(TinyArgs(dir, Tls("worker")), {"--coordinator", address, "--id", "w0"}));
  ASSERT_TRUE(coordinator.WaitForOutput("joined: worker w0", 60)) << coordinator.output();

  // Intruders. A short connect timeout bounds a worker that would retry.
  const std::vector<std::string> quick = {"workers.connect_timeout_s=5"};
  RunningProcess no_cert("diloco-worker", With(TinyArgs(dir, Plus(Tls(""), quick)),
                                               {"--coordinator", address, "--id", "intruder-nocert"}));
  RunningProcess rogue("diloco-worker", With(TinyArgs(dir, Plus(Tls("rogue-worker"), quick)),
                                             {"--coordinator", address, "--id", "intruder-rogue"}));
  RunningProcess wrong_token("diloco-worker", With(TinyArgs(dir, Plus(Tls("worker", "wrong-token"), quick)),
                                                   {"--coordinator", address, "--id", "intruder-token"}));
  RunningProcess plaintext("diloco-worker",
                           With(TinyArgs(dir, quick), {"--coordinator", address, "--id", "intruder-plain"}));
  const std::vector<std::string> other_ca = {"security.tls_ca=" + C("other-ca.pem")};  // replaces ca.pem
  RunningProcess wrong_ca("diloco-worker", With(TinyArgs(dir, Plus(Plus(Tls("worker"), quick), other_ca)),
                                                {"--coordinator", address, "--id", "intruder-ca"}));

  // A wrong token: UNAUTHENTICATED at Join, not retried: exit 3 with the reason.
  EXPECT_EQ(wrong_token.Wait(60), 3) << wrong_token.output();
  EXPECT_NE(wrong_token.output().find("refused worker intruder-token: wrong token"), std::string::npos)
      << wrong_token.output();
  // The worker cannot verify the coordinator (a CA that did not sign it): its own handshake fails; exit 3 at once.
  EXPECT_EQ(wrong_ca.Wait(60), 3) << wrong_ca.output();
  EXPECT_NE(wrong_ca.output().find("TLS handshake with coordinator " + address + " failed"), std::string::npos)
      << wrong_ca.output();
  // No client certificate, or one the run's CA did not sign: the coordinator ends the TLS 1.3 handshake, which the
  // client sees only as a closed socket; it warns with the likely cause at once, retries for connect_timeout_s
  // and exits 4 with the same hint.
  const std::string refused_hint =
      "closed the connection during the TLS handshake: it may refuse this client's "
      "certificate";
  for (RunningProcess* p : {&no_cert, &rogue}) {
    EXPECT_EQ(p->Wait(60), 4) << p->output();
    EXPECT_EQ(CountOf(p->output(), refused_hint), 2) << p->output();  // the warning and the final error line
    EXPECT_EQ(p->output().find("joined"), std::string::npos) << p->output();
  }
  // Plaintext against TLS: the same, with the hint to turn TLS on.
  EXPECT_EQ(plaintext.Wait(60), 4) << plaintext.output();
  EXPECT_NE(plaintext.output().find("if it serves TLS, set security.tls_ca"), std::string::npos) << plaintext.output();

  // diloco-ctl: with the certificates but no token refused; with the run's config keys (flags here) it works.
  RunningProcess ctl_no_token("diloco-ctl", {"status", "--addr", address, "--json", "--tls-ca", C("ca.pem"),
                                             "--tls-cert", C("worker.pem"), "--tls-key", C("worker.key")});
  EXPECT_EQ(ctl_no_token.Wait(30), 1) << ctl_no_token.output();
  EXPECT_NE(ctl_no_token.output().find("no token"), std::string::npos) << ctl_no_token.output();
  RunningProcess ctl("diloco-ctl", {"status", "--addr", address, "--json", "--tls-ca", C("ca.pem"), "--tls-cert",
                                    C("worker.pem"), "--tls-key", C("worker.key"), "--token-file", C("token")});
  ASSERT_EQ(ctl.Wait(30), 0) << ctl.output();
  EXPECT_EQ(nlohmann::json::parse(ctl.output())["run_name"].get<std::string>(), "tiny") << ctl.output();

  // A raw client: three wrong-token calls on one connection are refused and logged once; both metadata forms of
  // the right token pass.
  RawClient raw(address, C("worker.pem"), C("worker.key"), C("ca.pem"));
  StatusReply reply;
  for (int i = 0; i < 3; ++i) {
    grpc::Status s = raw.GetStatus("authorization", "Bearer guess-" + std::to_string(i), &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  EXPECT_TRUE(raw.GetStatus("authorization", "Bearer " + ReadFile(C("token")).substr(0, 64), &reply).ok());
  EXPECT_TRUE(raw.GetStatus("x-diloco-token", ReadFile(C("token")).substr(0, 64), &reply).ok());

  ASSERT_TRUE(coordinator.Running()) << coordinator.output();
  EXPECT_TRUE(w0.Running()) << w0.output();
  RunningProcess w1("diloco-worker", With(TinyArgs(dir, Tls("worker")), {"--coordinator", address, "--id", "w1"}));
  ASSERT_EQ(w0.Wait(120), 0) << w0.output();
  ASSERT_EQ(w1.Wait(120), 0) << w1.output();
  ASSERT_EQ(coordinator.Wait(60), 0) << coordinator.output();

  const std::string log = coordinator.output();
  // gRPC's own log lines name why each handshake was refused.
  EXPECT_NE(log.find("peer did not return a certificate"), std::string::npos) << log;
  EXPECT_NE(log.find("certificate verify failed"), std::string::npos) << log;
  EXPECT_NE(log.find("wrong version number"), std::string::npos) << log;
  EXPECT_EQ(CountOf(log, "refused GetStatus from"), 2) << log;  // diloco-ctl without token, the raw client once
  EXPECT_EQ(CountOf(log, "as worker intruder-token: wrong token"), 1) << log;

  // The run is unaffected: every round, both good workers in each, and no intruder ever a member.
  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["round"].get<int64_t>(), 3);
  EXPECT_EQ(summary["phase"].get<std::string>(), "complete");
  std::set<std::string> ids;
  for (const auto& w : summary["workers"]) {
    ids.insert(w["id"].get<std::string>());
    EXPECT_EQ(w["rounds_contributed"].get<int64_t>(), 3) << w.dump();
  }
  EXPECT_EQ(ids, (std::set<std::string>{"w0", "w1"}));
}

TEST_F(Security, BadSecurityKeysStopStartUpWithOneLine) {
  const std::string dir = ScratchDir("security_bad_keys");
  struct Case {
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"security.tls_cert=" + C("absent.pem"), "security.tls_key=" + C("coordinator.key")},
       "security.tls_cert: cannot read '" + C("absent.pem") + "'"},
      {{"security.tls_cert=" + C("coordinator.pem")}, "security.tls_key: must be set together with"},
      {{"security.tls_cert=" + C("coordinator.pem"), "security.tls_key=" + C("worker.key")},
       "security.tls_key: '" + C("worker.key") + "' does not match the certificate"},
      {{"security.tls_ca=" + C("ca.pem")}, "security.tls_ca: set on the coordinator without security.tls_cert"},
      {{"security.token_file=" + C("absent-token")}, "security.token_file: cannot read"},
  };
  for (const Case& c : cases) {
    RunningProcess coordinator("diloco-coordinator", TinyArgs(dir, c.overrides));
    EXPECT_EQ(coordinator.Wait(60), 2) << coordinator.output();
    EXPECT_NE(coordinator.output().find(c.message), std::string::npos) << coordinator.output();
  }
  RunningProcess worker(
      "diloco-worker",
      With(TinyArgs(dir, {"security.tls_cert=" + C("worker.pem"), "security.tls_key=" + C("coordinator.key")}),
           {"--coordinator", "127.0.0.1:1", "--id", "w"}));
  EXPECT_EQ(worker.Wait(60), 2) << worker.output();
  EXPECT_NE(worker.output().find("does not match the certificate"), std::string::npos) << worker.output();
}

TEST_F(Security, PlaintextOnNonLoopbackAddressWarns) {
  const std::string dir = ScratchDir("security_public");
  RunningProcess coordinator("diloco-coordinator", TinyArgs(dir, {"coordinator.listen=0.0.0.0:0"}));
  EXPECT_TRUE(coordinator.WaitForOutput("is not a loopback address and the transport is plaintext", 60))
      << coordinator.output();
  coordinator.Signal(SIGTERM);
  EXPECT_NE(coordinator.Wait(60), -1);

  const std::string dir2 = ScratchDir("security_loopback");
  RunningProcess quiet("diloco-coordinator", With(TinyArgs(dir2), {"--port-file", dir2 + "/addr"}));
  ASSERT_FALSE(WaitForAddress(quiet, dir2 + "/addr").empty()) << quiet.output();
  EXPECT_TRUE(quiet.WaitForOutput("transport: plaintext; no token", 10)) << quiet.output();
  EXPECT_EQ(quiet.output().find("not a loopback address"), std::string::npos) << quiet.output();
  quiet.Signal(SIGTERM);
  EXPECT_NE(quiet.Wait(60), -1);
}

TEST_F(Security, ServerOnlyTlsWithServerNameOverride) {
  const std::string dir = ScratchDir("security_server_tls");
  RunningProcess coordinator(
      "diloco-coordinator",
      With(TinyArgs(dir, {"security.tls_cert=" + C("coordinator.pem"), "security.tls_key=" + C("coordinator.key")}),
           {"--port-file", dir + "/addr"}));
  const std::string address = WaitForAddress(coordinator, dir + "/addr");
  ASSERT_FALSE(address.empty()) << coordinator.output();
  EXPECT_TRUE(coordinator.WaitForOutput("transport: TLS (no client certificates); no token", 10));
  // The certificate names localhost and 127.0.0.1: an override to "localhost" verifies; one to another name fails.
  RunningProcess ok("diloco-ctl",
                    {"status", "--addr", address, "--json", "--tls-ca", C("ca.pem"), "--server-name", "localhost"});
  EXPECT_EQ(ok.Wait(30), 0) << ok.output();
  RunningProcess wrong_name("diloco-ctl", {"status", "--addr", address, "--timeout", "3", "--tls-ca", C("ca.pem"),
                                           "--server-name", "elsewhere.example"});
  EXPECT_EQ(wrong_name.Wait(30), 1) << wrong_name.output();
  // A plaintext client of a TLS port gets no answer.
  RunningProcess plain("diloco-ctl", {"status", "--addr", address, "--timeout", "3"});
  EXPECT_EQ(plain.Wait(30), 1) << plain.output();
  coordinator.Signal(SIGTERM);
  EXPECT_NE(coordinator.Wait(60), -1);
}

}  // namespace
}  // namespace diloco::testing
