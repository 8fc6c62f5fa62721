// WriteSafetensors: writes named float32 tensors in the safetensors format
// (https://github.com/huggingface/safetensors), which PyTorch, JAX and Hugging Face tools load without running any
// code from the file.
//
// Layout: uint64 little-endian N, then N bytes of JSON header
//   {"__metadata__": {string: string}, NAME: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}
// padded with spaces so the data starts 8-byte aligned, then every tensor's raw little-endian bytes, back to back in
// the order given (offsets are relative to the start of the data; no gaps, nothing after the last tensor).
// The file is written to "<path>.tmp-<pid>", fsynced and renamed over `path` (then the directory is fsynced): readers
// see the old file or the complete new one, never a partial one.
// The caller owns the tensor memory; it must stay valid for the call. Stateless; thread-safe for distinct paths.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace diloco {

struct SafetensorsEntry {
  std::string name;             // unique, non-empty, not "__metadata__"
  std::vector<int64_t> shape;   // row-major; [] is a scalar
  const float* data = nullptr;  // product(shape) contiguous float32 values
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

}  // namespace diloco
