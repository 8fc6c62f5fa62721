#include "worker/lm/init_from.h"

#include <filesystem>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"

// INTEGRATION(arch branch): worker/lm/hf_weights.h provides LoadHfWeights(dir), the safetensors reader of a
// Hugging Face directory (single file or sharded index) returning absl::StatusOr of named tensors (a vector of
// (name, tensor) pairs or a map) in their stored dtype. Until that branch is merged, Hugging Face directories are
// refused with a clear line.
#if __has_include("worker/lm/hf_weights.h")
#include "worker/lm/hf_weights.h"
#define DILOCO_HAVE_HF_WEIGHTS 1
#endif

namespace diloco {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

std::string Shape(at::IntArrayRef shape) { return absl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

absl::Status FromCheckpoint(const std::string& path, Named& theta_0, std::string* source) {
  const std::string fingerprint = Fingerprint(SpecsOf(theta_0));
  auto ckpt = LoadCheckpoint(path);
  if (!ckpt.ok()) return absl::Status(ckpt.status().code(), absl::StrCat("model.init_from: ", ckpt.status().message()));
  if (ckpt->fingerprint != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("model.init_from ", path, ": fingerprint ", ckpt->fingerprint,
                                                      " does not match model: (", fingerprint,
                                                      "); use a checkpoint of the same model"));
  }
  theta_0 = std::move(ckpt->params);
  if (source != nullptr) *source = absl::StrCat(path, " (a round-", ckpt->round, " checkpoint)");
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyHfWeights(const std::string& dir, const std::unordered_map<std::string, at::Tensor>& stored,
                           Named& theta_0) {
  for (auto& [name, param] : theta_0) {
    auto it = stored.find(name);
    if (it == stored.end()) {
      return absl::NotFoundError(absl::StrCat("model.init_from ", dir, ": tensor '", name, "' ", Shape(param.sizes()),
                                              " is missing from the checkpoint's safetensors"));
    }
    const at::Tensor& t = it->second;
    if (t.sizes() != param.sizes()) {
      return absl::FailedPreconditionError(absl::StrCat("model.init_from ", dir, ": tensor '", name, "' is ",
                                                        Shape(t.sizes()), " in the checkpoint, the model wants ",
                                                        Shape(param.sizes()), " (config.json and weights disagree)"));
    }
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kBFloat16 && t.scalar_type() != at::kHalf) {
      return absl::InvalidArgumentError(absl::StrCat("model.init_from ", dir, ": tensor '", name, "' has dtype ",
                                                     at::toString(t.scalar_type()), " (fp32, bf16 or fp16 expected)"));
    }
    param = t.to(at::kFloat).contiguous().clone();
  }
  return absl::OkStatus();
}

absl::Status LoadInitFrom(const ModelConfig& model, Named& theta_0, std::string* source) {
  const std::string& path = model.init_from;
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return FromCheckpoint(path, theta_0, source);
#ifdef DILOCO_HAVE_HF_WEIGHTS
  auto weights = LoadHfWeights(path);
  if (!weights.ok()) {
    return absl::Status(weights.status().code(), absl::StrCat("model.init_from: ", weights.status().message()));
  }
  std::unordered_map<std::string, at::Tensor> stored;
  for (auto& [name, t] : *weights) stored.emplace(name, t);
  if (absl::Status s = CopyHfWeights(path, stored, theta_0); !s.ok()) return s;
  if (source != nullptr)
    *source = absl::StrCat(path, " (Hugging Face ", EnumName(model.arch), ", ", stored.size(), " stored tensors)");
  return absl::OkStatus();
#else
  return absl::UnimplementedError(absl::StrCat("model.init_from ", path, ": reading Hugging Face weights needs ",
                                               "worker/lm/hf_weights.h (not in this build)"));
#endif
}

}  // namespace diloco
