// The sparse top-k codec (proto/topk_codec.h) and its error feedback (worker/error_feedback.h, codec topk) against
// tests/golden/topk_reference.py, a numpy reference written from the SparseLoCo paper (the ctest fixture runs it into
// the build directory): for random and adversarial inputs (ties, zeros, constant chunks, fewer non-zeros than kept,
// a short last chunk, odd block lengths, magnitudes over twelve decades), one error-feedback round must give the
// reference's payload byte for byte, its decoded values and its new residual bit for bit, also when the tensor is cut
// into several wire chunks. Then every malformed chunk the decoder must refuse, and the config rules of topk.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "config/config_loader.h"
#include "coordinator/round_accumulator.h"
#include "proto/tensor_chunks.h"
#include "proto/topk_codec.h"
#include "worker/error_feedback.h"
#include "worker/worker_state.h"

namespace diloco {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

torch::Tensor ReadFloats(const std::string& path) {
  const std::string bytes = ReadFile(path);
  torch::Tensor t = torch::empty({static_cast<int64_t>(bytes.size() / 4)}, torch::kFloat);
  std::memcpy(t.data_ptr<float>(), bytes.data(), bytes.size());
  return t;
}

struct GoldenCase {
  std::string name;
  TopkParams params;
  double beta = 1;
  torch::Tensor e, delta, sent, residual;
  std::string payload;
};

std::vector<GoldenCase> LoadCases() {
  const std::string dir = DILOCO_TOPK_GOLDEN_DIR;
  std::istringstream names(ReadFile(dir + "/cases.txt"));
  std::vector<GoldenCase> cases;
  for (std::string name; names >> name;) {
    GoldenCase c;
    c.name = name;
    std::istringstream meta(ReadFile(dir + "/" + name + ".meta"));
    int64_t n = 0;
    meta >> c.params.chunk >> c.params.keep >> c.beta >> n;
    const std::string base = dir + "/" + name;
    c.e = ReadFloats(base + ".e.f32");
    c.delta = ReadFloats(base + ".delta.f32");
    c.sent = ReadFloats(base + ".sent.f32");
    c.residual = ReadFloats(base + ".residual.f32");
    c.payload = ReadFile(base + ".payload");
    EXPECT_EQ(c.e.numel(), n) << name;
    cases.push_back(std::move(c));
  }
  return cases;
}

// Encodes `x` as one tensor "w" in wire chunks of chunk_bytes and decodes the stream back.
torch::Tensor Stream(const torch::Tensor& x, const TopkParams& params, int64_t chunk_bytes, std::string* first_payload,
                     int* chunks) {
  TensorChunker chunker({{"w", x}}, chunk_bytes, CODEC_TOPK, params);
  ChunkStreamReader reader({TensorSpec{"w", {x.numel()}, at::kFloat}});
  torch::Tensor out = torch::empty_like(x);
  TensorChunk chunk;
  *chunks = 0;
  while (chunker.Next(&chunk)) {
    if ((*chunks)++ == 0) *first_payload = chunk.data();
    auto values = reader.Next(chunk);
    EXPECT_TRUE(values.ok()) << values.status();
    if (!values.ok()) break;
    out.narrow(0, reader.chunk_offset(), values->numel()).copy_(*values);
  }
  EXPECT_TRUE(reader.Done());
  return out;
}

TEST(TopkGoldenTest, OneErrorFeedbackRoundMatchesTheReferenceBitForBit) {
  const std::vector<GoldenCase> cases = LoadCases();
  ASSERT_GE(cases.size(), 8u);
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE(c.name);
    ErrorFeedback ef(CODEC_TOPK, 1 << 24, c.params, c.beta);
    ef.Restore(c.e.clone());
    NamedTensors delta{{"w", c.delta.clone()}};
    ef.Compensate(delta);
    EXPECT_TRUE(torch::equal(ef.residual()[0], c.residual)) << (ef.residual()[0] - c.residual).abs().max();
    // One wire chunk: the reference's payload exactly.
    std::string payload;
    int chunks = 0;
    torch::Tensor decoded = Stream(delta[0].second, c.params, 1 << 24, &payload, &chunks);
    EXPECT_EQ(chunks, 1);
    EXPECT_EQ(payload.size(), c.payload.size());
    EXPECT_TRUE(payload == c.payload);
    EXPECT_TRUE(torch::equal(decoded, c.sent)) << (decoded - c.sent).abs().max();
    EXPECT_EQ(static_cast<int64_t>(payload.size()), TopkEncodedBytes(c.e.numel(), c.params));
    // One block per wire chunk: the same values.
    decoded = Stream(delta[0].second, c.params, c.params.chunk, &payload, &chunks);
    EXPECT_EQ(chunks, (c.e.numel() + c.params.chunk - 1) / c.params.chunk);
    EXPECT_TRUE(torch::equal(decoded, c.sent));
  }
}

TEST(TopkGoldenTest, BytesPerPushAtTheDefaultsAreUnderOneHundredFortiethOfFp32) {
  const TopkParams defaults;
  EXPECT_EQ(TopkPositionBits(4096), 12);
  EXPECT_EQ(TopkEncodedBytes(4096, defaults), 4 + 96 + 16);
  const int64_t n = 155'000'000;
  EXPECT_LE(TopkEncodedBytes(n, defaults) * 140, 4 * n);
}

TEST(TopkGoldenTest, ErrorFeedbackResidualSurvivesFlatAndRestore) {
  ErrorFeedback a(CODEC_TOPK, 1 << 20, {64, 4}, 0.95);
  NamedTensors d1{{"x", torch::randn({10, 30})}, {"y", torch::randn({7})}};
  a.Compensate(d1);
  ErrorFeedback b(CODEC_TOPK, 1 << 20, {64, 4}, 0.95);
  b.Restore(a.Flat());
  NamedTensors d2{{"x", torch::randn({10, 30})}, {"y", torch::randn({7})}};
  NamedTensors d3 = {{"x", d2[0].second.clone()}, {"y", d2[1].second.clone()}};
  a.Compensate(d2);
  b.Compensate(d3);
  EXPECT_TRUE(torch::equal(d2[0].second, d3[0].second));
  EXPECT_TRUE(torch::equal(a.residual()[1], b.residual()[1]));
  ErrorFeedback wrong(CODEC_TOPK, 1 << 20, {64, 4}, 0.95);
  wrong.Restore(torch::ones({5}));  // does not fit: dropped, residual from zero
  NamedTensors d4{{"y", torch::ones({7})}};
  wrong.Compensate(d4);
  EXPECT_TRUE(torch::equal(d4[0].second, torch::ones({7})));
}

TEST(TopkGoldenTest, SparseFoldEqualsTheDenseFoldOfTheDecodedStream) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({5000});
  const TopkParams params{256, 8};
  const std::vector<TensorSpec> specs = {TensorSpec{"w", {x.numel()}, at::kFloat}};
  RoundAccumulator dense(specs), sparse(specs);
  TensorChunker chunker({{"w", x}}, 1024, CODEC_TOPK, params);  // 4 blocks a chunk
  ChunkStreamReader dense_reader(specs), sparse_reader(specs);
  int chunks = 0;
  for (TensorChunk c; chunker.Next(&c); ++chunks) {
    auto values = dense_reader.Next(c);
    ASSERT_TRUE(values.ok()) << values.status();
    dense.Fold(0, dense_reader.chunk_offset(), *values, 3.0);
    auto kept = sparse_reader.NextSparse(c);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(sparse_reader.chunk_offset(), dense_reader.chunk_offset());
    EXPECT_EQ(kept->values.numel(), TopkKept(c.count(), params));
    sparse.FoldSparse(0, sparse_reader.chunk_offset(), kept->index, kept->values, 3.0);
  }
  EXPECT_EQ(chunks, 5);
  EXPECT_TRUE(sparse_reader.Done());
  dense.AddContribution(3.0);
  sparse.AddContribution(3.0);
  const torch::Tensor a = dense.Average()[0], b = sparse.Average()[0];
  EXPECT_EQ(a.ne(0).sum().item<int64_t>(), 19 * 8 + 8);  // 19 full blocks and a short one of 136
  EXPECT_TRUE(torch::allclose(a, b, 1e-6, 0));
  TensorChunk raw;
  TensorChunker({{"w", x}}, 1024).Next(&raw);
  ChunkStreamReader other(specs);
  EXPECT_FALSE(other.NextSparse(raw).ok()) << "a raw chunk is not a sparse one";
}

TEST(TopkGoldenTest, TheWorkerStateFileKeepsEachFragmentsResidual) {
  const std::string path = ::testing::TempDir() + "/topk_worker.state";
  WorkerState state;
  state.identity.worker_id = "w0";
  state.exp_avg = torch::ones({3});
  state.exp_avg_sq = torch::ones({3});
  state.error_feedback = {torch::arange(5, torch::kFloat), torch::Tensor(), torch::full({2}, -0.25)};
  ASSERT_TRUE(SaveWorkerState(path, state).ok());
  auto loaded = LoadWorkerState(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->error_feedback.size(), 3u);
  EXPECT_TRUE(torch::equal(loaded->error_feedback[0], state.error_feedback[0]));
  EXPECT_FALSE(loaded->error_feedback[1].defined());
  EXPECT_TRUE(torch::equal(loaded->error_feedback[2], state.error_feedback[2]));
  state.error_feedback.clear();  // a state without error feedback loads with none
  ASSERT_TRUE(SaveWorkerState(path, state).ok());
  EXPECT_TRUE(LoadWorkerState(path)->error_feedback.empty());
}

// A hand-built chunk: block 16, `keep` per block, over `count` elements; positions 4 bits, codes 2 bits.
TensorChunk HandChunk(int64_t count, int64_t keep, const std::vector<uint16_t>& levels,
                      const std::vector<int>& positions, const std::vector<int>& codes) {
  std::string data;
  for (uint16_t l : levels) data.append({static_cast<char>(l & 0xff), static_cast<char>(l >> 8)});
  std::string pos((positions.size() * 4 + 7) / 8, '\0'), cod((codes.size() * 2 + 7) / 8, '\0');
  for (size_t i = 0; i < positions.size(); ++i) pos[i / 2] |= static_cast<char>(positions[i] << (4 * (i % 2)));
  for (size_t i = 0; i < codes.size(); ++i) cod[i / 4] |= static_cast<char>(codes[i] << (2 * (i % 4)));
  TensorChunk chunk;
  chunk.set_name("w");
  chunk.set_codec(CODEC_TOPK);
  chunk.set_count(count);
  chunk.set_topk_chunk(16);
  chunk.set_topk_keep(keep);
  chunk.set_data(data + pos + cod);
  return chunk;
}

constexpr uint16_t kHalf = 0x3F00, kOne = 0x3F80, kNan = 0x7FC0, kInf = 0x7F80, kMinusOne = 0xBF80;

TEST(TopkDecodeTest, AHandBuiltChunkDecodesAsSpecified) {
  // Two blocks: 16 elements and a short last one of 4; 2 kept each.
  TensorChunk chunk = HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {3, 15, 0, 3}, {0, 3, 1, 2});
  auto dense = DecodeValues(chunk, at::kFloat);
  ASSERT_TRUE(dense.ok()) << dense.status();
  torch::Tensor expected = torch::zeros({20});
  expected[3] = 0.5;
  expected[15] = -1.0;
  expected[16] = -0.5;
  expected[19] = 0.5;
  EXPECT_TRUE(torch::equal(*dense, expected));
}

TEST(TopkDecodeTest, MalformedChunksAreRefusedWithTheReason) {
  struct Case {
    const char* what;
    TensorChunk chunk;
    const char* says;
  };
  std::vector<Case> cases = {
      {"position out of the short block", HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {3, 15, 0, 4}, {0, 0, 0, 0}),
       "outside its 4 elements"},
      {"unsorted", HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {15, 3, 0, 1}, {0, 0, 0, 0}), "must ascend"},
      {"repeated", HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {3, 3, 0, 1}, {0, 0, 0, 0}), "must ascend"},
      {"NaN level", HandChunk(20, 2, {kHalf, kNan, kHalf, kHalf}, {3, 15, 0, 1}, {0, 0, 0, 0}), "magnitude levels"},
      {"infinite level", HandChunk(20, 2, {kHalf, kOne, kHalf, kInf}, {3, 15, 0, 1}, {0, 0, 0, 0}), "block 1"},
      {"negative level", HandChunk(20, 2, {kMinusOne, kOne, kHalf, kHalf}, {3, 15, 0, 1}, {0, 0, 0, 0}), "levels"},
      {"levels out of order", HandChunk(20, 2, {kOne, kHalf, kHalf, kHalf}, {3, 15, 0, 1}, {0, 0, 0, 0}), "r0 <= r1"},
      {"kept above the block", HandChunk(16, 17, {kHalf, kOne}, {}, {}), "1 <= kept <= block"},
  };
  TensorChunk short_payload = HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {3, 15, 0, 1}, {0, 0, 0, 0});
  short_payload.mutable_data()->pop_back();
  cases.push_back({"2-bit payload one byte short", short_payload, "takes 11 bytes but carries 10"});
  TensorChunk long_payload = HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {3, 15, 0, 1}, {0, 0, 0, 0});
  long_payload.mutable_data()->push_back('\0');
  cases.push_back({"payload one byte long", long_payload, "carries 12"});
  TensorChunk no_block = HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {3, 15, 0, 1}, {0, 0, 0, 0});
  no_block.set_topk_chunk(0);
  cases.push_back({"no block length", no_block, "2 <= block"});
  TensorChunk misaligned = HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {3, 15, 0, 1}, {0, 0, 0, 0});
  misaligned.set_offset(8);
  cases.push_back({"offset inside a block", misaligned, "does not start a block"});
  for (const Case& c : cases) {
    auto decoded = DecodeValues(c.chunk, at::kFloat);
    ASSERT_FALSE(decoded.ok()) << c.what;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(std::string(decoded.status().message()).find(c.says), std::string::npos)
        << c.what << ": " << decoded.status();
  }
  TensorChunk int_tensor = HandChunk(20, 2, {kHalf, kOne, kHalf, kHalf}, {3, 15, 0, 1}, {0, 0, 0, 0});
  EXPECT_FALSE(DecodeValues(int_tensor, at::kLong).ok());
}

TEST(TopkConfigTest, TopkIsAPushCodecWithCheckedParameters) {
  auto ok = ParseConfig("comm: {codec: topk, topk_chunk: 1024, topk_per_chunk: 16, error_decay: 0.9}\n", "t.yaml", {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->comm.codec, WireCodec::kTopk);
  EXPECT_EQ(CodecOf(ok->comm.codec), CODEC_TOPK);
  auto pull = ParseConfig("comm: {pull_codec: topk}\n", "t.yaml", {});
  ASSERT_FALSE(pull.ok());
  EXPECT_NE(std::string(pull.status().message()).find("comm.pull_codec"), std::string::npos);
  auto above = ParseConfig("comm: {codec: topk, topk_chunk: 64, topk_per_chunk: 65}\n", "t.yaml", {});
  ASSERT_FALSE(above.ok());
  EXPECT_NE(std::string(above.status().message()).find("comm.topk_per_chunk"), std::string::npos);
  EXPECT_FALSE(ParseConfig("comm: {error_decay: 1.5}\n", "t.yaml", {}).ok());
}

}  // namespace
}  // namespace diloco
