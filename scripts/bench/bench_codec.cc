// diloco-bench-codec: the push codecs on one thread (at::set_num_threads(1)), on a pseudo-gradient of N(0, 1e-3)
// values (--params, default 155.5M, the paper-size model) cut into wire chunks as a worker cuts them
// (comm.chunk_bytes 1 MiB): per codec, the encode time of the whole pseudo-gradient (TensorChunker, as a push
// encodes it), the payload bytes and their fraction of fp32, and the receiver's work per chunk, timed: decode (for
// topk the checked sparse decode, DecodeTopk) and fold into a float32 sum (add_ of the dense chunk; for topk the
// kept values only, index_add_), reported as parameters per second. Prints one JSON line per codec. Not a test.
// With --pull-workers W1,W2,..: for each W, the size of a sparse pull (proto/sparse_update.h, CODEC_UPDATE) after a
// round of W workers' topk pushes of independent N(0, 1e-3) pseudo-gradients averaged with equal weights (outer SGD
// lr 1, no momentum), in 1 MiB-of-int8 wire chunks, and its fraction of fp32; one JSON line per W.
// Usage: diloco-bench-codec [--params N] [--codecs int8,topk] [--repeat R] [--pull-workers 1,2,4]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "proto/codec.h"
#include "proto/sparse_update.h"
#include "proto/tensor_chunks.h"
#include "proto/topk_codec.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

struct Row {
  double encode_s = 1e30, ingest_s = 1e30;
  int64_t bytes = 0;
};

// One pass: encodes every chunk (kept for the receiver's pass), then decodes and folds them all.
void Pass(const at::Tensor& delta, diloco::Codec codec, at::Tensor& sum, Row& row) {
  std::vector<diloco::TensorChunk> chunks;
  diloco::TensorChunker chunker({{"delta", delta}}, 1 << 20, codec);
  auto t0 = std::chrono::steady_clock::now();
  for (diloco::TensorChunk c; chunker.Next(&c);) chunks.push_back(c);
  row.encode_s = std::min(row.encode_s, Seconds(t0));
  row.bytes = chunker.bytes_emitted();
  at::Tensor flat = sum.view({-1});
  t0 = std::chrono::steady_clock::now();
  for (const diloco::TensorChunk& c : chunks) {
    at::Tensor part = flat.narrow(0, c.offset(), c.count());
    if (codec == diloco::CODEC_TOPK) {
      diloco::SparseChunk s = diloco::DecodeTopk(c).value();
      part.index_add_(0, s.index, s.values, 0.5);
    } else {
      part.add_(diloco::DecodeValues(c, at::kFloat).value(), 0.5);
    }
  }
  row.ingest_s = std::min(row.ingest_s, Seconds(t0));
}

// The bytes of the sparse pull after W workers' topk pushes (the coordinator's average, then CODEC_UPDATE).
nlohmann::json SparsePullRow(int64_t params, int workers) {
  const diloco::TopkParams topk;
  const int64_t elements = diloco::TopkChunkElements(1 << 20, topk);
  at::Tensor average = at::zeros({params});
  for (int w = 0; w < workers; ++w) {
    const at::Tensor delta = at::randn({params}) * 1e-3;
    average.add_(diloco::TopkRoundTrip(delta, topk, elements), 1.0 / workers);
  }
  const float* p = average.data_ptr<float>();
  int64_t bytes = 0, changed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t offset = 0; offset < params; offset += elements) {
    diloco::TensorChunk chunk;
    changed += diloco::EncodeUpdate(p + offset, std::min(elements, params - offset), -1.0f, topk.chunk, &chunk);
    bytes += static_cast<int64_t>(chunk.data().size());
  }
  return {{"sparse_pull_workers", workers},
          {"params", params},
          {"changed", changed},
          {"pull_bytes", bytes},
          {"fraction_of_fp32", static_cast<double>(bytes) / (4.0 * params)},
          {"encode_s", Seconds(t0)}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"diloco-bench-codec: encode time and decode + fold throughput of the push codecs, one thread"};
  int64_t params = 155'500'000;
  std::string codecs = "fp32,int8,topk";
  int repeat = 2;
  app.add_option("--params", params, "pseudo-gradient size");
  app.add_option("--codecs", codecs, "comma-separated codecs");
  app.add_option("--repeat", repeat, "passes per codec (the best is reported)");
  std::string pull_workers;
  app.add_option("--pull-workers", pull_workers, "comma-separated worker counts: sizes of a sparse pull instead");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  at::manual_seed(0);
  if (!pull_workers.empty()) {
    for (absl::string_view w : absl::StrSplit(pull_workers, ',')) {
      std::cout << SparsePullRow(params, std::stoi(std::string(w))).dump() << std::endl;
    }
    return 0;
  }
  const at::Tensor delta = at::randn({params}) * 1e-3;
  at::Tensor sum = at::zeros({params});
  for (absl::string_view name : absl::StrSplit(codecs, ',')) {
    auto codec = diloco::CodecFromName(std::string(name));
    if (!codec.ok()) {
      std::cerr << codec.status().message() << "\n";
      return 2;
    }
    Row row;
    for (int r = 0; r < repeat; ++r) Pass(delta, *codec, sum, row);
    std::cout << nlohmann::json{{"codec", std::string(name)},
                                {"params", params},
                                {"threads", 1},
                                {"encode_s", row.encode_s},
                                {"payload_bytes", row.bytes},
                                {"fraction_of_fp32", static_cast<double>(row.bytes) / (4.0 * params)},
                                {"ingest_s", row.ingest_s},
                                {"ingest_params_per_s", params / row.ingest_s}}
                     .dump()
              << std::endl;
  }
  return 0;
}
