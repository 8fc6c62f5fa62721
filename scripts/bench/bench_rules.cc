// diloco-bench-rules: the coordinate-wise rules' reduction of one window chunk (coordinator/aggregation_rule.h), the
// work the coordinator does under its lock for every chunk of a round under outer.aggregation trimmed_mean or
// centered_clip: k pushes' values of one comm.chunk_bytes chunk (1 MiB of fp32: 262,144 values; N(0, 1e-3), one push
// x -1000) reduced to one. trimmed_mean is timed with and without counting each push's dropped coordinates (the
// suspect flag's trimmed share), and the column sort with std::sort and with the sorting network, side by side in
// one run. Bytes processed: the k pushes' fp32 bytes. On one LibTorch
// thread (at::set_num_threads(1)) unless --threads. Not a test; Google Benchmark's flags apply
// (--benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians).
// Usage: diloco-bench-rules [--threads N] [benchmark flags]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "coordinator/aggregation_rule.h"

namespace {

constexpr int64_t kChunkValues = 262144;  // comm.chunk_bytes 1 MiB of fp32

at::Tensor Rows(int64_t k) {
  at::manual_seed(32);
  at::Tensor rows = at::randn({k, kChunkValues}) * 1e-3;
  rows[k - 1].mul_(-1000);  // one push far out, as an attacker's
  return rows;
}

void SetBytes(benchmark::State& state, int64_t k) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * k * kChunkValues * 4);
}

// Arguments: k pushes, trim, whether to count each push's dropped coordinates.
void BM_TrimmedMean(benchmark::State& state) {
  const int64_t k = state.range(0);
  const at::Tensor rows = Rows(k);
  std::vector<int64_t> dropped(static_cast<size_t>(k), 0);
  for (auto _ : state) {
    benchmark::DoNotOptimize(diloco::TrimmedMean(rows, state.range(1), state.range(2) != 0 ? &dropped : nullptr));
  }
  SetBytes(state, k);
}
BENCHMARK(BM_TrimmedMean)
    ->ArgNames({"k", "trim", "count"})
    ->Args({8, 2, 0})
    ->Args({8, 2, 1})
    ->Args({8, 1, 0})
    ->Args({8, 1, 1})
    ->Unit(benchmark::kMillisecond);

// The column sort both rules do per coordinate, side by side: gather the k values of each column and sort them with
// std::sort (insertion sort at this size) or with the sorting network (aggregation_rule.h SortWithNetwork).
// Arguments: k pushes, network (0: std::sort).
void BM_ColumnSort(benchmark::State& state) {
  const int64_t k = state.range(0);
  const at::Tensor rows = Rows(k).to(at::kDouble).contiguous();
  const double* x = rows.data_ptr<double>();
  const diloco::SortingNetwork network = diloco::MakeSortingNetwork(k);
  std::vector<double> col(static_cast<size_t>(k));
  for (auto _ : state) {
    double sum = 0;
    for (int64_t j = 0; j < kChunkValues; ++j) {
      for (int64_t i = 0; i < k; ++i) col[static_cast<size_t>(i)] = x[i * kChunkValues + j];
      if (state.range(1) != 0) {
        diloco::SortWithNetwork(network, col.data());
      } else {
        std::sort(col.begin(), col.end());
      }
      sum += col[static_cast<size_t>(k / 2)];
    }
    benchmark::DoNotOptimize(sum);
  }
  SetBytes(state, k);
}
BENCHMARK(BM_ColumnSort)->ArgNames({"k", "network"})->Args({8, 0})->Args({8, 1})->Unit(benchmark::kMillisecond);

// Arguments: k pushes, iterations (tau derived from the rows, as outer.cclip_tau 0).
void BM_CenteredClip(benchmark::State& state) {
  const int64_t k = state.range(0);
  const at::Tensor rows = Rows(k);
  for (auto _ : state) benchmark::DoNotOptimize(diloco::CenteredClip(rows, 0, state.range(1)));
  SetBytes(state, k);
}
BENCHMARK(BM_CenteredClip)->ArgNames({"k", "iterations"})->Args({8, 3})->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
      continue;
    }
    rest.push_back(argv[i]);
  }
  at::set_num_threads(threads);
  int count = static_cast<int>(rest.size());
  benchmark::Initialize(&count, rest.data());
  if (benchmark::ReportUnrecognizedArguments(count, rest.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
