#include "coordinator/aggregation_rule.h"

#include <ATen/Parallel.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace diloco {

double SquaredNorm(const at::Tensor& values) { return Dot(values, values); }  // Dot's eight float64 lanes

double Dot(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() != b.numel()) throw std::invalid_argument("Dot of tensors of different lengths");
  if (a.scalar_type() != at::kFloat || b.scalar_type() != at::kFloat || !a.is_contiguous() || !b.is_contiguous()) {
    return (a.to(at::kDouble) * b.to(at::kDouble)).sum().item<double>();
  }
  const float* x = a.data_ptr<float>();
  const float* y = b.data_ptr<float>();
  const int64_t n = a.numel();
  // Eight partial sums, added up in a fixed order at the end: the compiler vectorizes the inner loop (one sum would
  // be a serial chain of float64 adds), and the result stays the same from run to run.
  constexpr int kLanes = 8;
  double lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[j + l]) * static_cast<double>(y[j + l]);
  }
  double sum = 0;
  for (double lane : lanes) sum += lane;
  for (; j < n; ++j) sum += static_cast<double>(x[j]) * static_cast<double>(y[j]);
  return sum;
}

namespace {

uint64_t HashBytes(const at::Tensor& t, uint64_t seed) {
  const at::Tensor c = t.contiguous();
  return XXH64(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size(), seed);
}

}  // namespace

uint64_t ChunkHash(size_t index, int64_t offset, const at::Tensor& values, const at::Tensor& more) {
  uint64_t seed = static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(offset);
  if (more.defined()) seed = HashBytes(more, seed);
  return HashBytes(values, seed);
}

uint64_t ChainHash(uint64_t running, uint64_t chunk) {
  const uint64_t pair[2] = {running, chunk};
  return XXH64(pair, sizeof(pair), /*seed=*/0);
}

namespace {

// (norm, id) with non-finite norms as +Inf, largest first, ties by id.
std::vector<std::pair<double, std::string>> ByNorm(const RoundState::Pushes& pushes) {
  std::vector<std::pair<double, std::string>> out;
  for (const auto& [id, ticket] : pushes) {
    const double norm = std::sqrt(ticket.squared_norm);
    out.emplace_back(std::isfinite(norm) ? norm : HUGE_VAL, id);
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

std::string DescribePushNorms(const RoundState::Pushes& pushes) {
  std::string line;
  for (const auto& [norm, id] : ByNorm(pushes)) {
    absl::StrAppend(&line, line.empty() ? "" : ", ", id, " norm ", absl::StrFormat("%.4g", norm), " (",
                    pushes.at(id).tokens, " tokens)");
  }
  return line;
}

std::string LargestNormPush(const RoundState::Pushes& pushes) {
  const auto sorted = ByNorm(pushes);
  return sorted.empty() ? std::string() : sorted.front().second;
}

double Median(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("Median of no values");
  std::sort(values.begin(), values.end());
  const size_t k = values.size();
  return k % 2 == 1 ? values[k / 2] : 0.5 * (values[k / 2 - 1] + values[k / 2]);
}

std::vector<double> MomentumBound(const std::vector<double>& q, double k) {
  const double median = Median(q);
  std::vector<double> deviations;
  deviations.reserve(q.size());
  for (double v : q) deviations.push_back(std::fabs(v - median));
  const double half_width = k * 1.4826 * Median(std::move(deviations));
  std::vector<double> bounded;
  bounded.reserve(q.size());
  for (double v : q) bounded.push_back(std::min(v, median + half_width));
  return bounded;
}

bool FarBeyond(double value, double limit, double center, double margin) {
  return value > limit && value - center > margin * (limit - center);
}

double MomentumDot(const MomentumAxis* axis, size_t index, int64_t offset, const at::Tensor& values,
                   const at::Tensor& positions) {
  if (axis == nullptr || index >= axis->tensors.size()) return 0;
  const at::Tensor m = axis->tensors[index].reshape(-1);
  if (positions.defined()) return Dot(m.narrow(0, offset, m.numel() - offset).index_select(0, positions), values);
  return Dot(m.narrow(0, offset, values.numel()), values.reshape(-1));
}

std::vector<double> ClipScales(const std::vector<double>& norms, double clip_factor) {
  std::vector<double> scales(norms.size(), 1.0);
  if (norms.empty()) return scales;
  const double bound = clip_factor * Median(norms);
  for (size_t i = 0; i < norms.size(); ++i) {
    if (norms[i] > 0) scales[i] = std::min(1.0, bound / norms[i]);
  }
  return scales;
}

std::vector<double> CappedWeights(const std::vector<double>& tokens, double max_token_weight) {
  std::vector<double> weights = tokens;
  if (tokens.empty() || max_token_weight <= 0) return weights;
  const double cap = max_token_weight * Median(tokens);
  for (double& w : weights) w = std::min(w, cap);
  return weights;
}

SortingNetwork MakeSortingNetwork(int64_t k) {
  SortingNetwork network;
  int64_t size = 1;  // Batcher's network for the next power of two; pairs that touch an index >= k are dropped (as
  while (size < k) size *= 2;  // if those inputs were +Inf, which no compare-exchange moves)
  for (int64_t p = 1; p < size; p *= 2) {
    for (int64_t d = p; d >= 1; d /= 2) {
      for (int64_t j = d % p; j + d < size; j += 2 * d) {
        for (int64_t i = 0; i < d && i + j + d < size; ++i) {
          const int64_t a = i + j, b = i + j + d;
          if (a / (2 * p) == b / (2 * p) && b < k) {
            network.emplace_back(static_cast<int32_t>(a), static_cast<int32_t>(b));
          }
        }
      }
    }
  }
  return network;
}

void SortWithNetwork(const SortingNetwork& network, double* values) {
  for (const auto& [a, b] : network) {
    const double x = values[a], y = values[b];
    values[a] = std::min(x, y);
    values[b] = std::max(x, y);
  }
}

namespace {

// trimmed_mean's trim as applied to k pushes: lowered to (k - 1) / 2, so at least one value of each column is kept.
int64_t TrimOf(int64_t trim, int64_t k) { return std::min<int64_t>(std::max<int64_t>(trim, 0), (k - 1) / 2); }

// The coordinate-wise rules work on one chunk position of every push at a time: x is [k, n] float64 row-major (row i
// = push i), and each rule is a loop over the n columns (in parallel over column ranges), no [k, n] temporaries.
constexpr int64_t kColumnGrain = 4096;

// The k values of column j, sorted by `network` (SortingNetwork(k)), into col.
void SortedColumn(const double* x, int64_t k, int64_t n, int64_t j, const SortingNetwork& network,
                  std::vector<double>& col) {
  for (int64_t i = 0; i < k; ++i) col[static_cast<size_t>(i)] = x[i * n + j];
  SortWithNetwork(network, col.data());
}

// numpy.median over each column.
std::vector<double> ColumnMedians(const double* x, int64_t k, int64_t n) {
  if (k < 1) throw std::invalid_argument("coordinate-wise median of no rows");
  const SortingNetwork network = MakeSortingNetwork(k);
  std::vector<double> v(static_cast<size_t>(n));
  at::parallel_for(0, n, kColumnGrain, [&](int64_t lo, int64_t hi) {
    std::vector<double> col(static_cast<size_t>(k));
    for (int64_t j = lo; j < hi; ++j) {
      SortedColumn(x, k, n, j, network, col);
      const size_t h = static_cast<size_t>(k / 2);
      v[static_cast<size_t>(j)] = k % 2 == 1 ? col[h] : (col[h - 1] + col[h]) * 0.5;
    }
  });
  return v;
}

// |x_i - v| for each row i.
std::vector<double> RowDistances(const double* x, int64_t k, int64_t n, const std::vector<double>& v) {
  std::vector<double> out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    const double* row = x + i * n;
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double z = row[j] - v[static_cast<size_t>(j)];
      sum += z * z;
    }
    out[static_cast<size_t>(i)] = std::sqrt(sum);
  }
  return out;
}

at::Tensor ToTensor(const std::vector<double>& v) {
  return at::from_blob(const_cast<double*>(v.data()), {static_cast<int64_t>(v.size())}, at::kDouble).clone();
}

}  // namespace

at::Tensor TrimmedMean(const at::Tensor& rows, int64_t trim, std::vector<int64_t>* trimmed) {
  const at::Tensor x = rows.to(at::kDouble).contiguous();
  const int64_t k = x.size(0), n = x.size(1);
  if (k < 1) throw std::invalid_argument("trimmed mean of no rows");
  const int64_t b = TrimOf(trim, k);
  const SortingNetwork network = MakeSortingNetwork(k);
  const double* data = x.data_ptr<double>();
  at::Tensor out = at::empty({n}, at::kDouble);
  double* o = out.data_ptr<double>();
  std::mutex counts_mu;  // guards *trimmed while the ranges add their counts
  at::parallel_for(0, n, kColumnGrain, [&](int64_t lo, int64_t hi) {
    std::vector<double> col(static_cast<size_t>(k));
    std::vector<int64_t> dropped(trimmed != nullptr && b > 0 ? static_cast<size_t>(k) : 0, 0);
    for (int64_t j = lo; j < hi; ++j) {
      SortedColumn(data, k, n, j, network, col);
      double sum = 0;
      for (int64_t i = b; i < k - b; ++i) sum += col[static_cast<size_t>(i)];
      o[j] = sum / static_cast<double>(k - 2 * b);
      if (dropped.empty()) continue;
      const double low = col[static_cast<size_t>(b)], high = col[static_cast<size_t>(k - b - 1)];
      for (int64_t i = 0; i < k; ++i) {  // without branches: which rows fall outside is unpredictable
        const double v = data[i * n + j];
        dropped[static_cast<size_t>(i)] += static_cast<int64_t>((v < low) | (v > high));
      }
    }
    if (dropped.empty()) return;
    std::lock_guard<std::mutex> lock(counts_mu);
    for (size_t i = 0; i < dropped.size(); ++i) (*trimmed)[i] += dropped[i];
  });
  return out;
}

double TrimKeptScale(double trimmed_share, int64_t trim, int64_t k) {
  k = std::max<int64_t>(k, 1);
  const double even_kept = 1.0 - 2.0 * static_cast<double>(TrimOf(trim, k)) / static_cast<double>(k);
  return std::clamp((1.0 - trimmed_share) / even_kept, 0.0, 1.0);
}

at::Tensor CenteredClip(const at::Tensor& rows, double tau, int64_t iterations) {
  const at::Tensor x = rows.to(at::kDouble).contiguous();
  const int64_t k = x.size(0), n = x.size(1);
  const double* data = x.data_ptr<double>();
  std::vector<double> v = ColumnMedians(data, k, n);
  if (!(tau > 0)) tau = Median(RowDistances(data, k, n, v));  // CenteredClipTau, from the same median
  for (int64_t l = 0; l < iterations; ++l) {
    const std::vector<double> norms = RowDistances(data, k, n, v);
    std::vector<double> factor(static_cast<size_t>(k), 1.0);
    for (size_t i = 0; i < factor.size(); ++i) {
      if (norms[i] > 0) factor[i] = std::min(tau / norms[i], 1.0);
    }
    at::parallel_for(0, n, kColumnGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) {
        const double c = v[static_cast<size_t>(j)];
        double sum = 0;
        for (int64_t i = 0; i < k; ++i) sum += (data[i * n + j] - c) * factor[static_cast<size_t>(i)];
        v[static_cast<size_t>(j)] = c + sum / static_cast<double>(k);
      }
    });
  }
  return ToTensor(v);
}

double CenteredClipTau(const at::Tensor& rows) {
  const at::Tensor x = rows.to(at::kDouble).contiguous();
  const int64_t k = x.size(0), n = x.size(1);
  const double* data = x.data_ptr<double>();
  return Median(RowDistances(data, k, n, ColumnMedians(data, k, n)));
}

bool ClipGate::TryOpen(const std::vector<std::string>& expected, bool force, size_t min_declared) {
  if (open_) return true;
  bool all = !declared_.empty();
  for (const std::string& id : expected) all = all && declared_.count(id) != 0;
  if (!(all || force) || declared_.size() < std::max<size_t>(min_declared, 1)) return false;
  std::vector<double> norms, tokens;
  for (const auto& [id, d] : declared_) {
    norms.push_back(d.norm);
    tokens.push_back(d.tokens);
  }
  median_norm_ = Median(norms);
  median_tokens_ = Median(tokens);
  open_ = true;
  return true;
}

double ClipGate::Scale(double norm) const { return norm > 0 ? std::min(1.0, clip_factor_ * median_norm_ / norm) : 1.0; }

double ClipGate::Weight(double tokens) const {
  return max_token_weight_ > 0 ? std::min(tokens, max_token_weight_ * median_tokens_) : tokens;
}

void ClipGate::Reset() {
  declared_.clear();
  open_ = false;
  median_norm_ = median_tokens_ = 0;
}

}  // namespace diloco
