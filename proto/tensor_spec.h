// TensorSpec: the name, shape and dtype of one model tensor, and the model fingerprint computed over a list of them.
//
// The fingerprint is xxHash64 over "name:dtype:d0xd1x...;" for every tensor in order, printed as 16 hex digits.
// Two processes agree on the fingerprint exactly when they would exchange tensors of the same layout.
// Pure functions; thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/diloco.pb.h"
#include "proto/named_tensors.h"

namespace diloco {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  int64_t numel() const;
};

// Specs of named tensors, in the order given.
std::vector<TensorSpec> SpecsOf(const NamedTensors& tensors);

std::string Fingerprint(const std::vector<TensorSpec>& specs);

int64_t TotalElements(const std::vector<TensorSpec>& specs);

// Wire dtype <-> LibTorch dtype. Unsupported dtypes are an InvalidArgument error.
absl::StatusOr<DType> ToWireDType(at::ScalarType t);
absl::StatusOr<at::ScalarType> FromWireDType(DType d);

}  // namespace diloco
