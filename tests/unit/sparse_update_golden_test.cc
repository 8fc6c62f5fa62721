// CODEC_UPDATE (proto/update_block.h) against tests/golden/sparse_update_reference.py, a numpy coder written from
// proto/PROTOCOL.md (the ctest fixture runs it into the build directory): our decoder must read the reference's
// payloads (its own choice of literals, sums and index codes, all four index codes and Huffman's inline sums, a short
// last block, blocks of 2, empty blocks, subnormals, -0, the largest floats) to the same positions and steps bit for
// bit; and the reference must read our encoder's payloads of the same steps back to them (run with DILOCO_PYTHON at
// test time).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "proto/sparse_update.h"

namespace diloco {
namespace {

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct UpdateCase {
  std::string name;
  int64_t block = 0, count = 0;
  std::vector<float> steps;
  std::string mask, payload;
};

std::vector<UpdateCase> LoadUpdateCases(const std::string& dir) {
  std::istringstream names(ReadBytes(dir + "/update_cases.txt"));
  std::vector<UpdateCase> cases;
  for (std::string name; names >> name;) {
    UpdateCase c;
    c.name = name;
    std::istringstream meta(ReadBytes(dir + "/" + name + ".meta"));
    meta >> c.block >> c.count;
    const std::string steps = ReadBytes(dir + "/" + name + ".steps.f32");
    c.steps.resize(steps.size() / 4);
    std::memcpy(c.steps.data(), steps.data(), steps.size());
    c.mask = ReadBytes(dir + "/" + name + ".mask.u8");
    c.payload = ReadBytes(dir + "/" + name + ".payload");
    EXPECT_EQ(static_cast<int64_t>(c.steps.size()), c.count) << name;
    cases.push_back(std::move(c));
  }
  return cases;
}

TensorChunk UpdateChunk(const UpdateCase& c, const std::string& payload) {
  TensorChunk chunk;
  chunk.set_name("w");
  chunk.set_dtype(FLOAT32);
  chunk.add_shape(c.count);
  chunk.set_count(c.count);
  chunk.set_codec(CODEC_UPDATE);
  chunk.set_topk_chunk(c.block);
  chunk.set_data(payload);
  return chunk;
}

// The decoded chunk names exactly the masked positions with their steps' bits.
void ExpectSteps(const UpdateCase& c, const std::string& payload) {
  auto decoded = DecodeUpdate(UpdateChunk(c, payload));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  std::vector<int64_t> want;
  for (int64_t j = 0; j < c.count; ++j) {
    if (c.mask[j]) want.push_back(j);
  }
  ASSERT_EQ(decoded->index.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(decoded->index[i].item<int64_t>(), want[i]);
    const float got = decoded->values[i].item<float>();
    ASSERT_EQ(std::memcmp(&got, &c.steps[want[i]], 4), 0) << "position " << want[i] << ": " << got;
  }
}

TEST(SparseUpdateGolden, OurDecoderReadsTheReferencePayloads) {
  const std::vector<UpdateCase> cases = LoadUpdateCases(DILOCO_TOPK_GOLDEN_DIR);
  ASSERT_GE(cases.size(), 7u);
  for (const UpdateCase& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectSteps(c, c.payload);
  }
}

TEST(SparseUpdateGolden, TheReferenceReadsOurPayloads) {
  const std::string dir = DILOCO_TOPK_GOLDEN_DIR;
  const std::vector<UpdateCase> cases = LoadUpdateCases(dir);
  ASSERT_GE(cases.size(), 7u);
  for (const UpdateCase& c : cases) {
    SCOPED_TRACE(c.name);
    // The steps as the delta of lr -1 (fl(1 * s) = s); the cases change no position to +0, which is never sent.
    TensorChunk chunk = UpdateChunk(c, "");
    std::vector<float> delta(c.count, 0.0f);
    for (int64_t j = 0; j < c.count; ++j) {
      if (c.mask[j]) delta[j] = c.steps[j];
    }
    EncodeUpdate(delta.data(), c.count, 1.0f, c.block, &chunk);
    ExpectSteps(c, chunk.data());
    std::ofstream(dir + "/" + c.name + ".cpp.payload", std::ios::binary) << chunk.data();
  }
  const std::string command =
      std::string(DILOCO_PYTHON) + " " + DILOCO_SOURCE_DIR + "/tests/golden/sparse_update_reference.py --check " + dir;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace diloco
