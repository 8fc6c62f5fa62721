// The `encode` / `decode` / `digest` subcommands of diloco-tokenize, which `diloco-ctl generate` calls because it
// cannot load SentencePiece itself (docs/development.md, "Platform hazards"):
//   diloco-tokenize encode --model M --text TEXT   prints TEXT's token ids, space-separated, on one line
//     [--add-special-tokens]                       with the special tokens transformers' tokenizer(TEXT) adds
//                                                  (TextTokenizer::EncodeWithSpecialTokens)
//   diloco-tokenize decode --model M --ids "1 2 3" prints the text of the ids (no newline added)
//   diloco-tokenize digest --model M               prints M's vocabulary digest (text_tokenizer.h VocabDigest), which
//                                                  the coordinator and workers compare at Join
// M is a SentencePiece model or a tokenizer.json (text_tokenizer.h). A SentencePiece model with a newline id ("<nl>"
// in one this tool trained, "<0x0A>" in a byte-fallback one) encodes '\n' as it, as the shards do; a tokenizer.json
// prints exactly the tokenizers library's encode(text, add_special_tokens=False).ids. No BOS/EOS is added unless
// --add-special-tokens.
// Stateless; thread-safe.
#pragma once

#include <string>

namespace diloco::tokenize {

// Runs one subcommand, printing to stdout; returns the process exit code (0). Throws TokenizeError (tokenize_error.h)
// when the model cannot be loaded or the input is not valid.
int RunCodec(bool encode, const std::string& model_path, const std::string& input, bool add_special_tokens);
// The digest subcommand: prints the model's vocabulary digest on one line; returns 0 or throws TokenizeError.
int RunDigest(const std::string& model_path);

}  // namespace diloco::tokenize
