// The safetensors format (https://github.com/huggingface/safetensors), which PyTorch, JAX and Hugging Face tools load
// without running any code from the file: WriteSafetensors writes named F32 or BF16 tensors; ReadSafetensors reads
// F32, BF16 and F16 files (Hugging Face checkpoints) back as float32 tensors.
//
// Layout: uint64 little-endian N, then N bytes of JSON header
//   {"__metadata__": {string: string}, NAME: {"dtype": "F32"|"BF16", "shape": [...], "data_offsets": [begin, end]},
//   ...}
// padded with spaces so the data starts 8-byte aligned, then every tensor's raw little-endian bytes, back to back in
// the order given (offsets are relative to the start of the data; no gaps, nothing after the last tensor).
// The file is written to "<path>.tmp-<pid>", fsynced and renamed over `path` (then the directory is fsynced): readers
// see the old file or the complete new one, never a partial one.
// The caller owns the tensor memory; it must stay valid for the call. Stateless; thread-safe for distinct paths.
// The reader checks the whole header against the file (offsets inside the data, sizes matching dtype x shape) before
// it reads any tensor, and refuses headers over 100 MB (the format's own limit).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/named_tensors.h"

namespace diloco {

enum class SafetensorsDtype { kF32, kBF16 };  // what the writer writes ("F32", "BF16")

struct SafetensorsEntry {
  std::string name;            // unique, non-empty, not "__metadata__"
  std::vector<int64_t> shape;  // row-major; [] is a scalar
  const void* data = nullptr;  // product(shape) contiguous values of `dtype` (float32, or bfloat16 as uint16 bits)
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
};

// The JSON header text (before padding) for `tensors` and `metadata`; data_offsets as WriteSafetensors lays them out.
std::string SafetensorsHeader(const std::vector<SafetensorsEntry>& tensors,
                              const std::map<std::string, std::string>& metadata);

// InvalidArgument for a bad name or shape; PermissionDenied/DataLoss/Internal (naming the path) when the file cannot
// be written, flushed or renamed.
absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                              const std::map<std::string, std::string>& metadata);

// Writes `text` to `path` with the same temp file + fsync + rename protocol (used for the model's JSON next to it).
absl::Status WriteFileAtomically(const std::string& path, const std::string& text);

// The tensors of a safetensors file in header order, each converted to a contiguous float32 CPU tensor (the file's
// dtypes: F32, BF16, F16). Errors name the path and, where one is at fault, the tensor: NotFound (cannot open),
// DataLoss (truncated file, offsets out of range or not matching the shape), InvalidArgument (header over 100 MB,
// bad JSON, unknown dtype). With `metadata`, the header's __metadata__ strings are returned there too.
absl::StatusOr<NamedTensors> ReadSafetensors(const std::string& path,
                                             std::map<std::string, std::string>* metadata = nullptr);

}  // namespace diloco
