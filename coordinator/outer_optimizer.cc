#include "coordinator/outer_optimizer.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

namespace diloco {

OuterOptimizer::Kind OuterOptimizer::KindFromName(const std::string& name) {
  Kind kind;
  if (EnumFromName(name, &kind)) return kind;
  throw std::invalid_argument("unknown outer optimizer '" + name + "'");
}

OuterOptimizer::OuterOptimizer(Kind kind, double lr, double momentum) : kind_(kind), lr_(lr), momentum_(momentum) {}

namespace {
// candidates[i] if it exists, nobody else holds it and it has the right shape and device; else a new tensor like
// `like`.
// (Takes the list and an index rather than a tensor: any copy of the handle would raise its use_count.)
at::Tensor Reuse(const std::vector<at::Tensor>& candidates, size_t i, const at::Tensor& like) {
  if (i < candidates.size()) {
    const at::Tensor& c = candidates[i];
    if (c.defined() && c.use_count() == 1 && c.sizes() == like.sizes() && c.scalar_type() == like.scalar_type() &&
        c.device() == like.device()) {
      return c;
    }
  }
  return at::empty_like(like);
}
// Branch-free loops over non-aliasing arrays, so the compiler vectorizes them.
template <bool kHasOldBuffer, bool kNesterov>
void MomentumKernel(const float* __restrict pt, const float* __restrict pd, const float* __restrict pb_old,
                    float* __restrict pb, float* __restrict po, float mu, float minus_lr, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) {
    const float b = kHasOldBuffer ? mu * pb_old[j] + pd[j] : pd[j];
    pb[j] = b;
    const float update = kNesterov ? pd[j] + mu * b : b;
    po[j] = pt[j] + minus_lr * update;
  }
}

void PlainKernel(const float* __restrict pt, const float* __restrict pd, float* __restrict po, float minus_lr,
                 int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) po[j] = pt[j] + minus_lr * pd[j];
}

// StepInPlace's loops: the same operations as MomentumKernel and PlainKernel, written over theta and the buffer.
// The first step (kFirst: PyTorch's buf = clone(delta)) is handed buffers of finite non-negative values (Reserve's,
// or zeros) and computes b = delta - 0 * buf, which is delta exactly (0 * buf = +0, and -0 - +0 = -0): reading the
// buffer it is about to write made round 1's step as fast as later ones (0.07 s against 0.10 s at 155.5M parameters,
// scripts/bench/comm ingest), where writing without reading took longer on this machine.
template <bool kFirst, bool kNesterov>
void InPlaceMomentumKernel(float* __restrict pt, const float* __restrict pd, float* __restrict pb, float mu,
                           float minus_lr, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) {
    const float b = kFirst ? pd[j] - 0.0f * pb[j] : mu * pb[j] + pd[j];
    pb[j] = b;
    const float update = kNesterov ? pd[j] + mu * b : b;
    pt[j] = pt[j] + minus_lr * update;
  }
}

void InPlacePlainKernel(float* __restrict pt, const float* __restrict pd, float minus_lr, int64_t begin, int64_t end) {
  for (int64_t j = begin; j < end; ++j) pt[j] = pt[j] + minus_lr * pd[j];
}

// The non-finite guard (outer_step.h NonFiniteStep): whether InPlaceMomentumKernel / InPlacePlainKernel would write
// only finite values, computed by the same operations in the same order (so the prediction is exact) without writing
// anything: one more read pass over theta, delta and the buffer, and no extra memory. kHasBuffer false: the first
// step, whose b is delta exactly.
inline uint32_t NotFiniteBit(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);  // all exponent bits set: Inf or NaN
}

template <bool kHasBuffer, bool kNesterov>
bool InPlaceResultFinite(const float* __restrict pt, const float* __restrict pd, const float* __restrict pb, float mu,
                         float minus_lr, int64_t begin, int64_t end) {
  uint32_t bad = 0;
  for (int64_t j = begin; j < end; ++j) {
    const float b = kHasBuffer ? mu * pb[j] + pd[j] : pd[j];
    const float update = kNesterov ? pd[j] + mu * b : b;
    bad |= NotFiniteBit(b) | NotFiniteBit(pt[j] + minus_lr * update);
  }
  return bad == 0;
}

bool PlainResultFinite(const float* __restrict pt, const float* __restrict pd, float minus_lr, int64_t begin,
                       int64_t end) {
  uint32_t bad = 0;
  for (int64_t j = begin; j < end; ++j) bad |= NotFiniteBit(pt[j] + minus_lr * pd[j]);
  return bad == 0;
}

// Whether every value of a contiguous float32 tensor is finite.
bool TensorFinite(const at::Tensor& t) {
  const float* p = t.data_ptr<float>();
  std::atomic<bool> finite{true};
  at::parallel_for(0, t.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
    uint32_t bad = 0;
    for (int64_t j = begin; j < end; ++j) bad |= NotFiniteBit(p[j]);
    if (bad != 0) finite = false;
  });
  return finite;
}

// Which of `count` positions a step updates: `only`'s (one fragment), or all when null.
std::vector<char> StepMask(size_t count, const std::vector<size_t>* only) {
  std::vector<char> stepped(count, only == nullptr ? 1 : 0);
  if (only != nullptr) {
    for (size_t i : *only) stepped.at(i) = 1;
  }
  return stepped;
}

// The kernels read and write through host pointers: a tensor elsewhere (a GPU's, a meta tensor) would be read as
// host memory. Throws std::invalid_argument naming the tensor and its device instead.
void CheckOnCpu(const char* where, const char* what, size_t i, const at::Tensor& t) {
  if (t.defined() && !t.device().is_cpu()) {
    throw std::invalid_argument(std::string(where) + ": " + what + " tensor " + std::to_string(i) + " is on " +
                                t.device().str() + "; the outer step runs on the CPU (copy it there first)");
  }
}

// The checks of stepped tensor i before anything is written: float32 of matching shapes (theta contiguous too when
// `in_place`), every tensor on the CPU (`momentum`: its buffer, or null when there is none yet).
void CheckStepTensors(const char* where, size_t i, const at::Tensor& theta, const at::Tensor& delta,
                      const at::Tensor* momentum, bool in_place) {
  if (theta.scalar_type() != at::kFloat || delta.scalar_type() != at::kFloat || theta.sizes() != delta.sizes() ||
      (in_place && !theta.is_contiguous())) {
    throw std::invalid_argument(std::string(where) + ": tensors must be float32 of matching shapes");
  }
  CheckOnCpu(where, "theta", i, theta);
  CheckOnCpu(where, "delta", i, delta);
  if (momentum != nullptr) CheckOnCpu(where, "momentum", i, *momentum);
}

bool SameShape(const std::vector<at::Tensor>& tensors, size_t i, const at::Tensor& like) {
  return i < tensors.size() && tensors[i].defined() && tensors[i].sizes() == like.sizes() &&
         tensors[i].scalar_type() == like.scalar_type() && tensors[i].device() == like.device() &&
         tensors[i].is_contiguous();
}

}  // namespace

std::vector<at::Tensor> OuterOptimizer::Step(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& delta,
                                             std::vector<at::Tensor> recycle, const std::vector<size_t>* only) {
  if (theta.size() != delta.size()) throw std::invalid_argument("OuterOptimizer::Step: tensor counts differ");
  if (!buffers_.empty() && buffers_.size() != theta.size()) {
    throw std::invalid_argument("OuterOptimizer::Step: momentum buffer count differs from the parameter count");
  }
  const bool first = buffers_.empty();
  const bool momentum = momentum_ != 0;
  const std::vector<char> stepped = StepMask(theta.size(), only);
  const bool nesterov = kind_ == Kind::kNesterov;
  // PyTorch applies the scalars as float for float32 tensors.
  const float mu = static_cast<float>(momentum_);
  const float minus_lr = static_cast<float>(-lr_);
  std::vector<at::Tensor> next(theta.size()), next_buffers(momentum ? theta.size() : 0);
  for (size_t i = 0; i < theta.size(); ++i) {
    if (!stepped[i]) {  // another fragment's tensor: unchanged, and so is its momentum
      next[i] = theta[i];
      if (momentum) next_buffers[i] = first ? at::zeros_like(theta[i]) : buffers_[i];  // zeros act as "no buffer yet"
      continue;
    }
    CheckStepTensors("OuterOptimizer::Step", i, theta[i], delta[i], momentum && !first ? &buffers_[i] : nullptr,
                     /*in_place=*/false);
    const at::Tensor th = theta[i].contiguous(), d = delta[i].contiguous();
    // Written into reused memory: fresh 100 MB tensors every round would cost more in page faults than the math.
    at::Tensor out = Reuse(recycle, i, th);
    at::Tensor buf = momentum ? Reuse(spare_buffers_, i, th) : at::Tensor();
    const at::Tensor old_buf = momentum && !first ? buffers_[i].contiguous() : at::Tensor();
    const float* pt = th.data_ptr<float>();
    const float* pd = d.data_ptr<float>();
    const float* pb_old = old_buf.defined() ? old_buf.data_ptr<float>() : nullptr;
    float* pb = buf.defined() ? buf.data_ptr<float>() : nullptr;
    float* po = out.data_ptr<float>();
    // One pass: read theta, delta, buf; write buf', theta' (the floor: 5 x 4 bytes x params). The operations of
    // torch.optim.SGD, in its order: buf.mul_(mu).add_(delta); update = delta.add(buf, alpha=mu) (nesterov) or buf;
    // theta.add_(update, alpha=-lr). Compiled with -ffp-contract=off, each product and sum is rounded on its own;
    // results agree with PyTorch to within an ulp (its vectorized kernels may fuse a multiply-add).
    at::parallel_for(0, th.numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      if (pb == nullptr) {
        PlainKernel(pt, pd, po, minus_lr, begin, end);
      } else if (pb_old == nullptr) {
        nesterov ? MomentumKernel<false, true>(pt, pd, pb_old, pb, po, mu, minus_lr, begin, end)
                 : MomentumKernel<false, false>(pt, pd, pb_old, pb, po, mu, minus_lr, begin, end);
      } else {
        nesterov ? MomentumKernel<true, true>(pt, pd, pb_old, pb, po, mu, minus_lr, begin, end)
                 : MomentumKernel<true, false>(pt, pd, pb_old, pb, po, mu, minus_lr, begin, end);
      }
    });
    next[i] = out;
    if (momentum) next_buffers[i] = buf;
  }
  for (size_t i = 0; i < theta.size(); ++i) {  // the guard, before the momentum is committed
    if (stepped[i] && (!TensorFinite(next[i]) || (momentum && !TensorFinite(next_buffers[i])))) {
      throw NonFiniteStep("the outer step's result (theta or momentum) of tensor " + std::to_string(i) +
                          " would not be finite; nothing committed");
    }
  }
  if (momentum) {
    spare_buffers_ = std::move(buffers_);  // reused next step unless someone (a checkpoint) still holds them
    buffers_ = std::move(next_buffers);
  }
  return next;
}

void OuterOptimizer::RestoreState(OuterStepState state) {
  std::vector<at::Tensor> stepped = std::move(buffers_);
  buffers_ = std::move(state.buffers.at(0));
  if (buffers_.empty()) {  // the undone step was the first: its buffers were the spares
    for (at::Tensor& b : stepped) b.abs_();
    spare_buffers_ = std::move(stepped);
  } else if (!stepped.empty() && !stepped[0].is_same(buffers_[0])) {  // Step(): the new buffers can be reused
    spare_buffers_ = std::move(stepped);
  }
}

void OuterOptimizer::Reserve(const std::vector<at::Tensor>& theta) {
  if (momentum_ == 0 || !buffers_.empty()) return;
  spare_buffers_.clear();
  // Written (the pages are faulted in), and not with zeros: with zero-filled buffers the 1B eval row of
  // `scripts/bench/comm big 3` had round 1's step at 2.57x and 2.64x its median in two runs (1.17-1.47x in others);
  // with page-distinct values it was 1.00x. The cause is not established (a guess: the VM's host merges identical pages
  // and splits them again on the first write). The first step reads them only as 0 * value.
  for (const at::Tensor& t : theta) spare_buffers_.push_back(at::arange(t.numel(), at::kFloat).view(t.sizes()));
}

void OuterOptimizer::StepInPlace(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& delta,
                                 const std::vector<size_t>* only) {
  if (theta.size() != delta.size()) throw std::invalid_argument("OuterOptimizer::StepInPlace: tensor counts differ");
  const bool momentum = momentum_ != 0;
  const bool first = buffers_.empty();
  if (momentum && !first && buffers_.size() != theta.size()) {
    throw std::invalid_argument("OuterOptimizer::StepInPlace: momentum buffer count differs from the parameter count");
  }
  const std::vector<char> stepped = StepMask(theta.size(), only);
  // Every check before the first write: a refusal leaves theta and the momentum as they were.
  for (size_t i = 0; i < theta.size(); ++i) {
    if (!stepped[i]) continue;
    CheckStepTensors("OuterOptimizer::StepInPlace", i, theta[i], delta[i], momentum && !first ? &buffers_[i] : nullptr,
                     /*in_place=*/true);
    if (momentum && !first && !SameShape(buffers_, i, theta[i])) {
      throw std::invalid_argument("OuterOptimizer::StepInPlace: a momentum buffer's shape differs from its parameter");
    }
  }
  CheckInPlaceFinite(theta, delta, stepped);  // the guard: throws NonFiniteStep before anything is written
  // Reserve's buffers, else new zeroed ones (the first step's kernel reads them: finite and >= 0). With no momentum
  // yet, the spares can only be Reserve's: Step() leaves a momentum behind, and set_momentum_buffers clears them.
  if (momentum && first) {
    std::vector<at::Tensor> buffers(theta.size());
    for (size_t i = 0; i < theta.size(); ++i) {
      buffers[i] = SameShape(spare_buffers_, i, theta[i]) ? spare_buffers_[i] : at::zeros_like(theta[i]);
      if (!stepped[i]) buffers[i].zero_();  // another fragment's tensor: no momentum yet
    }
    buffers_ = std::move(buffers);
    spare_buffers_.clear();
  }
  const bool nesterov = kind_ == Kind::kNesterov;
  const float mu = static_cast<float>(momentum_);
  const float minus_lr = static_cast<float>(-lr_);
  for (size_t i = 0; i < theta.size(); ++i) {
    if (!stepped[i]) continue;
    const at::Tensor d = delta[i].contiguous();
    float* pt = theta[i].data_ptr<float>();
    const float* pd = d.data_ptr<float>();
    float* pb = momentum ? buffers_[i].data_ptr<float>() : nullptr;
    at::parallel_for(0, theta[i].numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      if (pb == nullptr) {
        InPlacePlainKernel(pt, pd, minus_lr, begin, end);
      } else if (first) {
        nesterov ? InPlaceMomentumKernel<true, true>(pt, pd, pb, mu, minus_lr, begin, end)
                 : InPlaceMomentumKernel<true, false>(pt, pd, pb, mu, minus_lr, begin, end);
      } else {
        nesterov ? InPlaceMomentumKernel<false, true>(pt, pd, pb, mu, minus_lr, begin, end)
                 : InPlaceMomentumKernel<false, false>(pt, pd, pb, mu, minus_lr, begin, end);
      }
    });
  }
}

}  // namespace diloco

namespace diloco {

void OuterOptimizer::CheckInPlaceFinite(const std::vector<at::Tensor>& theta, const std::vector<at::Tensor>& delta,
                                        const std::vector<char>& stepped) const {
  const bool momentum = momentum_ != 0;
  const bool has_buffer = momentum && !buffers_.empty();
  const bool nesterov = kind_ == Kind::kNesterov;
  const float mu = static_cast<float>(momentum_);
  const float minus_lr = static_cast<float>(-lr_);
  for (size_t i = 0; i < theta.size(); ++i) {
    if (!stepped[i]) continue;
    const at::Tensor d = delta[i].contiguous();
    const float* pt = theta[i].data_ptr<float>();
    const float* pd = d.data_ptr<float>();
    const float* pb = has_buffer ? buffers_[i].data_ptr<float>() : nullptr;
    std::atomic<bool> finite{true};
    at::parallel_for(0, theta[i].numel(), 1 << 15, [&](int64_t begin, int64_t end) {
      bool ok;
      if (!momentum) {
        ok = PlainResultFinite(pt, pd, minus_lr, begin, end);
      } else if (!has_buffer) {
        ok = nesterov ? InPlaceResultFinite<false, true>(pt, pd, pb, mu, minus_lr, begin, end)
                      : InPlaceResultFinite<false, false>(pt, pd, pb, mu, minus_lr, begin, end);
      } else {
        ok = nesterov ? InPlaceResultFinite<true, true>(pt, pd, pb, mu, minus_lr, begin, end)
                      : InPlaceResultFinite<true, false>(pt, pd, pb, mu, minus_lr, begin, end);
      }
      if (!ok) finite = false;
    });
    if (!finite) {
      throw NonFiniteStep("the outer step's result (theta or momentum) of tensor " + std::to_string(i) +
                          " would not be finite; nothing written");
    }
  }
}

}  // namespace diloco
