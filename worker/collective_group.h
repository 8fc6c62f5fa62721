// CollectiveGroup: the collectives of one worker cluster's ranks, over one c10d backend: ProcessGroupGloo for ranks on
// the CPU, ProcessGroupNCCL for ranks on CUDA devices (tensors stay on the device, all-reduced in place). The two
// backends' C++ classes differ between LibTorch 1.13 and 2.x and NCCL exists only in the CUDA build, so WorkerCluster
// (worker/cluster.h) sees only this interface; collective_gloo.cc and collective_nccl.cc (CUDA builds) or
// collective_no_nccl.cc (CPU builds) make them. Every call blocks until the collective completed on this rank and
// throws on a dead peer or a timeout. Not thread-safe: one thread of each rank calls it, in the same order on all
// ranks.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace diloco {

class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  // The device the tensors of every call must be on (CPU for Gloo, the rank's GPU for NCCL).
  virtual torch::Device device() const = 0;
  // Sums each tensor over the ranks, in place (one coalesced collective for the whole list).
  virtual void AllReduceSum(std::vector<torch::Tensor>& tensors) = 0;
  // Rank 0's tensor overwrites the others', in place.
  virtual void Broadcast(torch::Tensor& tensor) = 0;
  // Sharded clusters (workers.sharding). `input`: n * S elements (n ranks), contiguous; `output`: S elements, which
  // may be piece r of `input` itself (this rank r's). ReduceScatterSum leaves in `output` piece r of the sum of the
  // ranks' inputs; `input`'s other elements are undefined afterwards.
  virtual void ReduceScatterSum(torch::Tensor& input, torch::Tensor& output) = 0;
  // `tensor` (contiguous) summed over the ranks into rank `root`'s, in place (the others' are undefined afterwards).
  // Gloo only (the bucketed gradients of worker/gradient_buckets.h); other backends throw std::logic_error.
  virtual void ReduceSum(torch::Tensor& tensor, int root) {
    (void)tensor;
    (void)root;
    throw std::logic_error("CollectiveGroup: ReduceSum is not implemented for this backend");
  }
  // Every rank's `input` (S elements; may be piece r of `output`) lands in piece r of `output` (n * S) on all ranks.
  virtual void AllGather(torch::Tensor& input, torch::Tensor& output) = 0;
  // Whether ReduceScatterSum is the backend's reduce-scatter ((n - 1) / n of the buffer sent per rank), or (Gloo in a
  // LibTorch without one, 1.13 and 2.x before pytorch#149869: known after the first ReduceScatterSum) an all-reduce
  // of the whole buffer whose piece is then taken (2 (n - 1) / n).
  virtual bool native_reduce_scatter() const = 0;
};

// Gloo over TCP; its connections bind to bind_host (this rank's own address).
std::unique_ptr<CollectiveGroup> MakeGlooGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                               std::chrono::milliseconds timeout, const std::string& bind_host);

// NCCL on `device` (a CUDA device of this rank). Throws std::runtime_error in a build without CUDA.
std::unique_ptr<CollectiveGroup> MakeNcclGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                               std::chrono::milliseconds timeout, const torch::Device& device);

}  // namespace diloco
