// libFuzzer target for the coordinator's push path: the chunk decoder (proto/codec.h DecodeValues), the chunk
// stream reader (proto/tensor_chunks.h) and the push handler (coordinator/push_session.h driving CoordinatorCore's
// BeginPush / FoldChunk / CommitPush / AbortPush), on a tiny model, with no network. Built with clang,
// -fsanitize=fuzzer,address by tests/fuzz/run_fuzz.sh (CMake option DILOCO_FUZZ).
//
// Input: a sequence of records  [op: 1 byte][length: 2 bytes little endian][payload: length bytes].
//   op % 3 == 0  payload is a serialized PushMessage, sent on the current push stream (a new stream if none)
//   op % 3 == 1  the client closes the current stream (PushSession::OnEnd: commit or refuse)
//   op % 3 == 2  the current stream breaks off (PushSession::OnBroken)
// A payload that does not parse as a PushMessage is skipped. Workers "w0" and "w1" are members; round 0 is open.
//
// Invariants checked after every input (a violation aborts, which libFuzzer reports as a crash):
//   - DecodeValues on any chunk either refuses it or returns count() values;
//   - no message makes the push path throw (a refusal is always a validation error, never INTERNAL);
//   - every chunk the session accepts is also accepted by an independent ChunkAssembler (same validation);
//   - a counted push holds only finite values;
//   - the round then closes (Poll) exactly when some push is still counted, and theta_1 equals the outer step
//     (Nesterov, first step: theta_0 - lr (1 + momentum) delta) of the token-weighted average of exactly the pushes
//     that were accepted and are still counted (a refused or broken push never reaches the model); with no counted
//     push theta_0 is unchanged bit for bit.
// With DILOCO_FUZZ_WRITE_SEEDS=DIR in the environment the binary writes the seed corpus (valid pushes in every codec,
// truncated, broken, NaN) into DIR and exits: tests/fuzz/corpus/ was made that way, and its sparse seeds (topk
// pushes of several blocks per tensor, valid, truncated, broken, beside int8) by tests/fuzz/make_topk_seeds.py.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "config/data_cache.h"
#include "coordinator/coordinator.h"
#include "coordinator/model_host.h"
#include "coordinator/push_session.h"
#include "proto/codec.h"
#include "proto/tensor_chunks.h"
#include "worker/data/token_manifest.h"
#include "worker/data/token_shard.h"

namespace diloco {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

struct Globals {
  Config config;
  TokenCache cache;
};
Globals* g = nullptr;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "push_fuzzer: invariant violated: %s\n", what);
  std::abort();
}

std::unique_ptr<CoordinatorCore> MakeCore() {
  auto model = HostModel(g->config, g->cache);
  Check(model.ok(), "HostModel failed");
  auto core = CoordinatorCore::Create(g->config, std::move(model->theta_0), std::move(model->evaluator),
                                      /*resume=*/false, [] { return 0.0; });
  Check(core.ok(), "CoordinatorCore::Create failed");
  for (const char* id : {"w0", "w1"}) {
    JoinRequest r;
    r.mutable_meta()->set_worker_id(id);
    r.mutable_meta()->set_fingerprint((*core)->fingerprint());
    r.mutable_model()->set_vocab_size(g->config.model.vocab_size);
    r.mutable_model()->set_seq_len(g->config.model.seq_len);
    r.mutable_model()->set_n_layer(g->config.model.n_layer);
    r.mutable_model()->set_n_head(g->config.model.n_head);
    r.mutable_model()->set_d_model(g->config.model.d_model);
    Check((*core)->Join(r).ok(), "join");
  }
  return std::move(*core);
}

std::shared_ptr<const ParamSnapshot> Snapshot(CoordinatorCore& core) {
  PullRequest r;
  r.mutable_meta()->set_worker_id("w0");
  r.mutable_meta()->set_fingerprint(core.fingerprint());
  auto snap = core.BeginPull(r);
  Check(snap.ok(), "pull");
  // A copy, as a pull makes: synchronous rounds step the published tensors in place.
  auto copy = std::make_shared<ParamSnapshot>();
  copy->round = (*snap)->round;
  for (const auto& [name, p] : (*snap)->params) copy->params.emplace_back(name, p.clone());
  return copy;
}

bool CountedInRound(CoordinatorCore& core, const std::string& id) {
  HeartbeatRequest r;
  r.mutable_meta()->set_worker_id(id);
  r.mutable_meta()->set_fingerprint(core.fingerprint());
  auto reply = core.Heartbeat(r);
  return reply.ok() && reply->pushed();
}

// One push stream as the fuzzer sends it, with an independent copy of what it carried.
struct Stream {
  std::unique_ptr<PushSession> session;
  std::unique_ptr<ChunkAssembler> copy;  // made at the accepted header
  Named values;
  std::string worker_id;
  double tokens = 0;
};

struct Accepted {
  double tokens = 0;
  Named values;
};

void CheckDecoder(const TensorChunk& chunk) {
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kLong}) {
    auto values = DecodeValues(chunk, dtype);
    if (!values.ok()) continue;
    Check(values->numel() == chunk.count() && values->dim() == 1, "DecodeValues returned a wrong element count");
    if (dtype == at::kFloat) (void)values->sum().item<double>();  // reads every element (ASan sees overreads)
  }
}

void Feed(CoordinatorCore& core, Stream& s, const PushMessage& m) {
  if (m.has_chunk()) CheckDecoder(m.chunk());
  if (!s.session) s.session = std::make_unique<PushSession>(&core);
  const bool had_header = s.copy != nullptr;
  const absl::Status status = s.session->OnMessage(m);
  Check(status.code() != absl::StatusCode::kInternal, "a push raised an exception instead of a validation error");
  if (!status.ok()) return;
  if (!had_header) {
    Check(m.has_header(), "a stream was accepted without a header");
    for (const TensorSpec& spec : core.specs()) s.values.emplace_back(spec.name, at::zeros(spec.shape, at::kFloat));
    s.copy = std::make_unique<ChunkAssembler>(s.values);
    s.worker_id = m.header().meta().worker_id();
    s.tokens = static_cast<double>(m.header().tokens());
    return;
  }
  Check(s.copy->Accept(m.chunk()).ok(), "the session accepted a chunk that ChunkAssembler refuses");
}

// Expected theta_1 per element, and whether every intermediate stays far from float overflow.
bool ExpectedTheta(const std::vector<at::Tensor>& theta0, const std::vector<const Accepted*>& pushes,
                   std::vector<at::Tensor>* want, std::vector<at::Tensor>* tolerance) {
  double total = 0;
  for (const Accepted* p : pushes) total += p->tokens;
  const double lr = g->config.outer.lr, mu = g->config.outer.momentum;
  bool in_range = true;
  for (size_t i = 0; i < theta0.size(); ++i) {
    at::Tensor sum = at::zeros(theta0[i].sizes(), at::kDouble), mag = at::zeros(theta0[i].sizes(), at::kDouble);
    for (const Accepted* p : pushes) {
      at::Tensor v = p->values[i].second.to(at::kDouble);
      sum.add_(v, p->tokens);
      mag.add_(v.abs(), p->tokens);
    }
    in_range = in_range && mag.max().item<double>() < 1e36;
    at::Tensor t0 = theta0[i].to(at::kDouble);
    want->push_back(t0 - lr * (1 + mu) * (sum / total));
    tolerance->push_back(1e-4 * (t0.abs() + lr * (1 + mu) * (mag / total)) + 1e-6);
  }
  return in_range;
}

void CheckRound(CoordinatorCore& core, const std::map<std::string, Accepted>& accepted,
                const std::shared_ptr<const ParamSnapshot>& theta0) {
  std::vector<const Accepted*> counted;
  for (const auto& [id, push] : accepted) {
    if (!CountedInRound(core, id)) continue;
    for (const auto& [name, v] : push.values) Check(at::isfinite(v).all().item<bool>(), "a NaN/Inf push was counted");
    counted.push_back(&push);
  }
  core.Poll();
  auto theta1 = Snapshot(core);
  if (counted.empty()) {
    Check(theta1->round == 0, "the round closed with no counted push");
    for (size_t i = 0; i < theta0->params.size(); ++i) {
      Check(at::equal(theta0->params[i].second, theta1->params[i].second), "theta changed with no counted push");
    }
    return;
  }
  std::vector<at::Tensor> theta0_values, want, tolerance;
  for (const auto& [name, p] : theta0->params) theta0_values.push_back(p);
  if (!ExpectedTheta(theta0_values, counted, &want, &tolerance)) return;  // huge but finite values: no oracle
  Check(theta1->round == 1, "the round did not close over counted pushes");
  for (size_t i = 0; i < want.size(); ++i) {
    at::Tensor got = theta1->params[i].second.to(at::kDouble);
    Check((got - want[i]).abs().le(tolerance[i]).all().item<bool>(),
          "theta_1 differs from the outer step over the accepted pushes");
  }
}

int RunInput(const uint8_t* data, size_t size) {
  std::unique_ptr<CoordinatorCore> core = MakeCore();
  const std::shared_ptr<const ParamSnapshot> theta0 = Snapshot(*core);
  std::map<std::string, Accepted> accepted;
  Stream stream;
  size_t pos = 0;
  while (pos + 3 <= size) {
    const uint8_t op = data[pos] % 3;
    const size_t len = std::min<size_t>(data[pos + 1] | (size_t{data[pos + 2]} << 8), size - pos - 3);
    const uint8_t* payload = data + pos + 3;
    pos += 3 + len;
    if (op == 0) {
      PushMessage m;
      if (m.ParseFromArray(payload, static_cast<int>(len))) Feed(*core, stream, m);
    } else if (op == 1) {
      if (!stream.session) stream.session = std::make_unique<PushSession>(core.get());
      const absl::StatusOr<PushReply> done = stream.session->OnEnd();
      Check(done.status().code() != absl::StatusCode::kInternal, "a push end raised an exception");
      if (done.ok()) {
        Check(stream.copy != nullptr, "a push committed without a header");
        accepted[stream.worker_id] = Accepted{stream.tokens, std::move(stream.values)};
      }
      stream = Stream();
    } else {
      if (stream.session) stream.session->OnBroken("fuzz: stream broke");
      stream = Stream();
    }
  }
  stream = Stream();  // an open stream at the end breaks off
  CheckRound(*core, accepted, theta0);
  return 0;
}

// --- seed corpus ---------------------------------------------------------------------------------------------------

void Record(std::string* out, uint8_t op, const std::string& payload) {
  out->push_back(static_cast<char>(op));
  out->push_back(static_cast<char>(payload.size() & 0xff));
  out->push_back(static_cast<char>(payload.size() >> 8));
  out->append(payload);
}

// A push of `id` as records: header, chunks (chunk_bytes 64, `codec`), then end (op 1) unless `end` is false; with
// `keep` >= 0 only the first `keep` chunks; `poison` puts a NaN into the last chunk.
std::string PushRecords(CoordinatorCore& core, const std::string& id, int64_t tokens, Codec codec, uint64_t seed,
                        bool end = true, int keep = -1, bool poison = false) {
  std::string out;
  PushMessage m;
  PushHeader* h = m.mutable_header();
  h->mutable_meta()->set_worker_id(id);
  h->mutable_meta()->set_round(0);
  h->mutable_meta()->set_fingerprint(core.fingerprint());
  h->set_tokens(tokens);
  h->set_inner_steps(2);
  h->set_loss(2.5);
  h->set_seconds(0.5);
  Record(&out, 0, m.SerializeAsString());
  at::Generator gen = at::detail::createCPUGenerator(seed);
  Named delta;
  for (const TensorSpec& s : core.specs()) delta.emplace_back(s.name, at::randn(s.shape, gen, at::kFloat) * 0.01);
  TensorChunker chunker(delta, 64, codec);
  std::vector<PushMessage> chunks;
  while (chunker.Next(m.mutable_chunk())) chunks.push_back(m);
  if (keep >= 0 && static_cast<size_t>(keep) < chunks.size()) chunks.resize(static_cast<size_t>(keep));
  if (poison) {
    std::string* bytes = chunks.back().mutable_chunk()->mutable_data();
    const float nan = std::nanf("");
    if (chunks.back().chunk().codec() == CODEC_RAW && bytes->size() >= 4) bytes->replace(0, 4, (const char*)&nan, 4);
  }
  for (const PushMessage& c : chunks) Record(&out, 0, c.SerializeAsString());
  if (end) Record(&out, 1, "");
  return out;
}

void WriteSeeds(const std::string& dir) {
  std::unique_ptr<CoordinatorCore> core = MakeCore();
  std::filesystem::create_directories(dir);
  const int n = static_cast<int>(core->specs().size());
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"valid-fp32", PushRecords(*core, "w0", 100, CODEC_RAW, 1)},
      {"two-workers", PushRecords(*core, "w0", 300, CODEC_RAW, 1) + PushRecords(*core, "w1", 100, CODEC_RAW, 2)},
      {"valid-bf16", PushRecords(*core, "w0", 100, CODEC_BF16, 3)},
      {"valid-fp16", PushRecords(*core, "w1", 100, CODEC_FP16, 4)},
      {"valid-int8", PushRecords(*core, "w0", 100, CODEC_INT8, 5)},
      {"valid-int4", PushRecords(*core, "w1", 100, CODEC_INT4, 6)},
      {"truncated", PushRecords(*core, "w0", 100, CODEC_RAW, 7, true, n / 2)},
      {"broken-then-valid", PushRecords(*core, "w0", 100, CODEC_RAW, 8, false, n / 2) + std::string("\x02\0\0", 3) +
                                PushRecords(*core, "w1", 100, CODEC_RAW, 9)},
      {"valid-then-nan", PushRecords(*core, "w0", 100, CODEC_RAW, 10) +
                             PushRecords(*core, "w1", 100, CODEC_RAW, 11, true, n, /*poison=*/true)},
      {"duplicate", PushRecords(*core, "w0", 100, CODEC_RAW, 12) + PushRecords(*core, "w0", 100, CODEC_RAW, 13)},
  };
  for (const auto& [name, bytes] : seeds) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    std::fprintf(stderr, "seed %s: %zu bytes\n", name.c_str(), bytes.size());
  }
}

}  // namespace
}  // namespace diloco

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace diloco;
  spdlog::set_level(spdlog::level::off);
  google::protobuf::SetLogHandler(nullptr);  // no "invalid UTF-8" line per mutated string field
  at::set_num_threads(1);
  g = new Globals;
  char dir_template[] = "/tmp/diloco-push-fuzzer-XXXXXX";
  Check(mkdtemp(dir_template) != nullptr, "mkdtemp");
  g->cache.dir = dir_template;
  Config& c = g->config;
  c.model.vocab_size = 8;
  c.model.seq_len = 4;
  c.model.n_layer = 1;
  c.model.n_head = 1;
  c.model.d_model = 4;
  c.inner.batch_size = 2;
  c.outer.rounds = 100;
  c.coordinator.eval_every = 0;
  c.coordinator.checkpoint_every = 0;
  c.coordinator.min_workers = 1;
  c.coordinator.round_timeout_s = 0;  // a round closes at the first Poll with a counted push
  c.coordinator.lease_s = 1e9;
  c.run.output_dir = g->cache.dir + "/run";
  c.coordinator.checkpoint_dir = g->cache.dir + "/ckpt";
  std::vector<uint32_t> ids(256);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i * 5 % 8);
  std::string error;
  Check(WriteTokenShard(g->cache.val_path(), ids, 8, &error), "writing the validation shard");
  TokenManifest manifest;  // the model host maps the validation split of the cache's manifest
  manifest.vocab_size = 8;
  manifest.val = manifest.train = {{g->cache.val_path(), 24, 2, ids.size()}};
  Check(WriteTokenManifest(g->cache.meta_path(), manifest, &error), "writing the token manifest");
  if (const char* seeds = getenv("DILOCO_FUZZ_WRITE_SEEDS")) {
    WriteSeeds(seeds);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return diloco::RunInput(data, size); }
