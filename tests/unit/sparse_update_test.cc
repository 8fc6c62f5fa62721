// Sparse pulls' format (proto/sparse_update.h, CODEC_UPDATE): the update the coordinator builds after an outer step
// without momentum (coordinator/sparse_pull.h), applied to theta_{t-1}, must give the coordinator's own
// OuterOptimizer::StepInPlace result bit for bit, for lr 1 and another lr, with -0.0 in theta and in the delta;
// sizes at SparseLoCo's 64 of 4096; and every malformed payload is refused with its own message (the format itself
// against a Python reference: sparse_update_golden_test.cc).
#include "proto/sparse_update.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/outer_optimizer.h"
#include "coordinator/sparse_pull.h"

namespace diloco {
namespace {

// Three tensors: 2 blocks and a short one, a tensor shorter than a block, an empty one.
NamedTensors Theta(uint64_t seed) {
  at::manual_seed(seed);
  NamedTensors t = {{"a", at::randn({3, 3000})}, {"b", at::randn({100})}, {"c", at::zeros({0})}};
  t[0].second.view({-1})[7] = -0.0f;  // an unchanged -0 must stay -0; a changed one must become what the step makes
  t[0].second.view({-1})[8] = -0.0f;
  return t;
}

// A sparse average: each of `workers` keeps 64 random positions per 4096 with one of four values per block.
std::vector<at::Tensor> SparseDelta(const NamedTensors& theta, int workers, uint64_t seed) {
  std::mt19937 rng(seed);
  std::vector<at::Tensor> delta;
  for (const auto& [name, t] : theta) {
    at::Tensor d = at::zeros_like(t);
    float* p = d.data_ptr<float>();
    const int64_t n = d.numel();
    for (int w = 0; w < workers; ++w) {
      for (int64_t start = 0; start < n; start += 4096) {
        const int64_t len = std::min<int64_t>(4096, n - start);
        const float levels[4] = {0.011f * (w + 1), -0.011f * (w + 1), 0.023f / (w + 1), -0.023f / (w + 1)};
        for (int k = 0; k < std::min<int64_t>(64, len); ++k) {
          p[start + rng() % len] += levels[rng() % 4] / static_cast<float>(workers);
        }
      }
    }
    delta.push_back(d);
  }
  if (delta[0].numel() > 8) {
    delta[0].view({-1})[7] = 0.0f;   // keeps a -0 theta
    delta[0].view({-1})[8] = 0.5f;   // changes a -0 theta
    delta[0].view({-1})[9] = -0.0f;  // a -0 delta: sent (its step is +0), and theta + 0 is what the kernel writes
  }
  return delta;
}

NamedTensors Clone(const NamedTensors& t) {
  NamedTensors out;
  for (const auto& [name, x] : t) out.push_back({name, x.clone()});
  return out;
}

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * sizeof(float)) == 0;
}

absl::Status ApplyAll(const SparseUpdate& update, UpdateApplier& applier) {
  for (const std::string& m : update.messages) {
    PullMessage message;
    if (!message.ParseFromString(m)) return absl::DataLossError("unparsable");
    if (absl::Status s = applier.Accept(message.chunk()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void ExpectBitIdentical(double lr, int workers) {
  const NamedTensors before = Theta(1);
  const std::vector<at::Tensor> delta = SparseDelta(before, workers, 2);
  NamedTensors stepped = Clone(before);
  std::vector<at::Tensor> plain;
  for (auto& [name, t] : stepped) plain.push_back(t);
  OuterOptimizer(OuterOptimizer::Kind::kSgd, lr, 0).StepInPlace(plain, delta, nullptr);
  auto update = BuildSparseUpdate(1, stepped, delta, static_cast<float>(-lr), 4096, 8192, 1 << 30);
  ASSERT_NE(update, nullptr);
  EXPECT_EQ(update->theta_hash, ThetaHash(stepped));
  NamedTensors mine = Clone(before);
  UpdateApplier applier(mine);
  ASSERT_TRUE(ApplyAll(*update, applier).ok());
  EXPECT_TRUE(applier.Done());
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(BitEqual(mine[i].second, stepped[i].second)) << mine[i].first;
  EXPECT_EQ(ThetaHash(mine), update->theta_hash);
  int64_t nonzero = 0;
  for (const at::Tensor& d : delta) nonzero += d.ne(0).sum().item<int64_t>();
  EXPECT_EQ(applier.changed(), nonzero + 1);  // + the -0 delta
  // The unchanged -0 stayed -0 (bit for bit), the changed one took the step.
  EXPECT_TRUE(std::signbit(mine[0].second.view({-1})[7].item<float>()));
}

TEST(SparseUpdateTest, BitIdenticalToTheOuterStepAtLrOne) { ExpectBitIdentical(1.0, 1); }
TEST(SparseUpdateTest, BitIdenticalToTheOuterStepAtAnotherLr) { ExpectBitIdentical(0.7, 3); }
TEST(SparseUpdateTest, BitIdenticalWithFourWorkersSums) { ExpectBitIdentical(1.0, 4); }

// Sparse pulls apply only where the update is the plain sum step of top-k pushes: each rule switched off in turn.
TEST(SparseUpdateTest, SparsePullsApplyOnlyToTheRunsTheyFit) {
  Config on;
  on.comm.codec = WireCodec::kTopk;
  on.comm.sparse_pulls = true;
  on.outer.mode = OuterMode::kSync;
  on.outer.momentum = 0;
  on.outer.lr = 1;
  on.comm.fragments = 1;
  on.comm.pull_codec = WireCodec::kFp32;
  EXPECT_TRUE(SparsePullsApply(on));
  std::vector<std::pair<const char*, std::function<void(Config&)>>> offs = {
      {"comm.sparse_pulls false", [](Config& c) { c.comm.sparse_pulls = false; }},
      {"codec fp32", [](Config& c) { c.comm.codec = WireCodec::kFp32; }},
      {"async", [](Config& c) { c.outer.mode = OuterMode::kAsync; }},
      {"momentum", [](Config& c) { c.outer.momentum = 0.9; }},
      {"two fragments", [](Config& c) { c.comm.fragments = 2; }},
      {"bf16 pulls", [](Config& c) { c.comm.pull_codec = WireCodec::kBf16; }},
  };
  for (const auto& [what, change] : offs) {
    Config c = on;
    change(c);
    EXPECT_FALSE(SparsePullsApply(c)) << what;
  }
  Config fp32 = on;
  fp32.comm.codec = WireCodec::kFp32;  // the coordinator reads its own comm.codec: the line says so
  EXPECT_EQ(SparsePullsOffReason(fp32).rfind("this coordinator's comm.codec is not topk", 0), 0u);
}

TEST(SparseUpdateTest, OneWorkerBlockCostsUnderOneHundredthOfFp32) {
  const NamedTensors theta = {{"w", at::zeros({4096 * 16})}};
  const std::vector<at::Tensor> delta = SparseDelta(theta, 1, 5);
  auto update = BuildSparseUpdate(1, theta, delta, -1.0f, 4096, 4096 * 16, 1 << 30);
  ASSERT_NE(update, nullptr);
  // 16 blocks of about 64 changed values: counts, 2 literals, Rice gaps, a sign and a 1-bit index each.
  EXPECT_LT(update->bytes, 16 * 4096 * 4 / 100) << update->bytes;
  EXPECT_GT(update->changed, 16 * 60);
}

TEST(SparseUpdateTest, AnUpdateOverItsLimitIsNotKept) {
  const NamedTensors theta = {{"w", at::zeros({8192})}};
  // A dense update of distinct values (momentum-like): every position and a 4-byte step each, over 1/8 of fp32.
  EXPECT_EQ(BuildSparseUpdate(1, theta, {at::randn({8192})}, -1.0f, 4096, 8192, SparseUpdateLimit(8192)), nullptr);
  // A sparse one fits.
  EXPECT_NE(BuildSparseUpdate(1, theta, SparseDelta(theta, 1, 3), -1.0f, 4096, 8192, SparseUpdateLimit(8192)), nullptr);
}

// A chunk of one block of 8 elements: u = 2 changed (positions 1 and 5), palette {0.5, 1.0}, indices {1, 0}.
TensorChunk Chunk(const std::string& data, int64_t block = 8, int64_t offset = 0) {
  TensorChunk c;
  c.set_name("w");
  c.set_dtype(FLOAT32);
  c.add_shape(8);
  c.set_offset(offset);
  c.set_count(8);
  c.set_codec(CODEC_UPDATE);
  c.set_topk_chunk(block);
  c.set_data(data);
  return c;
}

std::string Floats(std::vector<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// 8 elements, u = 2 (positions 1 and 5), b = 1 literal (1.0: exponent 127, length 0), c = 0. Bits: r = 1 (1000),
// k = 0 (00), exponent 1111 1110, length 00000, gaps 1 (0 1) and 3 (1 0 1), signs 0 and 1; the single magnitude
// takes no index bits. Bytes 0xc1 0x1f 0xb0 0x02: steps +1 at 1 and -1 at 5.
std::string Good() { return std::string("\x02\x01\x00\xc1\x1f\xb0\x02", 7); }
std::string Zeros(int n) { return std::string(n, '\0'); }

TEST(SparseUpdateTest, DecodesAHandWrittenBlock) {
  auto d = DecodeUpdate(Chunk(Good()));
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->index.numel(), 2);
  EXPECT_EQ(d->index[0].item<int64_t>(), 1);
  EXPECT_EQ(d->index[1].item<int64_t>(), 5);
  EXPECT_EQ(d->values[0].item<float>(), 1.0f);
  EXPECT_EQ(d->values[1].item<float>(), -1.0f);
}

TEST(SparseUpdateTest, RefusesEveryMalformedPayload) {
  struct Case {
    std::string data;
    std::string message;
    int64_t block = 8;
    int64_t offset = 0;
  };
  // Headers "u b c" then bits: r (4), k (2), literals (13 + L), sums, gaps, per position index and sign.
  const std::vector<Case> cases = {
      {Good().substr(0, Good().size() - 1), "payload ends inside the indices"},
      {Good() + std::string("\x00", 1), "bytes after its last block"},
      {"\x09", "9 changed of 8"},
      {std::string("\x02\x00", 2), "literal count"},
      {std::string("\x02\x03", 2), "literal count"},
      {std::string("\x02\x01\x02", 3), "sum count"},
      {std::string("\x01\x01\x00\xc0\x3f", 5), "non-finite literal"},  // exponent 255
      {std::string("\x01\x01\x00\x00\x00\x06", 6), "literal length 24 out of [0, 23]"},
      // u = 4, b = 3, c = 1: zero literals (13 bits, then 2 bits of no change each), then a sum of two whose first
      // term is literal 3 (11).
      {std::string("\x04\x03\x01", 3) + Zeros(3) + "\x03", "sum term 3 out of 3 literals"},
      // Literal 0 has exponent 254, literal 1 the change +1 (zigzag 2: 1 0 1): 255.
      {std::string("\x02\x02\x00\x80\x3f\x28", 6), "literal exponent 255 out of [0, 254]"},
      // b = 1: the largest float (exponent 254, length 23, 23 ones), c = 1: it plus itself.
      {std::string("\x02\x01\x01\x80\xff\xfd\xff\xff\x03", 9), "non-finite sum"},
      {std::string("\x01\x01\x00\x00\x00\xf8\xff", 7), "position out of the block"},
      // u = 1, r = 0, a zero literal: gap 7 (7 ones, a zero), sign 0 is position 7, valid; gap 8 is outside.
      {std::string("\x01\x01\x00\x00\x00\xf8\x03", 7), "position 7"},
      {std::string("\x01\x01\x00\x00\x00\xf8\x07", 7), "position 8 out of the block of 8"},
      // u = 3, b = 3 zero literals: gaps 0 0 0, then index 3 (11) of 3 magnitudes.
      {std::string("\x03\x03\x00", 3) + Zeros(3) + "\x0c", "index 3 out of 3 magnitudes"},
      // k = 1 (exp-Golomb of order 0): an index of 17+ leading ones.
      {std::string("\x01\x01\x00\x10\x00\xf0\xff\xff", 8), "index code too long"},
      // k = 3 (Huffman), a zero literal, then code lengths 1 and 2 (1000, then +1: zigzag 2, 1 0 1): half the code
      // space is unused.
      {std::string("\x02\x01\x00\x30\x00\x88\x02", 7), "code lengths do not make a complete code"},
      // Lengths 15 (1111) and then +1: 16.
      {std::string("\x02\x01\x00\x30\x00\xf8\x02", 7), "code length 16 out of [0, 15]"},
      {Good(), "block length 1", 1},
      {Good(), "does not start a block", 8, 4},
  };
  for (const Case& c : cases) {
    auto d = DecodeUpdate(Chunk(c.data, c.block, c.offset));
    if (c.message == "position 7") {  // the one valid case among them: a lone position 7 of 8
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_EQ(d->index[0].item<int64_t>(), 7);
      continue;
    }
    ASSERT_FALSE(d.ok()) << c.message;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(d.status().message()).find(c.message), std::string::npos) << d.status();
  }
}

// Four workers' steps in one block: the cheapest index code is the Huffman one (k = 3: bits 4-5 of the first byte
// after the varints u, b, c), with sums used once sent inline; the block reads back bit for bit.
TEST(SparseUpdateTest, AFourWorkerBlockTakesTheHuffmanCode) {
  const NamedTensors theta = {{"w", at::zeros({4096})}};
  const at::Tensor delta = SparseDelta(theta, 4, 11)[0];
  TensorChunk chunk = Chunk("", 4096);
  chunk.set_shape(0, 4096);
  chunk.set_count(4096);
  const int64_t changed = EncodeUpdate(delta.data_ptr<float>(), 4096, -1.0f, 4096, &chunk);
  EXPECT_GT(changed, 200);
  const std::string& data = chunk.data();
  size_t at = 0;
  for (int varint = 0; varint < 3; ++varint) {
    while (static_cast<uint8_t>(data[at++]) & 0x80) {
    }
  }
  EXPECT_EQ((static_cast<uint8_t>(data[at]) >> 4) & 3, 3);
  auto decoded = DecodeUpdate(chunk);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->index.numel(), changed);
  const float* d = delta.data_ptr<float>();
  for (int64_t i = 0; i < changed; ++i) {
    const float want = -1.0f * d[decoded->index[i].item<int64_t>()], got = decoded->values[i].item<float>();
    ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "position " << decoded->index[i].item<int64_t>();
  }
}

TEST(SparseUpdateTest, AnApplierTakesOnlyUpdateChunks) {
  NamedTensors theta = {{"w", at::zeros({8})}};
  UpdateApplier applier(theta);
  TensorChunk raw = Chunk(Floats(std::vector<float>(8, 1.0f)));
  raw.set_codec(CODEC_RAW);
  EXPECT_FALSE(applier.Accept(raw).ok());
  EXPECT_TRUE(applier.Accept(Chunk(Good())).ok());
  EXPECT_TRUE(applier.Done());
  EXPECT_EQ(theta[0].second[1].item<float>(), 1.0f);
  EXPECT_EQ(theta[0].second[5].item<float>(), -1.0f);
}

}  // namespace
}  // namespace diloco
