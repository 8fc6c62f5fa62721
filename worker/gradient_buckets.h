// GradientBuckets: ZeRO-2's gradient reduction during backward for a sharded cluster rank (workers.sharding
// gradients on the CPU, FlatShard::bucketed): no rank ever holds the whole gradient. The parameters (the inner
// optimizer's, in its flat order) are cut into buckets of about bucket_elements consecutive elements (whole tensors).
// A hook after each parameter's gradient accumulation (autograd's AccumulateGrad post hook, in LibTorch 1.13 and 2.x)
// copies the gradient into its bucket's staging buffer (made when the bucket's first gradient comes) and drops the
// parameter's .grad; once a bucket is complete, and every bucket after it in the flat order too (backward produces
// the last parameters first: the buckets are reduced last to first, the same order on every rank), each part of it
// that lies in rank r's slice is summed over the ranks onto rank r (CollectiveGroup::ReduceSum) and rank r copies
// its sum into the optimizer's gradient piece; then the staging buffer is freed. At most a few buckets and one
// parameter's gradient exist at a time. Flush, after backward, reduces what is left (a parameter that got no
// gradient counts as zeros) in the same order. Gradients accumulated over several backward passes (micro-batches)
// are not supported: ShardOf does not make a bucketed shard then.
// Not thread-safe: the hooks run on the thread that runs backward on the CPU, which is the training thread.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace diloco {

class CollectiveGroup;
class FlatAdamW;

class GradientBuckets {
 public:
  // `params`: the optimizer's parameters in its flat order (they must stay alive with their autograd state);
  // `optimizer`: bucketed (FlatShard::bucketed), slice `rank` of `size`. `collective_seconds` is added the time
  // spent in the reductions. Installs the hooks.
  GradientBuckets(CollectiveGroup& group, FlatAdamW& optimizer, std::vector<torch::Tensor> params,
                  int64_t bucket_elements, int rank, int size, double* collective_seconds);
  ~GradientBuckets();

  // After backward: reduces every bucket not reduced yet, last to first. The optimizer's gradient piece then holds
  // this rank's slice of the sum of the ranks' gradients (not yet divided by the ranks).
  void Flush();
  int buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // flat elements [begin, end)
    int params = 0;              // tensors in it
    int ready = 0;               // of them, whose gradient is in staging this backward
    torch::Tensor staging;       // [end - begin] float32; undefined when no gradient of it is held
  };
  void OnGradient(size_t i);  // parameter i's gradient was accumulated
  void Reduce(Bucket& bucket);
  void ReduceReady();  // the complete buckets from next_ down

  CollectiveGroup& group_;
  FlatAdamW& optimizer_;
  std::vector<torch::Tensor> params_;
  std::vector<int64_t> offset_;  // flat index of each parameter's first element
  std::vector<int> bucket_of_;   // each parameter's bucket
  std::vector<Bucket> buckets_;  // in flat order
  int next_ = -1;                // the next bucket to reduce (buckets_.size() - 1 down to 0)
  int rank_, size_;
  double* collective_seconds_;
  std::vector<std::shared_ptr<void>> accumulators_;  // keeps each parameter's AccumulateGrad (and its hook) alive
};

}  // namespace diloco
