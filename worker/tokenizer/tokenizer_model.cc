#include "worker/tokenizer/tokenizer_model.h"

#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "worker/tokenizer/work_items.h"

namespace diloco::tokenize {
namespace {

// Writes the documents of a jsonl item (one per line as far as the text allows); bad lines are left to the encoder.
void WriteJsonlDocuments(const std::string& text, const std::string& field, std::ofstream& out) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    try {
      const nlohmann::json record = nlohmann::json::parse(line);
      if (record.is_object() && record.contains(field) && record.at(field).is_string()) {
        out << record.at(field).get_ref<const std::string&>() << "\n";
      }
    } catch (const nlohmann::json::exception&) {
    }
  }
}

// Copies about `limit` bytes of training text (whole work items) to `path`.
std::string WriteSample(const std::string& path, const std::vector<InputRange>& train, InputFormat format,
                        const std::string& jsonl_field, uint64_t limit) {
  std::ofstream out(path, std::ios::binary);
  if (!out) return "cannot write " + path;
  ItemReader reader(train, SplitPosition{0, train[0].begin, train[0].first_line});
  WorkItem item;
  for (uint64_t written = 0; written < limit && reader.Next(&item); written += item.text.size()) {
    if (format == InputFormat::kJsonl) {
      WriteJsonlDocuments(item.text, jsonl_field, out);
    } else {
      out << item.text;
      if (item.document_end && !item.text.empty() && item.text.back() != '\n') out << "\n";
    }
  }
  if (!reader.error().empty()) return reader.error();
  out.flush();
  return out ? "" : "cannot write " + path;
}

// The sample's lines, for SentencePieceTrainer (it calls from one thread).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string& path) : in_(path, std::ios::binary) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !std::getline(in_, line_); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override {
    if (in_.is_open() && !in_.bad()) return {};
    return {sentencepiece::util::StatusCode::kInternal, "cannot read the tokenizer sample"};
  }

 private:
  std::ifstream in_;
  std::string line_;
  bool done_ = false;
};

}  // namespace

std::string TrainTokenizer(const std::string& dir, const std::vector<InputRange>& train, InputFormat format,
                           const std::string& jsonl_field, uint64_t train_mb, int vocab_size, int threads) {
  const std::string sample = dir + "/tokenizer-sample.txt";
  if (std::string e = WriteSample(sample, train, format, jsonl_field, train_mb << 20); !e.empty()) return e;
  // Settings as a map and the sample through an iterator: SentencePiece splits an argument string on spaces and its
  // "input" setting on commas, so a run directory holding either would break a command line.
  const std::unordered_map<std::string, std::string> settings = {{"model_prefix", dir + "/tokenizer"},
                                                                 {"vocab_size", std::to_string(vocab_size)},
                                                                 {"model_type", "bpe"},
                                                                 {"character_coverage", "1.0"},
                                                                 {"user_defined_symbols", kNewlineSymbol},
                                                                 {"unk_id", "0"},
                                                                 {"bos_id", "1"},
                                                                 {"eos_id", "2"},
                                                                 {"pad_id", "-1"},
                                                                 {"num_threads", std::to_string(threads)},
                                                                 {"minloglevel", "1"}};
  LineIterator lines(sample);
  const auto trained = sentencepiece::SentencePieceTrainer::Train(settings, &lines);
  std::error_code ec;
  std::filesystem::remove(sample, ec);
  std::filesystem::remove(dir + "/tokenizer.vocab", ec);
  if (!trained.ok()) {
    // SentencePiece says "Vocabulary size too high" when the text holds fewer pieces than asked for, and "too small"
    // (or fails otherwise) when the vocabulary cannot hold the text's distinct characters.
    const std::string why = trained.ToString();
    const std::string hint = why.find("too high") != std::string::npos
                                 ? "model.vocab_size; the text is too small to learn that many pieces: give more text "
                                   "(data.text, data.files) or a smaller model.vocab_size"
                                 : "model.vocab_size; it must exceed the number of distinct characters";
    return "SentencePiece training failed for --vocab-size " + std::to_string(vocab_size) + " (" + hint + "): " + why;
  }
  return "";
}

}  // namespace diloco::tokenize
