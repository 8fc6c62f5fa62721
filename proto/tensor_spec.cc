#include "proto/tensor_spec.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace diloco {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorSpec> SpecsOf(const NamedTensors& tensors) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    specs.push_back({name, t.sizes().vec(), t.scalar_type()});
  }
  return specs;
}

std::string Fingerprint(const std::vector<TensorSpec>& specs) {
  std::string text;
  for (const TensorSpec& s : specs) {
    absl::StrAppend(&text, s.name, ":", c10::toString(s.dtype), ":", absl::StrJoin(s.shape, "x"), ";");
  }
  const XXH64_hash_t h = XXH64(text.data(), text.size(), /*seed=*/0x44694c6f436fULL);
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

int64_t TotalElements(const std::vector<TensorSpec>& specs) {
  int64_t n = 0;
  for (const TensorSpec& s : specs) n += s.numel();
  return n;
}

absl::StatusOr<DType> ToWireDType(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return FLOAT32;
    case at::kHalf:
      return FLOAT16;
    case at::kBFloat16:
      return BFLOAT16;
    case at::kDouble:
      return FLOAT64;
    case at::kLong:
      return INT64;
    case at::kInt:
      return INT32;
    case at::kChar:
      return INT8;
    case at::kByte:
      return UINT8;
    default:
      return absl::InvalidArgumentError(absl::StrCat("dtype ", c10::toString(t), " cannot be sent"));
  }
}

absl::StatusOr<at::ScalarType> FromWireDType(DType d) {
  switch (d) {
    case FLOAT32:
      return at::kFloat;
    case FLOAT16:
      return at::kHalf;
    case BFLOAT16:
      return at::kBFloat16;
    case FLOAT64:
      return at::kDouble;
    case INT64:
      return at::kLong;
    case INT32:
      return at::kInt;
    case INT8:
      return at::kChar;
    case UINT8:
      return at::kByte;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown wire dtype ", static_cast<int>(d)));
  }
}

}  // namespace diloco
