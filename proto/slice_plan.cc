#include "proto/slice_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace diloco {

SlicePlan::SlicePlan(int64_t numel, int parts, int64_t align) : numel_(numel), parts_(parts) {
  if (numel < 0 || parts < 1 || align < 1) {
    throw std::invalid_argument("SlicePlan: numel " + std::to_string(numel) + ", parts " + std::to_string(parts) +
                                ", align " + std::to_string(align) + " (need numel >= 0, parts >= 1, align >= 1)");
  }
  const int64_t unit = static_cast<int64_t>(parts) * align;
  slice_length_ = (numel + unit - 1) / unit * align;
}

FlatRange SlicePlan::slice(int rank) const {
  if (rank < 0 || rank >= parts_) {
    throw std::out_of_range("SlicePlan: slice " + std::to_string(rank) + " of " + std::to_string(parts_));
  }
  const int64_t begin = std::min(numel_, rank * slice_length_);
  return FlatRange{begin, std::min(numel_, begin + slice_length_)};
}

}  // namespace diloco
