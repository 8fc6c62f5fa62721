// Robust aggregation (issue 32): the per-push facts the coordinator keeps to judge a round's pushes without holding
// one copy of the model per worker, and the rules over them.
//   SquaredNorm         sum of v^2 over one chunk in float64 (Dot(v, v)), added up per push while it folds
//   DescribePushNorms   "id norm x (tokens t)" for each push of a round, for the log line of a discarded round
//   LargestNormPush     the push blamed when a round's outer step would not be finite (the non-finite guard)
//   ChunkHash, ChainHash a push's payload hash (streaming XXH64 of its chunks in stream order): the duplicate check
// The rules (numpy's definitions; golden values from tests/golden/make_robust_golden.py):
//   Median              numpy.median: an even count gives the mean of the two middle values
//   ClipScales          Templar's clip: s_i = min(1, clip_factor x median_j n_j / n_i) (n_i = 0: 1)
//   CappedWeights       w_i = min(t_i, max_token_weight x median_j t_j) (max_token_weight 0: no cap)
//   MomentumBound       clip's bound along the outer momentum m: each push's projection q_i = s_i d_i . m / |m|
//                       lowered to at most median(q) + k x 1.4826 x median_i |q_i - median(q)| (1.4826 x MAD
//                       estimates a standard deviation; one-sided: nothing a push did not send is added); the
//                       average then loses sum_i w_i (q_i - q'_i) / sum_i w_i along m / |m|
//   FarBeyond           outer.flag_margin: a value held to `limit` lay beyond center + margin x (limit - center),
//                       far past the limit and not just over it (the suspect count: a clip of norm n to n s is far
//                       when s < 1 / margin; a bounded projection when it lay margin x as far from the median)
//   TrimmedMean         per coordinate, the mean after dropping the `trim` smallest and largest values; optionally
//                       counts per row the coordinates at which its value lay outside the kept range (strictly
//                       below the trim-th smallest or above the trim-th largest: a value tied with the edge is kept)
//   TrimKeptScale       trimmed_mean's counterpart of a clip scale, for the suspect count: the share of a push's
//                       coordinates that were kept over the share an even trim keeps, 1 - 2b / k (b the trim as
//                       lowered), at most 1: 1 when trimmed no more than evenly, 0 when trimmed everywhere
//   CenteredClip        BTARD's CenteredClip over rows x_i: v = coordinate-wise median, then `iterations` times
//                       v += mean_i(clip_tau(x_i - v)), clip_tau(z) = z min(1, tau / |z|); streamed chunk by chunk,
//                       |z| is the norm over the rows' coordinates (one chunk of each push)
//   CenteredClipTau     tau derived from the rows: median_i |x_i - coordinate-wise median| (scale-free per chunk)
//   MakeSortingNetwork  Batcher's odd-even merge sort for k values as compare-exchange pairs; SortWithNetwork runs it
//                       with min / max, no branches (the coordinate-wise rules sort each column's k values with it:
//                       which values swap is unpredictable, which made std::sort's insertion sort mispredict)
// Pure functions of their arguments: thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/round_state.h"

namespace diloco {

// sum_j values[j]^2 in float64 (any float dtype, any layout); +Inf when the sum itself overflows float64.
double SquaredNorm(const at::Tensor& values);
// sum_j a[j] b[j] in float64; a and b: 1-D of one length, any float dtype.
double Dot(const at::Tensor& a, const at::Tensor& b);

// XXH64 of one chunk's bytes (`values`, made contiguous) with its place (tensor `index`, element `offset`) as seed;
// `more` (e.g. a topk chunk's positions) is hashed first when defined. ChainHash folds it into a push's running
// hash: equal hashes mean equal chunks in the same order (a collision has odds 2^-64 per pair).
uint64_t ChunkHash(size_t index, int64_t offset, const at::Tensor& values, const at::Tensor& more = at::Tensor());
uint64_t ChainHash(uint64_t running, uint64_t chunk);

// One line listing every push of `pushes` with its L2 norm and tokens, largest norm first.
std::string DescribePushNorms(const RoundState::Pushes& pushes);

// The worker id of the push with the largest norm (a non-finite norm counts as largest; ties: the first id in
// order); "" when `pushes` is empty.
std::string LargestNormPush(const RoundState::Pushes& pushes);

// ClipGate: outer.aggregation clip's state for the open round (docs/operations.md "Robust aggregation"): the norms
// and token counts the round's push headers declared and, once the fold is open, the medians fixed from them. A push
// folds with weight Weight(tokens) x Scale(norm) and counts Weight(tokens) in the total. Not thread-safe: the core
// guards it with its mutex.
class ClipGate {
 public:
  ClipGate(double clip_factor, double max_token_weight)
      : clip_factor_(clip_factor), max_token_weight_(max_token_weight) {}
  void Declare(const std::string& id, double norm, double tokens) { declared_[id] = {norm, tokens}; }
  // Before the fold opens: forgets the declarations of ids not in `expected` (members lost, gone or quarantined since
  // they declared), so a dead member's claim neither moves the medians nor counts toward min_declared.
  void KeepOnly(const std::vector<std::string>& expected);
  size_t declared() const { return declared_.size(); }
  bool open() const { return open_; }
  // Opens the fold when at least `min_declared` have declared and either every id of `expected` has or `force`;
  // returns open().
  bool TryOpen(const std::vector<std::string>& expected, bool force, size_t min_declared);
  double median_norm() const { return median_norm_; }
  double median_tokens() const { return median_tokens_; }
  double Scale(double norm) const;     // min(1, clip_factor x median norm / norm); 1 for norm 0. Requires open().
  double Weight(double tokens) const;  // min(tokens, max_token_weight x median tokens). Requires open().
  void Reset();                        // the next round: nothing declared, closed

 private:
  struct Declared {
    double norm = 0;
    double tokens = 0;
  };
  double clip_factor_, max_token_weight_;
  std::map<std::string, Declared> declared_;
  bool open_ = false;
  double median_norm_ = 0, median_tokens_ = 0;
};

double Median(std::vector<double> values);  // requires values non-empty
// The projections q bounded as above (k >= 0); requires q non-empty.
std::vector<double> MomentumBound(const std::vector<double>& q, double k);
bool FarBeyond(double value, double limit, double center, double margin);
// The outer momentum a round's pushes are projected on: the store's tensors (handles, read in place; written only by
// an outer step, while no push of the round can fold) and their L2 norm (> 0).
struct MomentumAxis {
  std::vector<at::Tensor> tensors;
  double norm = 0;
};
// One chunk's dot with the momentum: values (1-D) at elements [offset, offset + n) of tensor `index`, or, with
// `positions` defined (a topk chunk), at offset + positions. 0 with no axis. Reads only: thread-safe.
double MomentumDot(const MomentumAxis* axis, size_t index, int64_t offset, const at::Tensor& values,
                   const at::Tensor& positions = at::Tensor());
std::vector<double> ClipScales(const std::vector<double>& norms, double clip_factor);
std::vector<double> CappedWeights(const std::vector<double>& tokens, double max_token_weight);
// rows: [k, n], row i = push i's values of one chunk (any float dtype); returns [n] float64. trim is lowered to
// (k - 1) / 2 when 2 x trim >= k. `trimmed` (when not null, k entries): adds to entry i the number of coordinates
// at which row i was dropped.
at::Tensor TrimmedMean(const at::Tensor& rows, int64_t trim, std::vector<int64_t>* trimmed = nullptr);
// trimmed_share: the share of a push's coordinates that were dropped, of a set of k pushes trimmed by `trim`.
double TrimKeptScale(double trimmed_share, int64_t trim, int64_t k);
// tau <= 0: CenteredClipTau(rows), from the same coordinate-wise median.
at::Tensor CenteredClip(const at::Tensor& rows, double tau, int64_t iterations);
// centered_clip's radius when outer.cclip_tau is 0: the median over rows i of |x_i - coordinate-wise median|.
double CenteredClipTau(const at::Tensor& rows);
// Compare-exchange pairs (a < b): after each, values[a] <= values[b]. Sorts any k finite values.
using SortingNetwork = std::vector<std::pair<int32_t, int32_t>>;
SortingNetwork MakeSortingNetwork(int64_t k);
void SortWithNetwork(const SortingNetwork& network, double* values);

}  // namespace diloco
