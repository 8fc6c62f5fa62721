// diloco-tokenize: trains a SentencePiece BPE model on the training part of a text file (or takes an existing one,
// --tokenizer-model: data.tokenizer, e.g. a Llama checkpoint's tokenizer.model) and writes the token shards
// (train.tok, val.tok; format in worker/lm/token_shard.h) plus tokenizer.model and meta.json into --out.
//
// It runs as its own process and links nothing that loads protobuf or abseil: Debian's libsentencepiece carries its
// own protobuf-lite and crashes next to libprotobuf (DESIGN.md §5). The output directory appears atomically: the
// files are written to <out>.partial-<pid> and renamed at the end. Single-threaded.
//
// Two more modes serve `diloco-ctl generate`, which cannot load SentencePiece itself:
//   diloco-tokenize encode --model M --text TEXT   prints TEXT's token ids, space-separated, on one line
//   diloco-tokenize decode --model M --ids "1 2 3" prints the text of the ids (no newline added)
// A model with our newline symbol "<nl>" (one this tool trained) encodes '\n' as that symbol, as the shards do; any
// other SentencePiece model (e.g. a Llama checkpoint's tokenizer.model) encodes the text as it is.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "worker/lm/token_shard.h"

namespace {

constexpr const char* kNewlineSymbol = "<nl>";

int Fail(const std::string& message) {
  std::cerr << "diloco-tokenize: error: " << message << "\n";
  return 1;
}

// The id that stands for '\n' (SentencePiece drops '\n' itself): our "<nl>" symbol in a model this tool trained, the
// byte piece "<0x0A>" in a byte-fallback model (Llama's tokenizer.model), else -1 (lines are then joined as they are).
int NewlineId(const sentencepiece::SentencePieceProcessor& sp) {
  for (const char* piece : {kNewlineSymbol, "<0x0A>"}) {
    const int id = sp.PieceToId(piece);
    if (id != sp.unk_id()) return id;
  }
  return -1;
}

// Encodes text line by line, ending each line with the newline id (when the model has one).
bool Encode(const sentencepiece::SentencePieceProcessor& sp, const std::string& text, int newline_id,
            std::vector<uint32_t>* ids, std::string* error) {
  std::istringstream lines(text);
  std::string line;
  std::vector<int> piece_ids;
  while (std::getline(lines, line)) {
    if (!line.empty()) {
      const auto status = sp.Encode(line, &piece_ids);
      if (!status.ok()) {
        *error = status.ToString();
        return false;
      }
      ids->insert(ids->end(), piece_ids.begin(), piece_ids.end());
    }
    if (newline_id >= 0) ids->push_back(static_cast<uint32_t>(newline_id));
  }
  return true;
}

// A prompt's ids: lines joined by the newline symbol when the model has one (as the shards encode text).
std::string EncodePrompt(const sentencepiece::SentencePieceProcessor& sp, const std::string& text,
                         std::vector<int>* ids) {
  const int newline_id = NewlineId(sp);
  if (newline_id < 0) {
    const auto status = sp.Encode(text, ids);
    return status.ok() ? "" : status.ToString();
  }
  size_t begin = 0;
  while (true) {
    const size_t end = text.find('\n', begin);
    std::vector<int> piece_ids;
    const auto status =
        sp.Encode(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin), &piece_ids);
    if (!status.ok()) return status.ToString();
    ids->insert(ids->end(), piece_ids.begin(), piece_ids.end());
    if (end == std::string::npos) return "";
    ids->push_back(newline_id);
    begin = end + 1;
  }
}

// The text of ids; our newline symbol becomes '\n' (a byte piece "<0x0A>" decodes to it by itself).
std::string DecodeIds(const sentencepiece::SentencePieceProcessor& sp, const std::vector<int>& ids, std::string* text) {
  const int newline_id = sp.PieceToId(kNewlineSymbol);
  std::vector<int> line;
  auto flush = [&]() -> std::string {
    std::string piece;
    const auto status = sp.Decode(line, &piece);
    if (!status.ok()) return status.ToString();
    *text += piece;
    line.clear();
    return "";
  };
  for (int id : ids) {
    if (id < 0 || id >= sp.GetPieceSize()) return "token id " + std::to_string(id) + " is not in the vocabulary";
    if (id == newline_id && newline_id != sp.unk_id()) {
      if (std::string e = flush(); !e.empty()) return e;
      *text += "\n";
    } else {
      line.push_back(id);
    }
  }
  return flush();
}

// `encode` / `decode`: one prompt through the model at model_path; prints to stdout.
int RunCodec(bool encode, const std::string& model_path, const std::string& input) {
  sentencepiece::SentencePieceProcessor sp;
  const auto loaded = sp.Load(model_path);
  if (!loaded.ok()) return Fail("cannot load the tokenizer " + model_path + ": " + loaded.ToString());
  if (encode) {
    std::vector<int> ids;
    if (std::string e = EncodePrompt(sp, input, &ids); !e.empty()) return Fail("encoding failed: " + e);
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
    return 0;
  }
  std::vector<int> ids;
  std::istringstream in(input);
  for (std::string word; in >> word;) {
    try {
      ids.push_back(std::stoi(word));
    } catch (const std::exception&) {
      return Fail("--ids: '" + word + "' is not a token id");
    }
  }
  std::string text;
  if (std::string e = DecodeIds(sp, ids, &text); !e.empty()) return Fail("decoding failed: " + e);
  std::cout << text;
  return 0;
}

// The input text cut at a line boundary: train = head, validation = tail.
struct SplitText {
  std::string train, val;
};

// Reads --text and splits it; an error message on failure.
std::string ReadAndSplit(const std::string& text_path, double val_fraction, SplitText* out) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return "--text " + text_path + ": cannot read (" + std::strerror(errno) + ")";
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  if (text.empty()) return "--text " + text_path + ": file is empty";
  if (!(val_fraction > 0 && val_fraction < 1)) return "--val-fraction must be in (0, 1)";
  size_t split = static_cast<size_t>(text.size() * (1.0 - val_fraction));
  split = std::min(text.find('\n', split) == std::string::npos ? text.size() : text.find('\n', split) + 1, text.size());
  out->train = text.substr(0, split);
  out->val = text.substr(split);
  if (out->val.empty()) return "--val-fraction " + std::to_string(val_fraction) + " leaves no validation text";
  return "";
}

// Trains the BPE model on the training text into <dir>/tokenizer.model; an error message on failure.
std::string TrainTokenizer(const std::string& dir, const std::string& train_text, int vocab_size) {
  const std::string train_txt = dir + "/train.txt";
  {
    std::ofstream t(train_txt, std::ios::binary);
    t << train_text;
    if (!t) return "cannot write " + train_txt;
  }
  std::ostringstream args;
  args << "--input=" << train_txt << " --model_prefix=" << dir << "/tokenizer"
       << " --vocab_size=" << vocab_size << " --model_type=bpe --character_coverage=1.0"
       << " --user_defined_symbols=" << kNewlineSymbol
       << " --unk_id=0 --bos_id=-1 --eos_id=-1 --pad_id=-1 --num_threads=1 --minloglevel=1";
  const auto trained = sentencepiece::SentencePieceTrainer::Train(args.str());
  std::error_code ec;
  std::filesystem::remove(train_txt, ec);
  std::filesystem::remove(dir + "/tokenizer.vocab", ec);
  if (!trained.ok()) {
    return "SentencePiece training failed for --vocab-size " + std::to_string(vocab_size) +
           " (model.vocab_size; it must exceed the number of distinct characters): " + trained.ToString();
  }
  return "";
}

// Encodes both parts with <dir>/tokenizer.model and writes train.tok, val.tok and meta.json into dir.
std::string EncodeShards(const std::string& dir, const std::string& text_path, const SplitText& text, int vocab_size,
                         double val_fraction, size_t* train_tokens, size_t* val_tokens) {
  sentencepiece::SentencePieceProcessor sp;
  const auto loaded = sp.Load(dir + "/tokenizer.model");
  if (!loaded.ok()) return "cannot load the tokenizer: " + loaded.ToString();
  if (sp.GetPieceSize() > vocab_size) {
    return "the tokenizer has " + std::to_string(sp.GetPieceSize()) + " pieces, more than model.vocab_size (" +
           std::to_string(vocab_size) + ")";
  }
  const int newline_id = NewlineId(sp);
  std::vector<uint32_t> train_ids, val_ids;
  std::string error;
  if (!Encode(sp, text.train, newline_id, &train_ids, &error) || !Encode(sp, text.val, newline_id, &val_ids, &error)) {
    return "encoding failed: " + error;
  }
  if (!diloco::WriteTokenShard(dir + "/train.tok", train_ids, vocab_size, &error) ||
      !diloco::WriteTokenShard(dir + "/val.tok", val_ids, vocab_size, &error)) {
    return error;
  }
  nlohmann::json meta = {{"text", text_path},
                         {"vocab_size", vocab_size},
                         {"val_fraction", val_fraction},
                         {"train_chars", text.train.size()},
                         {"val_chars", text.val.size()},
                         {"train_tokens", train_ids.size()},
                         {"val_tokens", val_ids.size()},
                         {"newline_id", newline_id}};
  std::ofstream(dir + "/meta.json") << meta.dump(2) << "\n";
  *train_tokens = train_ids.size();
  *val_tokens = val_ids.size();
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a SentencePiece BPE tokenizer and write DiLoCo token shards"};
  std::string text_path, out_dir;
  int vocab_size = 512;
  double val_fraction = 0.1;
  CLI::Option* text_opt = app.add_option("--text", text_path, "input text file");
  CLI::Option* vocab_opt = app.add_option("--vocab-size", vocab_size, "BPE vocabulary size");
  CLI::Option* fraction_opt =
      app.add_option("--val-fraction", val_fraction, "tail fraction of the text kept for validation");
  CLI::Option* out_opt = app.add_option("--out", out_dir, "output directory (created atomically)");
  std::string tokenizer_model;
  app.add_option("--tokenizer-model", tokenizer_model, "use this SentencePiece model instead of training one");
  std::string model_path, codec_input;
  CLI::App* encode = app.add_subcommand("encode", "print a text's token ids");
  encode->add_option("--model", model_path, "SentencePiece model")->required();
  encode->add_option("--text", codec_input, "the text")->required();
  CLI::App* decode = app.add_subcommand("decode", "print the text of token ids");
  decode->add_option("--model", model_path, "SentencePiece model")->required();
  decode->add_option("--ids", codec_input, "token ids, space- or comma-separated")->required();
  CLI11_PARSE(app, argc, argv);
  if (*encode || *decode) {
    if (*decode) std::replace(codec_input.begin(), codec_input.end(), ',', ' ');
    return RunCodec(static_cast<bool>(*encode), model_path, codec_input);
  }
  for (CLI::Option* o : {text_opt, vocab_opt, fraction_opt, out_opt}) {
    if (o->count() == 0) return Fail(o->get_name() + " is required (or use the encode / decode subcommand)");
  }

  SplitText text;
  if (std::string e = ReadAndSplit(text_path, val_fraction, &text); !e.empty()) return Fail(e);
  const std::string partial = out_dir + ".partial-" + std::to_string(getpid());
  std::error_code ec;
  std::filesystem::remove_all(partial, ec);
  std::filesystem::create_directories(partial, ec);
  if (ec) return Fail("cannot create " + partial + ": " + ec.message());
  if (tokenizer_model.empty()) {
    if (std::string e = TrainTokenizer(partial, text.train, vocab_size); !e.empty()) return Fail(e);
  } else {
    std::filesystem::copy_file(tokenizer_model, partial + "/tokenizer.model", ec);
    if (ec) return Fail("cannot copy --tokenizer-model " + tokenizer_model + ": " + ec.message());
  }
  size_t train_tokens = 0, val_tokens = 0;
  if (std::string e = EncodeShards(partial, text_path, text, vocab_size, val_fraction, &train_tokens, &val_tokens);
      !e.empty()) {
    return Fail(e);
  }
  std::filesystem::rename(partial, out_dir, ec);
  if (ec) {
    std::filesystem::remove_all(partial);
    if (std::filesystem::is_directory(out_dir)) return 0;  // another process finished first
    return Fail("cannot rename " + partial + " to " + out_dir + ": " + ec.message());
  }
  std::cout << "diloco-tokenize: " << train_tokens << " train and " << val_tokens << " validation tokens ("
            << text.train.size() + text.val.size() << " chars, vocab " << vocab_size << ") -> " << out_dir << "\n";
  return 0;
}
