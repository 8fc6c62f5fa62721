// ExportCheckpoint: `diloco-ctl export`. Turns a coordinator checkpoint (theta_t of a run) into files that other
// tools load: the parameters as safetensors (float32, the checkpoint's names, e.g. "blocks.0.qkv.weight" [3D, D]) and
// a JSON file next to it with the model config (vocab_size, seq_len, n_layer, n_head, d_model and the fixed
// architecture facts), the round, the fingerprint and, when the run's token cache has one, the tokenizer
// (SentencePiece model or tokenizer.json, copied next to the export).
//
// The checkpoint does not store model:, so the run's YAML config supplies it. The export is refused unless the model
// that config builds (worker/lm/language_model.h) has exactly the checkpoint's fingerprint (tensor names, shapes and
// dtypes). The fingerprint cannot see model.n_head (it changes no shape): the config's value is taken as given.
//
// --format hf writes a Hugging Face model directory instead (scripts/ctl/hf_export.h) that
// transformers.AutoModelForCausalLM.from_pretrained loads.
//
// Unlike ctl's other commands this one works offline and uses the coordinator's checkpoint reader and the worker's
// model directly. Every file is written to a temp file and renamed into place. Stateless; thread-safe for distinct
// output paths.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace diloco {

struct ExportOptions {
  std::string checkpoint;              // a coordinator checkpoint (ckpt-NNNNNNNN.bin)
  std::string config;                  // the run's YAML file
  std::vector<std::string> overrides;  // --set section.key=value, as the other binaries take
  std::string format = "safetensors";  // safetensors (our names, one file + model JSON) | hf (a directory, hf_export.h)
  std::string out;                     // e.g. model.safetensors; with hf: the directory
  std::string dtype = "fp32";          // hf: fp32 | bf16
  int64_t max_shard_size = int64_t{2} << 30;  // hf: bytes of tensor data per safetensors shard
};

struct ExportResult {
  std::string weights_path;    // == options.out
  std::string config_path;     // the model JSON
  std::string tokenizer_path;  // the copied tokenizer (SentencePiece or tokenizer.json); empty when the run has none
  int64_t round = 0;
  int64_t parameters = 0;
  std::vector<std::string> files;  // hf: every file written
};

// "<dir>/<stem>.json" for "<dir>/<stem>.safetensors", else out + ".json".
std::string ModelJsonPath(const std::string& out);

// Errors name the flag, file or tensor at fault: NotFound (missing checkpoint or config), InvalidArgument (bad
// format or config), DataLoss (corrupt checkpoint), FailedPrecondition (checkpoint of another model, non-finite
// values), PermissionDenied/Internal (output not writable).
absl::StatusOr<ExportResult> ExportCheckpoint(const ExportOptions& options);

}  // namespace diloco
