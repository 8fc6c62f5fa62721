#include "proto/fragment_plan.h"

#include <algorithm>
#include <stdexcept>

namespace diloco {
namespace {

// The layer index of a name: its first dot-separated component made only of digits ("blocks.3.ln1.weight",
// "model.layers.3.mlp.up_proj.weight", "transformer.h.3.attn.c_attn.bias" -> 3), or -1 for a tensor outside the
// layers (embeddings, final norm, head).
int64_t LayerIndex(const std::string& name) {
  size_t begin = 0;
  while (begin <= name.size()) {
    size_t end = name.find('.', begin);
    if (end == std::string::npos) end = name.size();
    const bool digits =
        end > begin && end - begin <= 9 &&
        std::all_of(name.begin() + begin, name.begin() + end, [](char c) { return c >= '0' && c <= '9'; });
    if (digits) return std::stoll(name.substr(begin, end - begin));
    begin = end + 1;
  }
  return -1;
}

}  // namespace

std::vector<int> AssignFragments(const std::vector<std::string>& names, int64_t fragments) {
  if (fragments < 1) throw std::invalid_argument("AssignFragments: fragments must be >= 1");
  std::vector<int> out(names.size(), 0);
  bool after_layers = false;
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t layer = LayerIndex(names[i]);
    if (layer >= 0) {
      after_layers = true;
      out[i] = static_cast<int>(layer % fragments);
    } else {
      out[i] = after_layers ? static_cast<int>(fragments - 1) : 0;
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
