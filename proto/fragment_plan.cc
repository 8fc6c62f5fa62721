#include "proto/fragment_plan.h"

#include <cstdlib>
#include <stdexcept>

namespace diloco {
namespace {

// The block index of "blocks.<i>.<...>", or -1 for a tensor outside the blocks.
int64_t BlockIndex(const std::string& name) {
  static const std::string kPrefix = "blocks.";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return -1;
  char* end = nullptr;
  const long long i = std::strtoll(name.c_str() + kPrefix.size(), &end, 10);
  if (end == name.c_str() + kPrefix.size() || *end != '.') return -1;
  return i;
}

}  // namespace

std::vector<int> AssignFragments(const std::vector<std::string>& names, int64_t fragments) {
  if (fragments < 1) throw std::invalid_argument("AssignFragments: fragments must be >= 1");
  std::vector<int> out(names.size(), 0);
  bool after_blocks = false;
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t block = BlockIndex(names[i]);
    if (block >= 0) {
      after_blocks = true;
      out[i] = static_cast<int>(block % fragments);
    } else {
      out[i] = after_blocks ? static_cast<int>(fragments - 1) : 0;
    }
  }
  return out;
}

std::vector<std::vector<size_t>> FragmentMembers(const std::vector<int>& assignment, int64_t fragments) {
  std::vector<std::vector<size_t>> out(static_cast<size_t>(fragments));
  for (size_t i = 0; i < assignment.size(); ++i) out.at(static_cast<size_t>(assignment[i])).push_back(i);
  return out;
}

FragmentPlan::FragmentPlan(const std::vector<std::string>& names, int64_t fragments)
    : members_(FragmentMembers(AssignFragments(names, fragments), fragments)) {}

}  // namespace diloco
