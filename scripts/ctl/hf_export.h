// The Hugging Face directory `diloco-ctl export --format hf` writes (export.h checks the checkpoint first):
//   config.json (config/hf_model_config.h), generation_config.json (bos/eos ids),
//   model.safetensors, or, above max_shard_size bytes, model-0000i-of-0000N.safetensors shards plus
//   model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: shard}}) as save_pretrained does,
//   tokenizer.model (the run's SentencePiece model) or tokenizer.json (the run's tokenizer.json) when the run has one.
// Tensor names: llama and gpt2 register Hugging Face's own names, so they are written as they are (a tied head has no
// lm_head.weight, as in Hugging Face's files). Our gpt becomes a GPT2LMHeadModel: names mapped (HfTensorName) and
// nn.Linear weights [out, in] transposed to GPT-2's Conv1D [in, out].
// Stateless; thread-safe for distinct output directories.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "proto/named_tensors.h"

namespace diloco {

struct HfExportOptions {
  std::string out;                            // the directory (created)
  std::string dtype = "fp32";                 // fp32 | bf16
  int64_t max_shard_size = int64_t{2} << 30;  // bytes of tensor data per shard file
  // A SentencePiece model (copied as tokenizer.model) or tokenizer.json (as is), with the tokenizer_config.json,
  // special_tokens_map.json, chat_template.jinja / .json (and beside a tokenizer.model, tokenizer.json) of its
  // directory; "" = none.
  std::string tokenizer;
};

struct HfExportResult {
  std::vector<std::string> files;  // every file written, in order
  int64_t total_size = 0;          // bytes of tensor data
};

// Our parameter `name` of arch `arch` -> (its Hugging Face name, whether its values are transposed).
// gpt: "tok_emb.weight" -> "transformer.wte.weight", "blocks.3.qkv.weight" -> ("transformer.h.3.attn.c_attn.weight",
// true), ...; gpt2 and llama: unchanged. InvalidArgument for a gpt name outside the table.
absl::StatusOr<std::pair<std::string, bool>> HfTensorName(ModelArch arch, const std::string& name);

// Writes the directory for `model` with float32 parameters `params` (checked by the caller), stored as
// options.dtype (fp32: F32; bf16: BF16, rounded to nearest even, config.json's dtype "bfloat16").
absl::StatusOr<HfExportResult> WriteHfDirectory(const HfExportOptions& options, const ModelConfig& model,
                                                const NamedTensors& params);

}  // namespace diloco
