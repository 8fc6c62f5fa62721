#include "worker/error_feedback.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "proto/tensor_chunks.h"

namespace diloco {
namespace {

// Splits a flat residual along delta's tensors; empty when the sizes differ.
std::vector<torch::Tensor> Split(const torch::Tensor& flat, const NamedTensors& delta) {
  int64_t total = 0;
  for (const auto& [name, d] : delta) total += d.numel();
  if (flat.numel() != total) {
    spdlog::warn("error feedback: the saved residual has {} values, the pseudo-gradient {}; starting from zero",
                 flat.numel(), total);
    return {};
  }
  std::vector<torch::Tensor> out;
  int64_t offset = 0;
  for (const auto& [name, d] : delta) {
    out.push_back(flat.narrow(0, offset, d.numel()).view_as(d).to(d.device()).clone());
    offset += d.numel();
  }
  return out;
}

}  // namespace

void ErrorFeedback::Compensate(NamedTensors& delta, Sent* sent) {
  Settle(true);           // a push never settled (the worker went on without telling): its residual stands
  previous_ = residual_;  // the tensors themselves: each residual_[i] below is a new tensor
  previous_pending_ = pending_;
  unsettled_ = true;
  if (residual_.empty() && pending_.defined()) residual_ = Split(pending_, delta);
  pending_ = torch::Tensor();
  if (residual_.empty()) {
    for (const auto& [name, d] : delta) residual_.push_back(torch::zeros_like(d));
  }
  const int64_t chunk_bytes = std::max(chunk_bytes_, kMinChunkBytes);
  for (size_t i = 0; i < delta.size(); ++i) {
    // beta * residual, then + delta: the order of tests/golden/topk_reference.py (two float32 roundings).
    torch::Tensor compensated =
        (beta_ == 1.0 ? delta[i].second + residual_[i] : delta[i].second + residual_[i].mul(beta_)).contiguous();
    torch::Tensor flat = compensated.view({-1});
    torch::Tensor sent_values = codec_ == CODEC_TOPK
                                    ? EncodeTopkChunks(delta[i].first, compensated, chunk_bytes, sent).to(flat.device())
                                    : RoundTrip(flat, codec_, ChunkElements(codec_, chunk_bytes, sizeof(float)));
    if (sent != nullptr && codec_ != CODEC_TOPK) {
      sent->squared_norm += sent_values.to(torch::kDouble).square().sum().item<double>();
    }
    residual_[i] = compensated - sent_values.view_as(compensated);
    delta[i].second = compensated;
  }
}

void ErrorFeedback::Settle(bool counted) {
  if (!unsettled_) return;
  unsettled_ = false;
  if (!counted) {
    residual_ = std::move(previous_);
    pending_ = std::move(previous_pending_);
  }
  previous_.clear();
  previous_pending_ = torch::Tensor();
}

torch::Tensor ErrorFeedback::EncodeTopkChunks(const std::string& name, const torch::Tensor& compensated,
                                              int64_t chunk_bytes, Sent* sent) const {
  // The wire chunks exactly as the client's TensorChunker cuts and encodes them (proto/tensor_chunks.cc), decoded
  // as the coordinator decodes them: one encode per round.
  const torch::Tensor flat = compensated.cpu().contiguous().view({-1});
  const int64_t elements = TopkChunkElements(chunk_bytes, topk_);
  torch::Tensor out = torch::zeros_like(flat);
  TensorChunk chunk;
  for (int64_t offset = 0; offset < flat.numel(); offset += elements) {
    const int64_t count = std::min(elements, flat.numel() - offset);
    chunk.Clear();
    chunk.set_name(name);
    chunk.set_dtype(FLOAT32);
    for (int64_t d : compensated.sizes()) chunk.add_shape(d);
    chunk.set_offset(offset);
    chunk.set_count(count);
    EncodeTopk(flat.narrow(0, offset, count), topk_, &chunk);
    const SparseChunk kept = DecodeTopk(chunk).value();
    out.narrow(0, offset, count).index_put_({kept.index}, kept.values);
    if (sent != nullptr) {
      sent->squared_norm += kept.values.to(torch::kDouble).square().sum().item<double>();
      sent->chunks.push_back(chunk);
    }
  }
  return out;
}

torch::Tensor ErrorFeedback::Flat() const {
  if (residual_.empty()) return pending_;
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& r : residual_) flat.push_back(r.reshape({-1}).cpu());
  return torch::cat(flat);
}

}  // namespace diloco
