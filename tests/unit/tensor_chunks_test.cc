// Tensor <-> chunk stream (proto/tensor_chunks.h) and the model fingerprint (proto/tensor_spec.h).
#include "proto/tensor_chunks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "proto/tensor_spec.h"
#include "proto/topk_codec.h"

namespace diloco {
namespace {

using ::testing::HasSubstr;
using Named = std::vector<std::pair<std::string, at::Tensor>>;

// A tensor of `dtype` filled with random bit patterns (NaNs and denormals included), so only a byte-exact
// transport reproduces it.
at::Tensor RandomBits(at::ScalarType dtype, std::vector<int64_t> shape, uint32_t seed) {
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
  std::mt19937 rng(seed);
  auto* bytes = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel() * t.element_size(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  return t;
}

bool SameBytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

std::vector<TensorChunk> ChunksOf(const Named& tensors, int64_t chunk_bytes, int64_t* bytes_emitted = nullptr) {
  TensorChunker chunker(tensors, chunk_bytes);
  std::vector<TensorChunk> chunks;
  TensorChunk c;
  while (chunker.Next(&c)) chunks.push_back(c);
  if (bytes_emitted != nullptr) *bytes_emitted = chunker.bytes_emitted();
  return chunks;
}

Named ZerosLike(const Named& tensors) {
  Named out;
  for (const auto& [name, t] : tensors) out.emplace_back(name, at::zeros_like(t).contiguous());
  return out;
}

TEST(TensorChunksTest, EveryWireDTypeRoundTripsBitExactly) {
  const std::vector<at::ScalarType> dtypes = {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble,
                                              at::kLong,  at::kInt,  at::kChar,     at::kByte};
  Named tensors;
  int64_t total_bytes = 0;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    ASSERT_TRUE(ToWireDType(dtypes[i]).ok()) << c10::toString(dtypes[i]);
    tensors.emplace_back("t" + std::to_string(i), RandomBits(dtypes[i], {5, 7}, 100 + i));
    total_bytes += tensors.back().second.numel() * tensors.back().second.element_size();
    if (i == 3) tensors.emplace_back("empty", at::zeros({0, 4}, at::kFloat));  // zero elements: no chunk at all
  }
  tensors.emplace_back("big", RandomBits(at::kFloat, {1000}, 7));  // 4000 bytes: 63 chunks of <= 64 bytes
  total_bytes += 4000;

  int64_t emitted = 0;
  const std::vector<TensorChunk> chunks = ChunksOf(tensors, 64, &emitted);
  EXPECT_EQ(emitted, total_bytes);
  int big_chunks = 0;
  for (const TensorChunk& c : chunks) {
    EXPECT_LE(c.data().size(), 64u);
    EXPECT_NE(c.name(), "empty");
    EXPECT_EQ(c.codec(), CODEC_RAW);
    if (c.name() == "big") ++big_chunks;
  }
  EXPECT_EQ(big_chunks, 63);  // 62 x 16 floats + 8 floats

  Named dest = ZerosLike(tensors);
  ChunkAssembler into(dest);  // shares storage with `dest`
  for (const TensorChunk& c : chunks) {
    ASSERT_FALSE(into.Done());
    ASSERT_TRUE(into.Accept(c).ok()) << c.name() << " @" << c.offset();
  }
  EXPECT_TRUE(into.Done());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(SameBytes(dest[i].second, tensors[i].second)) << tensors[i].first;
  }
}

TEST(TensorChunksTest, NonContiguousTensorTravelsInLogicalOrder) {
  at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  Named tensors = {{"w", base.t()}};  // [4, 3], non-contiguous
  Named dest = {{"w", at::zeros({4, 3}, at::kFloat)}};
  ChunkAssembler assembler(dest);
  for (const TensorChunk& c : ChunksOf(tensors, 64)) ASSERT_TRUE(assembler.Accept(c).ok());
  EXPECT_TRUE(assembler.Done());
  EXPECT_TRUE(dest[0].second.equal(base.t()));
}

// A part of a topk push whose range starts inside a block of its tensor (a cluster rank's slice, comm.cluster_parts,
// when the tensors before it are not multiples of topk_chunk): the elements up to the block's end go as one raw
// chunk, then every topk chunk starts a block, and the coordinator's reader takes the whole stream. Before, the
// first topk chunk started mid-block and was refused ("does not start a block"): the cluster died.
TEST(TensorChunksTest, ATopkRangeThatStartsMidBlockSendsTheBlocksHeadRaw) {
  const std::vector<TensorSpec> specs = {{"a", {100}}, {"b", {1000}}};
  const FlatRange range{150, 1100};  // b's elements [50, 1000)
  const at::Tensor values = at::randn({range.size()});
  const TopkParams topk{64, 8};
  TensorChunker chunker(specs, values, 256, CODEC_TOPK, range, topk);
  ChunkStreamReader reader(specs, range);
  TensorChunk chunk;
  std::vector<std::pair<int64_t, int64_t>> cuts;  // offset, count
  while (chunker.Next(&chunk)) {
    cuts.emplace_back(chunk.offset(), chunk.count());
    if (chunk.codec() == CODEC_TOPK) {
      EXPECT_EQ(chunk.offset() % 64, 0);
      ASSERT_TRUE(reader.NextSparse(chunk).ok()) << chunk.offset();
    } else {
      EXPECT_EQ(chunk.codec(), CODEC_RAW);
      auto raw = reader.Next(chunk);
      ASSERT_TRUE(raw.ok()) << raw.status();
      EXPECT_TRUE(raw->equal(values.narrow(0, 0, 14))) << "the raw head is exact";
    }
  }
  EXPECT_TRUE(reader.Done());
  EXPECT_EQ(cuts, (std::vector<std::pair<int64_t, int64_t>>{{50, 14}, {64, 256}, {320, 256}, {576, 256}, {832, 168}}));
}

TEST(TensorChunksTest, ReaderReportsTensorIndexAndOffset) {
  Named tensors = {{"a", at::arange(20, at::kFloat)}, {"b", at::arange(3, at::kDouble)}};
  ChunkStreamReader reader(SpecsOf(tensors));
  std::vector<std::pair<size_t, int64_t>> seen;
  for (const TensorChunk& c : ChunksOf(tensors, 64)) {
    absl::StatusOr<at::Tensor> view = reader.Next(c);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->numel(), c.count());
    seen.emplace_back(reader.tensor_index(), reader.chunk_offset());
  }
  EXPECT_TRUE(reader.Done());
  const std::vector<std::pair<size_t, int64_t>> expected = {{0, 0}, {0, 16}, {1, 0}};
  EXPECT_EQ(seen, expected);
}

// A valid two-chunk stream for tensor "w" [4, 8] float32 (128 bytes), then "b" [3] float32.
class ChunkStreamReaderErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tensors_ = {{"w", at::arange(32, at::kFloat).reshape({4, 8})}, {"b", at::ones({3}, at::kFloat)}};
    chunks_ = ChunksOf(tensors_, 64);
    ASSERT_EQ(chunks_.size(), 3u);
  }
  // Feeds chunks_[0..n) and returns the status of `bad`.
  absl::Status FeedThen(size_t n, const TensorChunk& bad) {
    ChunkStreamReader reader(SpecsOf(tensors_));
    for (size_t i = 0; i < n; ++i) EXPECT_TRUE(reader.Next(chunks_[i]).ok());
    return reader.Next(bad).status();
  }
  Named tensors_;
  std::vector<TensorChunk> chunks_;
};

TEST_F(ChunkStreamReaderErrorTest, WrongName) {
  TensorChunk c = chunks_[0];
  c.set_name("x");
  absl::Status s = FeedThen(0, c);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'x'"));
}

TEST_F(ChunkStreamReaderErrorTest, WrongDType) {
  TensorChunk c = chunks_[0];
  c.set_dtype(FLOAT64);
  c.set_count(8);  // same byte count, so only the dtype is wrong
  absl::Status s = FeedThen(0, c);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("dtype"));
}

TEST_F(ChunkStreamReaderErrorTest, WrongShape) {
  TensorChunk c = chunks_[0];
  c.clear_shape();
  c.add_shape(8);
  c.add_shape(4);
  absl::Status s = FeedThen(0, c);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("shape"));
}

TEST_F(ChunkStreamReaderErrorTest, OffsetGap) {
  absl::Status s = FeedThen(0, chunks_[1]);  // skips elements [0, 16)
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("16"));
}

TEST_F(ChunkStreamReaderErrorTest, RepeatedChunkIsAnOffsetError) {
  absl::Status s = FeedThen(1, chunks_[0]);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
}

TEST_F(ChunkStreamReaderErrorTest, DataBytesDoNotMatchCount) {
  TensorChunk c = chunks_[0];
  c.set_data(c.data().substr(0, c.data().size() - 4));
  absl::Status s = FeedThen(0, c);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("60 bytes"));
}

TEST_F(ChunkStreamReaderErrorTest, CountBeyondTensorEnd) {
  TensorChunk c = chunks_[1];
  c.set_count(17);  // 16 elements remain
  c.set_data(std::string(17 * 4, '\0'));
  absl::Status s = FeedThen(1, c);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
}

TEST_F(ChunkStreamReaderErrorTest, ExtraChunkAfterTheEnd) {
  ChunkStreamReader reader(SpecsOf(tensors_));
  for (const TensorChunk& c : chunks_) ASSERT_TRUE(reader.Next(c).ok());
  ASSERT_TRUE(reader.Done());
  absl::Status s = reader.Next(chunks_[2]).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'b'"));
}

TEST_F(ChunkStreamReaderErrorTest, AssemblerRejectsMismatchedDestination) {
  Named dest = {{"w", at::zeros({4, 8}, at::kDouble)}, {"b", at::zeros({3}, at::kFloat)}};
  ChunkAssembler assembler(dest);
  absl::Status s = assembler.Accept(chunks_[0]);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'w'"));
  EXPECT_TRUE(dest[0].second.eq(0).all().item<bool>()) << "a rejected chunk must not be written";
}

TEST(TensorSpecTest, UnsupportedDTypeIsInvalidArgument) {
  EXPECT_EQ(ToWireDType(at::kBool).status().code(), absl::StatusCode::kInvalidArgument);
  for (DType d : {FLOAT32, FLOAT16, BFLOAT16, FLOAT64, INT64, INT32, INT8, UINT8}) {
    absl::StatusOr<at::ScalarType> t = FromWireDType(d);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(ToWireDType(*t).value(), d);
  }
}

TEST(TensorSpecTest, FingerprintIsStableAndSeesNamesShapesDTypesOrder) {
  const std::vector<TensorSpec> base = {{"emb", {128, 32}, at::kFloat}, {"head.bias", {128}, at::kFloat}};
  const std::string fp = Fingerprint(base);
  EXPECT_EQ(fp.size(), 16u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos) << fp;
  EXPECT_EQ(Fingerprint(base), fp);
  EXPECT_EQ(Fingerprint({{"emb", {128, 32}, at::kFloat}, {"head.bias", {128}, at::kFloat}}), fp);

  std::vector<TensorSpec> shape = base;
  shape[0].shape = {32, 128};
  EXPECT_NE(Fingerprint(shape), fp);
  std::vector<TensorSpec> name = base;
  name[1].name = "head.weight";
  EXPECT_NE(Fingerprint(name), fp);
  std::vector<TensorSpec> dtype = base;
  dtype[1].dtype = at::kHalf;
  EXPECT_NE(Fingerprint(dtype), fp);
  EXPECT_NE(Fingerprint({base[1], base[0]}), fp);
  EXPECT_EQ(TotalElements(base), 128 * 32 + 128);
}

// The test vector of proto/PROTOCOL.md "Fingerprint", computed independently with Python's xxhash package:
// xxh64(b"tok_emb.weight:Float:16x8;blocks.0.ln1.bias:Float:8;step:Long:;head.scale:BFloat16:2x3x4;",
//       seed=0x44694c6f436f) = 0xcd9ac65356bea607.
TEST(TensorSpecTest, FingerprintMatchesProtocolTestVector) {
  const std::vector<TensorSpec> specs = {{"tok_emb.weight", {16, 8}, at::kFloat},
                                         {"blocks.0.ln1.bias", {8}, at::kFloat},
                                         {"step", {}, at::kLong},
                                         {"head.scale", {2, 3, 4}, at::kBFloat16}};
  EXPECT_EQ(Fingerprint(specs), "cd9ac65356bea607");
}

TEST(TensorSpecTest, SpecsOfCopiesNamesShapesAndDTypes) {
  Named tensors = {{"a", at::zeros({2, 3}, at::kHalf)}, {"b", at::zeros({0}, at::kLong)}};
  std::vector<TensorSpec> specs = SpecsOf(tensors);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "a");
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(specs[0].dtype, at::kHalf);
  EXPECT_EQ(specs[0].numel(), 6);
  EXPECT_EQ(specs[1].numel(), 0);
}

// The zero-copy form used by the TCP push (Next with raw_payload): for every codec, the same chunk metadata and the
// same payload bytes as Next, the fp32 ones pointing into the tensor itself, and the same byte count.
TEST(TensorChunksTest, RawPayloadViewsMatchTheCopyingChunker) {
  const Named tensors = {{"w", at::randn({300, 7})}, {"b", at::randn({13})}, {"i", RandomBits(at::kLong, {9}, 5)}};
  for (Codec codec : {CODEC_RAW, CODEC_BF16, CODEC_INT8, CODEC_INT4}) {
    TensorChunker copying(tensors, 1024, codec), viewing(tensors, 1024, codec);
    TensorChunk a, b;
    std::string_view raw;
    int n = 0, views = 0;
    while (copying.Next(&a)) {
      ASSERT_TRUE(viewing.Next(&b, &raw)) << "codec " << codec << " chunk " << n;
      const std::string payload = raw.empty() ? b.data() : std::string(raw);
      if (!raw.empty()) {
        EXPECT_TRUE(b.data().empty());
        ++views;
      }
      EXPECT_EQ(payload, a.data()) << "codec " << codec << " chunk " << n;
      b.set_data(a.data());
      EXPECT_EQ(b.SerializeAsString(), a.SerializeAsString()) << "codec " << codec << " chunk " << n;
      ++n;
    }
    EXPECT_FALSE(viewing.Next(&b, &raw));
    EXPECT_EQ(viewing.bytes_emitted(), copying.bytes_emitted());
    EXPECT_GT(views, 0) << "the int64 tensor (and fp32 ones with codec fp32) travel raw";
  }
}

}  // namespace
}  // namespace diloco
