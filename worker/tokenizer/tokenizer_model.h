// The SentencePiece model of a tokenizer run: trained on the spot (the default) or an existing one used as given.
// A trained model is BPE over the first train_mb MB of the training split (copied to a temp file, jsonl reduced to
// its documents), with unk=0, bos=1, eos=2 and the user symbol "<nl>" for '\n' (SentencePiece drops '\n' itself),
// trained on `threads` threads. Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/tokenizer/input_plan.h"

namespace diloco::tokenize {

constexpr const char* kNewlineSymbol = "<nl>";

// Trains <dir>/tokenizer.model; an error message on failure.
std::string TrainTokenizer(const std::string& dir, const std::vector<InputRange>& train, InputFormat format,
                           const std::string& jsonl_field, uint64_t train_mb, int vocab_size, int threads);

}  // namespace diloco::tokenize
