#include "worker/lm/init_from.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/hf_model_config.h"
#include "proto/checkpoint.h"
#include "proto/tensor_spec.h"
#include "worker/lm/hf_weights.h"

namespace diloco {
namespace {

absl::Status FromCheckpoint(const std::string& path, LanguageModel& model, std::string* source) {
  const std::string fingerprint = Fingerprint(SpecsOf(NamedParameters(model)));
  auto ckpt = LoadCheckpoint(path);
  if (!ckpt.ok()) return absl::Status(ckpt.status().code(), absl::StrCat("model.init_from: ", ckpt.status().message()));
  if (ckpt->fingerprint != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("model.init_from ", path, ": fingerprint ", ckpt->fingerprint,
                                                      " does not match model: (", fingerprint,
                                                      "); use a checkpoint of the same model"));
  }
  LoadParameters(model, ckpt->params);
  if (source != nullptr) *source = absl::StrCat(path, " (a round-", ckpt->round, " checkpoint)");
  return absl::OkStatus();
}

absl::Status FromHfDirectory(const std::string& dir, LanguageModel& model, std::string* source) {
  auto weights = LoadHfWeights(dir);
  if (!weights.ok()) {
    return absl::Status(weights.status().code(), absl::StrCat("model.init_from: ", weights.status().message()));
  }
  if (absl::Status s = CopyHfWeights(*weights, dir, model); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("model.init_from: ", s.message()));
  }
  if (source != nullptr) {
    *source = absl::StrCat(dir, " (Hugging Face ", std::string(EnumName(model.config().arch)), ", ", weights->size(),
                           " tensors)");
    if (auto hf = ReadHfModelConfig(dir); hf.ok() && !hf->not_applied.empty()) {
      absl::StrAppend(source, "; config.json's ", absl::StrJoin(hf->not_applied, ", "),
                      " not applied: training runs without dropout");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadInitFrom(const ModelConfig& config, LanguageModel& model, std::string* source) {
  std::error_code ec;
  if (std::filesystem::is_directory(config.init_from, ec)) return FromHfDirectory(config.init_from, model, source);
  return FromCheckpoint(config.init_from, model, source);
}

}  // namespace diloco
