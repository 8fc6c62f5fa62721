// SlicePlan: the cut of one flat buffer of N elements (a model's parameters, flattened in parameter order and laid
// end to end) into the n contiguous slices of a sharded worker cluster (workers.sharding): rank r owns slice r, keeps
// the optimizer state of those elements, pushes that part of the pseudo-gradient and pulls that part of theta.
// Every slice has the same length S = ceil(N / (n * align)) * align elements (align: the wire's chunk length in
// elements, so a slice boundary never splits a chunk); slice r covers [r * S, min((r + 1) * S, N)), so the last
// slices may be shorter or empty, and collectives that need equal pieces work on a buffer padded to n * S elements
// (padding: at most n * align - 1 elements). Pure arithmetic; immutable once made, thread-safe.
#pragma once

#include <cstdint>

namespace diloco {

struct FlatRange {
  int64_t begin = 0;  // first element
  int64_t end = 0;    // one past the last element (== begin: empty)
  int64_t size() const { return end - begin; }
  bool operator==(const FlatRange& other) const { return begin == other.begin && end == other.end; }
};

class SlicePlan {
 public:
  // numel >= 0, parts >= 1, align >= 1 (std::invalid_argument otherwise).
  SlicePlan(int64_t numel, int parts, int64_t align);

  int64_t numel() const { return numel_; }
  int parts() const { return parts_; }
  int64_t slice_length() const { return slice_length_; }           // S, padding included
  int64_t padded_numel() const { return slice_length_ * parts_; }  // n * S
  // Slice r's elements of the unpadded buffer (std::out_of_range for r outside [0, parts)).
  FlatRange slice(int rank) const;

 private:
  int64_t numel_;
  int parts_;
  int64_t slice_length_;
};

}  // namespace diloco
