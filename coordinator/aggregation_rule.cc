#include "coordinator/aggregation_rule.h"

#include <ATen/Parallel.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
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

// The coordinate-wise rules work on one chunk position of every push at a time: x is [k, n] row-major (row i = push
// i), and each rule is a loop over the n columns (in parallel over column ranges), no [k, n] temporaries. x is the
// pushes' float32 values where the rows are float32 (each value widened to float64 as it is read: the same results
// as over a float64 copy, at half the bytes read per pass), else a float64 copy (RuleRows); sums are float64.
constexpr int64_t kColumnGrain = 4096;

at::Tensor RuleRows(const at::Tensor& rows) {
  return rows.scalar_type() == at::kFloat ? rows.contiguous() : rows.to(at::kDouble).contiguous();
}

// f(const T* data) with T float or double, as RuleRows left x.
template <typename F>
auto WithData(const at::Tensor& x, const F& f) {
  return x.scalar_type() == at::kFloat ? f(x.data_ptr<float>()) : f(x.data_ptr<double>());
}

// The k values of column j, sorted by `network` (SortingNetwork(k)), into col.
template <typename T>
void SortedColumn(const T* x, int64_t k, int64_t n, int64_t j, const SortingNetwork& network,
                  std::vector<double>& col) {
  for (int64_t i = 0; i < k; ++i) col[static_cast<size_t>(i)] = x[i * n + j];
  SortWithNetwork(network, col.data());
}

// Each row's norm |x_i - v| over the n columns, added up as the columns are visited: fixed blocks of kColumnGrain
// columns hold their own k partial sums of squares, summed in block order at the end, so the norms are the same for
// any number of threads. A rule's pass over the columns adds a column's squares once that column's v is final, which
// saves a pass of its own over the k x n values.
class RowNorms {
 public:
  RowNorms(int64_t k, int64_t n) : k_(k), squares_(static_cast<size_t>(Blocks(n) * k), 0.0) {}

  static int64_t Blocks(int64_t n) { return (n + kColumnGrain - 1) / kColumnGrain; }
  // Adds (x_ij - vj)^2 of column j to its block's sums.
  template <typename T>
  void Add(const T* x, int64_t n, int64_t j, double vj) {
    double* s = squares_.data() + (j / kColumnGrain) * k_;
    for (int64_t i = 0; i < k_; ++i) {
      const double z = x[i * n + j] - vj;
      s[i] += z * z;
    }
  }
  std::vector<double> Norms() const {
    std::vector<double> out(static_cast<size_t>(k_), 0.0);
    for (size_t b = 0; b < squares_.size(); b += static_cast<size_t>(k_)) {
      for (size_t i = 0; i < out.size(); ++i) out[i] += squares_[b + i];
    }
    for (double& o : out) o = std::sqrt(o);
    return out;
  }

 private:
  int64_t k_;
  std::vector<double> squares_;  // [blocks, k]
};

// body(lo, hi) for each fixed column block [b x kColumnGrain, min(n, (b + 1) x kColumnGrain)), the blocks in
// parallel: one block is never split between threads (RowNorms::Add writes its block's sums).
template <typename Body>
void ForColumnBlocks(int64_t n, const Body& body) {
  at::parallel_for(0, RowNorms::Blocks(n), 1, [&](int64_t b_lo, int64_t b_hi) {
    for (int64_t b = b_lo; b < b_hi; ++b) body(b * kColumnGrain, std::min(n, (b + 1) * kColumnGrain));
  });
}

// numpy.median over each column, and each row's norm |x_i - median| (CenteredClipTau's and the first iteration's).
template <typename T>
std::pair<std::vector<double>, std::vector<double>> MediansAndDistances(const T* x, int64_t k, int64_t n) {
  if (k < 1) throw std::invalid_argument("coordinate-wise median of no rows");
  const SortingNetwork network = MakeSortingNetwork(k);
  std::vector<double> v(static_cast<size_t>(n));
  RowNorms distances(k, n);
  ForColumnBlocks(n, [&](int64_t lo, int64_t hi) {
    std::vector<double> col(static_cast<size_t>(k));
    for (int64_t j = lo; j < hi; ++j) {
      SortedColumn(x, k, n, j, network, col);
      const size_t h = static_cast<size_t>(k / 2);
      v[static_cast<size_t>(j)] = k % 2 == 1 ? col[h] : (col[h - 1] + col[h]) * 0.5;
      distances.Add(x, n, j, v[static_cast<size_t>(j)]);
    }
  });
  return {std::move(v), distances.Norms()};
}

at::Tensor ToTensor(const std::vector<double>& v) {
  return at::from_blob(const_cast<double*>(v.data()), {static_cast<int64_t>(v.size())}, at::kDouble).clone();
}

template <typename T>
at::Tensor TrimmedMeanOf(const T* data, int64_t k, int64_t n, int64_t trim, std::vector<int64_t>* trimmed) {
  if (k < 1) throw std::invalid_argument("trimmed mean of no rows");
  const int64_t b = TrimOf(trim, k);
  const SortingNetwork network = MakeSortingNetwork(k);
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
        const double v = static_cast<double>(data[i * n + j]);
        dropped[static_cast<size_t>(i)] += static_cast<int64_t>((v < low) | (v > high));
      }
    }
    if (dropped.empty()) return;
    std::lock_guard<std::mutex> lock(counts_mu);
    for (size_t i = 0; i < dropped.size(); ++i) (*trimmed)[i] += dropped[i];
  });
  return out;
}

template <typename T>
at::Tensor CenteredClipOf(const T* data, int64_t k, int64_t n, double tau, int64_t iterations) {
  std::vector<double> v, norms;
  std::tie(v, norms) = MediansAndDistances(data, k, n);
  if (!(tau > 0)) tau = Median(norms);  // CenteredClipTau, from the same median
  for (int64_t l = 0; l < iterations; ++l) {
    std::vector<double> factor(static_cast<size_t>(k), 1.0);
    for (size_t i = 0; i < factor.size(); ++i) {
      if (norms[i] > 0) factor[i] = std::min(tau / norms[i], 1.0);
    }
    const bool last = l + 1 == iterations;
    RowNorms next(last ? 0 : k, n);  // the next iteration's |x_i - v|, taken in the same pass
    ForColumnBlocks(n, [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) {
        const double c = v[static_cast<size_t>(j)];
        double sum = 0;
        for (int64_t i = 0; i < k; ++i) {
          sum += (static_cast<double>(data[i * n + j]) - c) * factor[static_cast<size_t>(i)];
        }
        v[static_cast<size_t>(j)] = c + sum / static_cast<double>(k);
        if (!last) next.Add(data, n, j, v[static_cast<size_t>(j)]);
      }
    });
    if (!last) norms = next.Norms();
  }
  return ToTensor(v);
}

}  // namespace

double TrimKeptScale(double trimmed_share, int64_t trim, int64_t k) {
  k = std::max<int64_t>(k, 1);
  const double even_kept = 1.0 - 2.0 * static_cast<double>(TrimOf(trim, k)) / static_cast<double>(k);
  return std::clamp((1.0 - trimmed_share) / even_kept, 0.0, 1.0);
}

at::Tensor TrimmedMean(const at::Tensor& rows, int64_t trim, std::vector<int64_t>* trimmed) {
  const at::Tensor x = RuleRows(rows);
  return WithData(x, [&](const auto* data) { return TrimmedMeanOf(data, x.size(0), x.size(1), trim, trimmed); });
}

at::Tensor CenteredClip(const at::Tensor& rows, double tau, int64_t iterations) {
  const at::Tensor x = RuleRows(rows);
  return WithData(x, [&](const auto* data) { return CenteredClipOf(data, x.size(0), x.size(1), tau, iterations); });
}

double CenteredClipTau(const at::Tensor& rows) {
  const at::Tensor x = RuleRows(rows);
  return WithData(x, [&](const auto* data) { return Median(MediansAndDistances(data, x.size(0), x.size(1)).second); });
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

void ClipGate::KeepOnly(const std::vector<std::string>& expected) {
  if (open_) return;
  const std::set<std::string> keep(expected.begin(), expected.end());
  for (auto it = declared_.begin(); it != declared_.end();) {
    it = keep.count(it->first) != 0 ? std::next(it) : declared_.erase(it);
  }
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
