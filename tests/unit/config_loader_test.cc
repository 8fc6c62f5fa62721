// The strict config loader (config/config_loader.h): unknown keys, wrong types, overrides, cross-field checks.
#include "config/config_loader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace diloco {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(ConfigLoaderTest, EmptyDocumentGivesDefaults) {
  absl::StatusOr<Config> c = ParseConfig("", "empty.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const Config defaults;
  EXPECT_EQ(c->model.vocab_size, 512);
  EXPECT_EQ(c->model.d_model, 128);
  EXPECT_EQ(c->model.n_head, 4);
  EXPECT_DOUBLE_EQ(c->inner.lr, 2e-3);
  EXPECT_EQ(c->inner.warmup_steps, 50);
  EXPECT_DOUBLE_EQ(c->inner.min_lr_ratio, 0.1);
  EXPECT_EQ(c->inner.steps, 50);
  EXPECT_EQ(c->outer.optimizer, OuterOptimizerKind::kNesterov);
  EXPECT_DOUBLE_EQ(c->outer.lr, 0.7);
  EXPECT_DOUBLE_EQ(c->outer.momentum, 0.9);
  EXPECT_EQ(c->outer.rounds, 20);
  EXPECT_EQ(c->coordinator.min_workers, 1);
  EXPECT_DOUBLE_EQ(c->coordinator.lease_s, 10.0);
  EXPECT_EQ(c->comm.chunk_bytes, 1 << 20);
  EXPECT_EQ(RenderConfig(*c), RenderConfig(defaults));
  EXPECT_EQ(c->CacheDir(), "runs/diloco/data");
  EXPECT_EQ(c->CheckpointDir(), "runs/diloco/checkpoints");
}

TEST(ConfigLoaderTest, ValuesFromYaml) {
  absl::StatusOr<Config> c = ParseConfig(
      "inner: {lr: 0.01, steps: 7}\nouter: {optimizer: sgd, momentum: 0}\ndata: {cache_dir: /tmp/x}\n", "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->inner.lr, 0.01);
  EXPECT_EQ(c->inner.steps, 7);
  EXPECT_EQ(c->outer.optimizer, OuterOptimizerKind::kSgd);
  EXPECT_EQ(c->outer.momentum, 0);
  EXPECT_EQ(c->CacheDir(), "/tmp/x");
  EXPECT_EQ(c->inner.batch_size, 16) << "keys not in the file keep their defaults";
}

TEST(ConfigLoaderTest, UnknownKeyIsNamed) {
  absl::StatusOr<Config> c = ParseConfig("inner: {lrr: 1}\n", "my.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(c.status()), HasSubstr("inner.lrr"));
  EXPECT_THAT(Message(c.status()), HasSubstr("my.yaml"));
}

TEST(ConfigLoaderTest, UnknownSectionIsNamed) {
  absl::StatusOr<Config> c = ParseConfig("optimiser: {lr: 1}\n", "my.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("optimiser"));
  EXPECT_THAT(Message(c.status()), HasSubstr("section"));
}

TEST(ConfigLoaderTest, WrongTypeNamesKey) {
  absl::StatusOr<Config> c = ParseConfig("inner:\n  lr: abc\n", "my.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("inner.lr"));
  EXPECT_THAT(Message(c.status()), HasSubstr("abc"));
}

TEST(ConfigLoaderTest, FractionForIntegerKeyIsRejected) {
  absl::StatusOr<Config> c = ParseConfig("inner: {steps: 1.5}\n", "my.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("inner.steps"));
}

TEST(ConfigLoaderTest, ListForScalarKeyIsRejected) {
  absl::StatusOr<Config> c = ParseConfig("model: {n_layer: [1, 2]}\n", "my.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("model.n_layer"));
}

TEST(ConfigLoaderTest, SetOverrideApplies) {
  absl::StatusOr<Config> c = ParseConfig("outer: {rounds: 3}\n", "my.yaml", {"outer.rounds=7", "inner.lr=0.5"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->outer.rounds, 7) << "--set wins over the file";
  EXPECT_DOUBLE_EQ(c->inner.lr, 0.5);
}

// A string key takes --set's text as written where YAML would read a flow list or map (an IPv6 address in brackets);
// a list for a number is still refused, and the file's YAML is read as YAML.
TEST(ConfigLoaderTest, SetOfAStringKeyTakesBracketsAsWritten) {
  absl::StatusOr<Config> c =
      ParseConfig("", "my.yaml", {"coordinator.listen=[::1]:5000", "security.server_name={odd}"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->coordinator.listen, "[::1]:5000");
  EXPECT_EQ(c->security.server_name, "{odd}");
  c = ParseConfig("", "my.yaml", {"coordinator.listen=[::]:0"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->coordinator.listen, "[::]:0");
  c = ParseConfig("", "my.yaml", {"outer.rounds=[1, 2]"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("outer.rounds"));
  c = ParseConfig("coordinator: {listen: '[::1]:5000'}\n", "my.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->coordinator.listen, "[::1]:5000");
}

TEST(ConfigLoaderTest, SetUnknownKeyIsNamed) {
  absl::StatusOr<Config> c = ParseConfig("", "my.yaml", {"outer.roundz=7"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("outer.roundz"));
}

TEST(ConfigLoaderTest, SetWrongTypeIsNamed) {
  absl::StatusOr<Config> c = ParseConfig("", "my.yaml", {"outer.rounds=many"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("outer.rounds"));
}

// yaml-cpp reads 010 as octal 8 (YAML 1.1) where YAML 1.2 and most readers of a config expect 10: an integer key
// with a leading zero is refused, from the file and from --set, naming the key and the text. Before, outer.rounds:
// 010 ran 8 rounds. 0, 10, +10 and 0x10 (explicitly hexadecimal) are read as before.
TEST(ConfigLoaderTest, AnIntegerWithALeadingZeroIsRefused) {
  for (const std::string text : {"010", "-010", "+07", "00"}) {
    absl::StatusOr<Config> c = ParseConfig("outer: {rounds: " + text + "}\n", "my.yaml");
    ASSERT_FALSE(c.ok()) << text << " read as " << c->outer.rounds;
    EXPECT_THAT(Message(c.status()), HasSubstr("my.yaml: outer.rounds: '" + text + "' has a leading zero"));
    c = ParseConfig("", "my.yaml", {"inner.steps=" + text});
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_THAT(Message(c.status()), HasSubstr("--set inner.steps=" + text + ": inner.steps: '" + text + "'"));
  }
  for (const auto& [text, value] :
       std::vector<std::pair<std::string, int64_t>>{{"10", 10}, {"+10", 10}, {"0x10", 16}}) {
    absl::StatusOr<Config> c = ParseConfig("outer: {rounds: " + text + "}\n", "my.yaml");
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    EXPECT_EQ(c->outer.rounds, value) << text;
  }
  absl::StatusOr<Config> c = ParseConfig("comm: {tcp_port: 0}\ninner: {lr: 0.05}\n", "my.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->inner.lr, 0.05) << "a number key's 0.05 is not an integer with a leading zero";
}

// A value that fails its range check names where it came from: the --set that gave it, or the file. Before, a
// --set outer.rounds=0 was reported as "my.yaml: outer.rounds: must be > 0", sending the user to the file.
TEST(ConfigLoaderTest, ARangeErrorNamesTheSetThatGaveTheValue) {
  absl::StatusOr<Config> c = ParseConfig("outer: {rounds: 3}\n", "my.yaml", {"inner.lr=0.5", "outer.rounds=0"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("--set outer.rounds=0: outer.rounds: must be > 0"));
  c = ParseConfig("outer: {rounds: 0}\n", "my.yaml", {"inner.lr=0.5"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("my.yaml: outer.rounds: must be > 0"));
}

TEST(ConfigLoaderTest, SetWithoutEqualsIsRejected) {
  absl::StatusOr<Config> c = ParseConfig("", "my.yaml", {"outer.rounds"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("outer.rounds"));
}

TEST(ConfigLoaderTest, MissingFileNamesPath) {
  const std::string path = "/nonexistent/dir/diloco-missing.yaml";
  absl::StatusOr<Config> c = LoadConfig(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(c.status()), HasSubstr(path));
}

// A directory where the file should be (Docker bind-mounts a missing file as one) or an empty file loaded as all
// defaults with no word; each is now one line naming the path.
TEST(ConfigLoaderTest, ADirectoryOrAnEmptyFileIsNotAConfig) {
  const std::string dir = ::testing::TempDir() + "/config_loader_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir + "/config.yaml");
  absl::StatusOr<Config> c = LoadConfig(dir + "/config.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr(dir + "/config.yaml: is a directory"));
  for (const char* text : {"", "\n  \n", "# only a comment\n"}) {
    std::ofstream(dir + "/empty.yaml") << text;
    c = LoadConfig(dir + "/empty.yaml");
    ASSERT_FALSE(c.ok()) << "'" << text << "'";
    EXPECT_THAT(Message(c.status()), HasSubstr(dir + "/empty.yaml: holds no settings"));
  }
  std::filesystem::remove_all(dir);
}

// Keys whose values used to pass unchecked: AdamW's betas outside [0, 1) (beta 1 makes the bias correction 0), a
// heartbeat no more frequent than the lease (every worker lost between two), a listen address without a port (gRPC
// took 443), a negative connect timeout; an empty value and a key that is not a name.
TEST(ConfigLoaderTest, RangesAndCrossChecksAddedFromTheReview) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  for (const Case& k : {Case{"inner: {beta1: 1.0}", "inner.beta1"}, Case{"inner: {beta2: .nan}", "inner.beta2"},
                        Case{"inner: {beta2: -0.1}", "inner.beta2"},
                        Case{"coordinator: {heartbeat_interval_s: 3, lease_s: 1}",
                             "coordinator.heartbeat_interval_s (3) must be below coordinator.lease_s (1)"},
                        Case{"coordinator: {listen: 127.0.0.1}", "coordinator.listen"},
                        Case{"workers: {connect_timeout_s: -1}", "workers.connect_timeout_s"},
                        Case{"inner:\n  lr:\n", "inner.lr: expected a number, got nothing"},
                        Case{"inner:\n  ? [a, b]\n  : 1\n", "a key that is not a plain name"},
                        Case{"run: {name: \"caf\xe9\"}", "run.name"}}) {
    absl::StatusOr<Config> c = ParseConfig(k.yaml, "my.yaml");
    ASSERT_FALSE(c.ok()) << k.yaml;
    EXPECT_THAT(Message(c.status()), HasSubstr(k.message)) << k.yaml;
  }
  EXPECT_TRUE(ParseConfig("run: {name: \"café 東京\"}\ninner: {beta1: 0.0, beta2: 0.999}\n"
                          "coordinator: {heartbeat_interval_s: 1, lease_s: 1.5}",
                          "my.yaml")
                  .ok());
}

// YAML's infinities and NaN passed every "> 0" rule: outer.lr .inf failed every outer step's finiteness check (each
// redo quarantined a healthy worker). No key takes a non-finite number.
TEST(ConfigLoaderTest, NoKeyTakesANonFiniteNumber) {
  for (const char* yaml : {"outer: {lr: .inf}", "outer: {clip_factor: .Inf}", "outer: {cclip_tau: .inf}",
                           "inner: {lr: .nan}", "coordinator: {round_timeout_s: -.inf}"}) {
    absl::StatusOr<Config> c = ParseConfig(yaml, "my.yaml");
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_THAT(Message(c.status()), HasSubstr("expected a finite number")) << yaml;
  }
  EXPECT_TRUE(ParseConfig("outer: {lr: 0.7, clip_factor: 2.5}", "my.yaml").ok());
}

// A key or a section twice in one file: YAML forbids it, yaml-cpp kept both and the later value won in silence.
// --set still overrides the file's value.
TEST(ConfigLoaderTest, AKeyOrSectionSetTwiceIsAnErrorNamingBothLines) {
  absl::StatusOr<Config> c = ParseConfig("inner:\n  lr: 0.001\n  steps: 3\n  lr: 0.5\n", "run.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(Message(c.status()), "run.yaml:4: 'inner.lr' is set twice (first on line 2)");
  c = ParseConfig("inner: {lr: 0.001}\nouter: {lr: 0.7}\ninner: {steps: 3}\n", "run.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("run.yaml:3: 'inner' is set twice (first on line 1)"));
  c = ParseConfig("inner: {lr: 0.001}\nouter: {lr: 0.7}\n", "run.yaml", {"inner.lr=0.002"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->inner.lr, 0.002);
}

// The keys a worker cluster's ranks compare at start (WorkerCluster::AttachTo): those that decide a step's collectives
// and the replicas' math, not those that may differ from machine to machine (paths, devices, threads, timeouts).
TEST(ConfigLoaderTest, TheClusterConfigHoldsTheKeysEveryRankMustShare) {
  absl::StatusOr<Config> a = ParseConfig("inner: {micro_batch_size: 4}\nworkers: {threads: 2}", "a.yaml");
  absl::StatusOr<Config> b = ParseConfig(
      "inner: {micro_batch_size: 2, lr: 0.001}\ncomm: {cluster_parts: true}\n"
      "workers: {threads: 7, device: cuda:1, cluster_timeout_s: 5}\ndata: {cache_dir: /elsewhere}\n",
      "b.yaml");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string mine = RenderClusterConfig(*a), theirs = RenderClusterConfig(*b);
  EXPECT_THAT(mine, HasSubstr("inner.lr: 0.002\n"));
  EXPECT_THAT(mine, HasSubstr("workers.sharding: none\n"));
  EXPECT_THAT(mine, HasSubstr("model.n_layer: "));
  for (const char* key : {"model.init_from", "workers.threads", "workers.device", "workers.cluster_timeout_s",
                          "data.cache_dir", "run.output_dir", "comm.tcp_port", "inner.micro_batch_size"}) {
    EXPECT_THAT(mine, Not(HasSubstr(key))) << key;
  }
  EXPECT_EQ(ConfigDifference(mine, theirs, "rank 1"), "inner.lr 0.002 where rank 1 has 0.001 (and 1 more key)");
  EXPECT_EQ(ConfigDifference(mine, mine, "rank 1"), "");
  EXPECT_EQ(ConfigDifference("a: 1\n", "a: 1\nb: 2\n", "rank 0"), "no b where rank 0 has 2");
}

// diloco-ctl status / leave / checkpoint read only the run file's security: section (and security.* overrides): a
// data path that exists only on the run's machines no longer stops them, while a wrong security key still does.
TEST(ConfigLoaderTest, TheSecuritySectionLoadsAlone) {
  const std::string dir = ::testing::TempDir() + "/security_only_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/token") << "secret\n";
  std::ofstream(dir + "/run.yaml") << "data: {tokenizer: /data/cluster-only/tokenizer.model}\n"
                                   << "security: {token_file: " << dir << "/token}\n";
  EXPECT_FALSE(LoadConfig(dir + "/run.yaml").ok());
  absl::StatusOr<SecurityConfig> security = LoadSecurityConfig(dir + "/run.yaml");
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_EQ(security->token_file, dir + "/token");
  security = LoadSecurityConfig(dir + "/run.yaml", {"security.server_name=coord.example", "inner.lr=-1"});
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_EQ(security->server_name, "coord.example");
  std::ofstream(dir + "/bad.yaml") << "security: {token_fil: x}\n";
  security = LoadSecurityConfig(dir + "/bad.yaml");
  ASSERT_FALSE(security.ok());
  EXPECT_THAT(Message(security.status()), HasSubstr("unknown key 'security.token_fil'"));
  std::filesystem::remove_all(dir);
}

TEST(ConfigLoaderTest, DModelNotDivisibleByNHeadNamesBothKeys) {
  absl::StatusOr<Config> c = ParseConfig("model: {d_model: 100, n_head: 3}\n", "my.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(Message(c.status()), HasSubstr("model.d_model"));
  EXPECT_THAT(Message(c.status()), HasSubstr("model.n_head"));
}

TEST(ConfigLoaderTest, CrossFieldChecksNameTheKey) {
  struct Case {
    const char* yaml;
    const char* key;
  };
  for (const Case& k :
       {Case{"outer: {optimizer: adam}", "outer.optimizer"}, Case{"outer: {momentum: 1.0}", "outer.momentum"},
        Case{"inner: {steps: 0}", "inner.steps"}, Case{"data: {val_fraction: 1.0}", "data.val_fraction"},
        Case{"model: {vocab_size: 5000000000}", "model.vocab_size"}, Case{"inner: {optimizer: sgd}", "inner.optimizer"},
        Case{"model: {n_layer: 1}\ncomm: {fragments: 3}", "comm.fragments"},
        Case{"model: {n_layer: 4}\ninner: {steps: 10}\ncomm: {fragments: 3}", "comm.fragments"},
        Case{"inner: {steps: 10}\ncomm: {fragments: 2, overlap_steps: 6}", "comm.overlap_steps"},
        Case{"comm: {merge_alpha: 1.5}", "comm.merge_alpha"}, Case{"comm: {transport: udp}", "comm.transport"},
        Case{"comm: {tcp_port: 70000}", "comm.tcp_port"},
        Case{"comm: {transport: tcp}\nsecurity: {tls_cert: c.pem, tls_key: c.key}", "comm.transport"}}) {
    absl::StatusOr<Config> c = ParseConfig(k.yaml, "my.yaml");
    ASSERT_FALSE(c.ok()) << k.yaml;
    EXPECT_THAT(Message(c.status()), HasSubstr(k.key)) << k.yaml;
  }
}

// Every mode is an enum parsed through its name table: a wrong name is refused with the key, what was given and
// every allowed name (from the file and from --set alike); names round-trip through RenderConfig.
TEST(ConfigLoaderTest, ModesAreEnumsWithTheirAllowedNames) {
  struct Case {
    const char* key;
    const char* bad;
    const char* expected;
  };
  for (const Case& k :
       {Case{"outer.mode", "asynch", "outer.mode: expected 'sync' or 'async', got 'asynch'"},
        Case{"outer.optimizer", "adam", "outer.optimizer: expected 'nesterov' or 'sgd', got 'adam'"},
        Case{"outer.late_policy", "keep", "expected 'drop' or 'reuse_local', got 'keep'"},
        Case{"inner.optimizer", "sgd", "inner.optimizer: expected 'adamw', got 'sgd'"},
        Case{"data.split", "random", "data.split: expected 'iid' or 'contiguous', got 'random'"},
        Case{"comm.codec", "int2", "expected 'fp32', 'bf16', 'fp16', 'int8', 'int4' or 'topk', got 'int2'"},
        Case{"comm.pull_codec", "FP32", "comm.pull_codec: expected 'fp32', 'bf16'"},
        Case{"comm.transport", "udp", "comm.transport: expected 'grpc' or 'tcp', got 'udp'"},
        Case{"workers.precision", "fp16", "workers.precision: expected 'fp32' or 'bf16', got 'fp16'"}}) {
    const std::string key = k.key;
    const std::string yaml = key.substr(0, key.find('.')) + ": {" + key.substr(key.find('.') + 1) + ": " + k.bad + "}";
    absl::StatusOr<Config> from_file = ParseConfig(yaml, "my.yaml");
    ASSERT_FALSE(from_file.ok()) << yaml;
    EXPECT_THAT(Message(from_file.status()), HasSubstr(k.expected)) << yaml;
    EXPECT_THAT(Message(from_file.status()), HasSubstr("my.yaml")) << yaml;
    absl::StatusOr<Config> from_flag = ParseConfig("", "my.yaml", {key + "=" + k.bad});
    ASSERT_FALSE(from_flag.ok()) << key;
    EXPECT_THAT(Message(from_flag.status()), HasSubstr(k.expected)) << key;
  }
  absl::StatusOr<Config> empty = ParseConfig("outer: {mode: }\n", "my.yaml");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(Message(empty.status()), HasSubstr("outer.mode: expected 'sync' or 'async', got ''"));
  absl::StatusOr<Config> c = ParseConfig(
      "outer: {mode: async, late_policy: reuse_local}\ncomm: {codec: int4, transport: tcp}\n"
      "data: {split: contiguous}\nworkers: {precision: bf16}\n",
      "my.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->outer.mode, OuterMode::kAsync);
  EXPECT_EQ(c->outer.late_policy, LatePolicy::kReuseLocal);
  EXPECT_EQ(c->comm.codec, WireCodec::kInt4);
  EXPECT_EQ(c->comm.pull_codec, WireCodec::kFp32);
  EXPECT_EQ(c->comm.transport, PushTransport::kTcp);
  EXPECT_EQ(c->data.split, DataSplit::kContiguous);
  EXPECT_EQ(c->workers.precision, Precision::kBf16);
  for (const char* line :
       {"outer.mode: async\n", "outer.late_policy: reuse_local\n", "comm.codec: int4\n", "comm.transport: tcp\n",
        "data.split: contiguous\n", "workers.precision: bf16\n", "outer.optimizer: nesterov\n"}) {
    EXPECT_THAT(RenderConfig(*c), HasSubstr(line));
  }
  absl::StatusOr<Config> again = ParseConfig("", "again.yaml",
                                             {"outer.mode=async", "outer.late_policy=reuse_local", "comm.codec=int4",
                                              "comm.transport=tcp", "data.split=contiguous", "workers.precision=bf16"});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ConfigHash(*again), ConfigHash(*c));
}

TEST(ConfigLoaderTest, HashFollowsTheResolvedConfig) {
  absl::StatusOr<Config> a = ParseConfig("outer: {rounds: 3}\n", "a.yaml");
  absl::StatusOr<Config> b = ParseConfig("", "b.yaml", {"outer.rounds=3"});
  absl::StatusOr<Config> c = ParseConfig("outer: {rounds: 4}\n", "c.yaml");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(ConfigHash(*a), ConfigHash(*b));
  EXPECT_NE(ConfigHash(*a), ConfigHash(*c));
  EXPECT_EQ(ConfigHash(*a).size(), 16u);
  EXPECT_THAT(RenderConfig(*a), HasSubstr("outer.rounds: 3\n"));
}

TEST(ConfigLoaderTest, KeysWithDefaultsListsEveryRenderedKey) {
  const auto keys = ConfigKeysWithDefaults();
  ASSERT_FALSE(keys.empty());
  std::string rendered;
  for (const auto& [key, value] : keys) rendered += key + ": " + value + "\n";
  EXPECT_EQ(rendered, RenderConfig(Config{}));
}

TEST(ConfigLoaderTest, ShippedConfigsParse) {
  const std::string root = DILOCO_SOURCE_DIR;
  absl::StatusOr<Config> demo = LoadConfig(root + "/config/demo.yaml");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ(demo->run.name, "demo");
  EXPECT_EQ(demo->workers.count, 4);
  EXPECT_EQ(demo->coordinator.min_workers, 2);
  EXPECT_EQ(demo->model.init_from, "");
  absl::StatusOr<Config> tiny = LoadConfig(root + "/config/tiny.yaml");
  ASSERT_TRUE(tiny.ok()) << tiny.status();
  EXPECT_EQ(tiny->run.name, "tiny");
  EXPECT_EQ(tiny->outer.rounds, 3);
  EXPECT_EQ(tiny->model.d_model % tiny->model.n_head, 0);
}

TEST(ConfigLoaderTest, MetricsListenIsOffByDefaultAndMustBeHostPort) {
  absl::StatusOr<Config> off = ParseConfig("", "my.yaml");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->coordinator.metrics_listen, "");
  absl::StatusOr<Config> on = ParseConfig("", "my.yaml", {"coordinator.metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->coordinator.metrics_listen, "127.0.0.1:0");
  for (const char* bad : {"9464", "127.0.0.1:", "127.0.0.1:http", ":9464", "127.0.0.1:70000"}) {
    absl::StatusOr<Config> c = ParseConfig("", "my.yaml", {std::string("coordinator.metrics_listen=") + bad});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_THAT(Message(c.status()), HasSubstr("coordinator.metrics_listen")) << bad;
    EXPECT_THAT(Message(c.status()), HasSubstr(bad)) << bad;
  }
}

// The robust rules need a round of pushes together: with outer.mode async each is a config error naming why.
// Before, clip was accepted and folded as mean (no norm clip, token cap or momentum bound, without a word).
TEST(ConfigLoaderTest, RobustAggregationRulesNeedSyncRounds) {
  for (const char* rule : {"clip", "trimmed_mean", "centered_clip"}) {
    absl::StatusOr<Config> c =
        ParseConfig("", "my.yaml", {"outer.mode=async", std::string("outer.aggregation=") + rule});
    ASSERT_FALSE(c.ok()) << rule;
    EXPECT_THAT(Message(c.status()), HasSubstr(std::string("outer.aggregation ") + rule + " needs outer.mode sync"));
  }
  EXPECT_TRUE(ParseConfig("", "my.yaml", {"outer.mode=async", "outer.aggregation=mean"}).ok());
  EXPECT_TRUE(ParseConfig("", "my.yaml", {"outer.mode=sync", "outer.aggregation=clip"}).ok());
}

TEST(ConfigLoaderTest, ShardingNeedsAClusterAndNamesBothKeys) {
  absl::StatusOr<Config> none = ParseConfig("", "my.yaml");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->workers.sharding, Sharding::kNone);
  for (const char* mode : {"optimizer", "gradients"}) {
    absl::StatusOr<Config> alone = ParseConfig("", "my.yaml", {std::string("workers.sharding=") + mode});
    ASSERT_FALSE(alone.ok()) << mode;
    EXPECT_THAT(Message(alone.status()), HasSubstr("workers.sharding")) << mode;
    EXPECT_THAT(Message(alone.status()), HasSubstr("workers.cluster_size")) << mode;
    absl::StatusOr<Config> cluster =
        ParseConfig("workers: {cluster_size: 4}\n", "my.yaml", {std::string("workers.sharding=") + mode});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    EXPECT_EQ(cluster->workers.sharding,
              std::string(mode) == "optimizer" ? Sharding::kOptimizer : Sharding::kGradients);
  }
  absl::StatusOr<Config> bad = ParseConfig("workers: {cluster_size: 4, sharding: zero3}\n", "my.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(Message(bad.status()), HasSubstr("workers.sharding"));
}

}  // namespace
}  // namespace diloco
