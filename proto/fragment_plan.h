// Fragments of Streaming DiLoCo (arXiv 2501.18512, "strided" pattern): the model's parameters split into P groups
// that sync at different inner steps. Layer i belongs to fragment i mod P, where a name's layer index is its first
// dot-separated component that is an integer ("blocks.3.ln1.weight" for gpt, "model.layers.3.mlp.up_proj.weight" for
// llama, "transformer.h.3.attn.c_attn.bias" for gpt2 -> 3). The tensors before the first layer (token and position
// embeddings, which may also serve as the tied output head) belong to fragment 0, and those after the last layer (the
// final norm, an untied lm_head) to fragment P - 1. With P = 1 everything is fragment 0.
// Pure functions over parameter names (in the model's parameter order); thread-safe. FragmentPlan is the one place the
// coordinator, the worker and a cluster's followers compute the split from (immutable once made; safe to share).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace diloco {

// The fragment of each name, in the order given (the model's parameter order).
std::vector<int> AssignFragments(const std::vector<std::string>& names, int64_t fragments);

// Positions (into `names`) of the tensors of each fragment, in parameter order: result[p] lists fragment p's.
std::vector<std::vector<size_t>> FragmentMembers(const std::vector<int>& assignment, int64_t fragments);

// The split of one model's parameters (in parameter order) into comm.fragments fragments.
class FragmentPlan {
 public:
  FragmentPlan() = default;
  FragmentPlan(const std::vector<std::string>& names, int64_t fragments);

  int fragments() const { return static_cast<int>(members_.size()); }
  // Positions (into the parameter list) of fragment f's tensors, in parameter order.
  const std::vector<size_t>& members(int f) const { return members_.at(static_cast<size_t>(f)); }
  // The fragment that round `round` (0-based: the round whose result becomes theta_{round+1}) syncs.
  int FragmentOfRound(int64_t round) const { return static_cast<int>(round % fragments()); }

 private:
  std::vector<std::vector<size_t>> members_;
};

}  // namespace diloco
