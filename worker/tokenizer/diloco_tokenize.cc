// diloco-tokenize: turns a run's inputs into the token cache directory --out that workers and the coordinator read:
// token shards plus meta.json (the token manifest, worker/data/token_manifest.h), the tokenizer (tokenizer.model, or
// tokenizer.json with the config.json / tokenizer_config.json next to the given one) and args.json (the
// arguments and input files, with sizes and mtimes, that made it; for people and scripts, not for readers).
//
//   --format text | jsonl: streams the inputs (work_items.h) through a SentencePiece model, trained on the spot
//     (tokenizer_model.h), or a given SentencePiece model or tokenizer.json (--tokenizer-model, text_tokenizer.h), on
//     --threads encoder threads (parallel_encoder.h), into shards written and resumed by shard_output.h; progress on
//     stderr (progress_meter.h).
//   --format tokens: pre-tokenized files used in place (token_files.h); no SentencePiece involved.
//   encode / decode: one prompt through a model, for `diloco-ctl generate` (codec.h); digest: a model's vocabulary
//     digest, which the coordinator and workers compare at Join.
//
// It runs as its own process and links nothing that loads protobuf or abseil: Debian's libsentencepiece carries its
// own protobuf-lite and crashes next to libprotobuf (docs/development.md, "Platform hazards"). The final summary is one
// line on stdout.
// Errors: every step throws TokenizeError (tokenize_error.h); main() is the one place that catches it, prints one line
// ("diloco-tokenize: error: ...") and exits 1. A wrong flag is one line and exit 2 (config/cli_flags.h). Exit 3:
// stopped by --stop-after-shards (tests).
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "config/cli_flags.h"
#include "worker/data/token_manifest.h"
#include "worker/tokenizer/codec.h"
#include "worker/tokenizer/document_encoder.h"
#include "worker/tokenizer/input_plan.h"
#include "worker/tokenizer/parallel_encoder.h"
#include "worker/tokenizer/progress_meter.h"
#include "worker/tokenizer/shard_output.h"
#include "worker/tokenizer/text_tokenizer.h"
#include "worker/tokenizer/token_files.h"
#include "worker/tokenizer/tokenize_error.h"
#include "worker/tokenizer/tokenizer_model.h"
#include "worker/tokenizer/work_items.h"

namespace diloco::tokenize {
namespace {

struct Options {
  std::vector<std::string> inputs, val_inputs;
  std::string input_list, val_input_list;
  std::string format = "text", jsonl_field = "text", token_dtype = "uint16", on_bad_record = "fail";
  int64_t vocab_size = 512;
  double val_fraction = 0.1;
  std::string out, tokenizer_model;
  uint64_t train_mb = 64;
  int threads = 0;
  uint64_t shard_tokens = uint64_t{1} << 27;
  uint64_t item_bytes = kWorkItemBytes;  // hidden, for tests: smaller work items (so small inputs make many shards)
  int stop_after_shards = 0;             // hidden, for the resume test: exit as if killed after this many shards
};

// Appends the paths of a list file (one a line) to *paths.
std::string ReadList(const std::string& list, std::vector<std::string>* paths) {
  if (list.empty()) return "";
  std::ifstream in(list);
  if (!in) return list + ": cannot read the input list";
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) paths->push_back(line);
  }
  return "";
}

// A file as the resume record knows it: its path, size and modification time.
nlohmann::json FileStamp(const std::string& path) {
  struct stat st {};
  stat(path.c_str(), &st);
  return {path, static_cast<uint64_t>(st.st_size), st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
}

nlohmann::json ResumeArgs(const Options& o) {
  nlohmann::json inputs = nlohmann::json::array(), val_inputs = nlohmann::json::array();
  for (const std::string& p : o.inputs) inputs.push_back(FileStamp(p));
  for (const std::string& p : o.val_inputs) val_inputs.push_back(FileStamp(p));
  return {{"format", o.format},
          {"inputs", inputs},
          {"val_inputs", val_inputs},
          {"val_fraction", o.val_fraction},
          {"vocab_size", o.vocab_size},
          {"jsonl_field", o.jsonl_field},
          {"on_bad_record", o.on_bad_record},
          {"tokenizer_model", o.tokenizer_model.empty() ? nlohmann::json("") : FileStamp(o.tokenizer_model)},
          {"train_mb", o.train_mb},
          {"shard_tokens", o.shard_tokens},
          {"item_bytes", o.item_bytes},
          {"cut_rule", kCutRuleVersion}};
}

// The tokenizer of a fresh run into dir: trained (tokenizer.model) or copied from --tokenizer-model under its cache
// name; a tokenizer.json brings the config.json / tokenizer_config.json beside it (its BOS / EOS, hf_tokenizer.h).
std::string MakeTokenizer(const Options& o, const SplitPlan& plan, InputFormat format, const std::string& dir) {
  if (o.tokenizer_model.empty()) {
    return TrainTokenizer(dir, plan.train, format, o.jsonl_field, o.train_mb, static_cast<int>(o.vocab_size),
                          o.threads);
  }
  namespace fs = std::filesystem;
  const std::string name = CacheFileNameOf(o.tokenizer_model);
  std::error_code ec;
  fs::copy_file(o.tokenizer_model, dir + "/" + name, fs::copy_options::overwrite_existing, ec);
  if (ec) return "cannot copy --tokenizer-model " + o.tokenizer_model + ": " + ec.message();
  if (name != "tokenizer.json") return "";
  for (const char* sidecar : {"config.json", "tokenizer_config.json"}) {
    const fs::path from = fs::path(o.tokenizer_model).parent_path() / sidecar;
    std::error_code missing;
    if (!fs::is_regular_file(from, missing)) continue;
    fs::copy_file(from, dir + "/" + sidecar, fs::copy_options::overwrite_existing, ec);
    if (ec) return "cannot copy " + from.string() + ": " + ec.message();
  }
  return "";
}

// The tokenizer file of the cache being written: tokenizer.json when there is one, else tokenizer.model.
std::string CacheTokenizerPath(const ShardOutput& out) {
  const std::string json = out.partial_dir() + "/tokenizer.json";
  std::error_code ec;
  return std::filesystem::is_regular_file(json, ec) ? json : out.partial_dir() + "/tokenizer.model";
}

void PrintResume(const ShardOutput& out, const SplitPlan& plan) {
  const ResumeRecord& r = out.record();
  const auto& ranges = r.split == kTrain ? plan.train : plan.val;
  std::cerr << "diloco-tokenize resuming " << out.partial_dir() << " after " << r.shards[kTrain].size() << " train and "
            << r.shards[kVal].size() << " validation shards: ";
  if (r.split == kDone || r.position.range >= ranges.size()) {
    std::cerr << "only the manifest is left\n";
  } else {
    std::cerr << (r.split == kTrain ? "training" : "validation") << " input " << r.position.range + 1 << " of "
              << ranges.size() << " (" << ranges[r.position.range].path << ") at byte " << r.position.offset << "\n";
  }
}

// Loads the tokenizer of the cache being written and checks it fits model.vocab_size.
std::unique_ptr<TextTokenizer> LoadTokenizer(const Options& o, const ShardOutput& out) {
  std::unique_ptr<TextTokenizer> tokenizer;
  const std::string path = CacheTokenizerPath(out);
  std::string error = LoadTextTokenizer(path, &tokenizer);
  // A given tokenizer is named as the user gave it, not as its copy in the cache being written.
  for (size_t at = 0; !o.tokenizer_model.empty() && (at = error.find(path, at)) != std::string::npos;) {
    error.replace(at, path.size(), o.tokenizer_model);
    at += o.tokenizer_model.size();
  }
  ThrowIfError(error);
  if (tokenizer->size() > o.vocab_size) {
    throw TokenizeError("the tokenizer has " + std::to_string(tokenizer->size()) +
                        " pieces, more than model.vocab_size (" + std::to_string(o.vocab_size) + ")");
  }
  return tokenizer;
}

// Encodes the training, then the validation split from where the output stands into its shards; returns true if
// --stop-after-shards stopped it.
bool EncodeSplits(const Options& o, const SplitPlan& plan, const DocumentEncoder& encoder, ShardOutput& out) {
  ProgressMeter meter(plan.Bytes(), out.record().bytes_done);
  bool stopped = false;
  for (int split = out.record().split; split < kDone && !stopped; ++split) {
    const auto& ranges = split == kTrain ? plan.train : plan.val;
    const std::string e =
        EncodeInOrder(ranges, out.record().position, o.item_bytes, encoder, o.threads, [&](EncodedItem& item) {
          if (std::string error = out.Add(split, item); !error.empty()) {
            item.error = error;
            return false;
          }
          meter.Add(item.bytes, item.ids.size(), item.documents);
          stopped = o.stop_after_shards > 0 && out.shards_finished_here() >= o.stop_after_shards;
          return !stopped;
        });
    meter.Finish();
    ThrowIfError(e);
    if (stopped) break;
    const SplitPosition next =
        split == kTrain ? SplitPosition{0, plan.val[0].begin, plan.val[0].first_line} : SplitPosition{};
    ThrowIfError(out.EndSplit(split, next));
  }
  return stopped;
}

// Writes the manifest, publishes the cache and prints the one-line summary.
void FinishCache(const Options& o, const SplitPlan& plan, const TextTokenizer& tokenizer, ShardOutput& out) {
  const SpecialIds special = tokenizer.special();
  TokenManifest manifest;
  manifest.vocab_size = o.vocab_size;
  manifest.bos_id = special.bos;
  manifest.eos_id = special.eos;
  manifest.newline_id = special.newline;
  manifest.tokenizer = tokenizer.cache_file_name();
  const ResumeRecord record = out.record();
  std::ofstream(out.partial_dir() + "/args.json") << record.args.dump(1) << "\n";  // what made this cache, for people
  ThrowIfError(out.Finish(manifest));
  uint64_t tokens[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {
    for (uint64_t n : record.shards[s]) tokens[s] += n;
  }
  if (record.bad_records > 0) {
    std::cerr << "diloco-tokenize skipped " << record.bad_records << " bad records (data.on_bad_record: skip)\n";
  }
  std::cout << "diloco-tokenize: " << tokens[kTrain] << " train and " << tokens[kVal] << " validation tokens ("
            << record.documents << " documents, " << record.bad_records << " bad records skipped, " << plan.Bytes()
            << " bytes of text, vocab " << o.vocab_size << ") -> " << o.out << "\n";
}

// Returns 0, or 3 if stopped by --stop-after-shards; throws TokenizeError.
int RunEncode(const Options& o, InputFormat format) {
  SplitPlan plan;
  ThrowIfError(PlanSplit(format, o.inputs, o.val_inputs, o.val_fraction, &plan));
  ShardOutput out;
  bool resumed = false;
  ThrowIfError(out.Open(o.out, ResumeArgs(o), o.vocab_size, o.shard_tokens, &resumed));
  if (resumed) {
    PrintResume(out, plan);
  } else {
    ThrowIfError(MakeTokenizer(o, plan, format, out.partial_dir()));
    ThrowIfError(out.Save());
  }
  const std::unique_ptr<TextTokenizer> tokenizer = LoadTokenizer(o, out);
  const DocumentEncoder encoder(*tokenizer, format, o.jsonl_field, o.on_bad_record == "skip");
  if (EncodeSplits(o, plan, encoder, out)) {
    std::cerr << "diloco-tokenize: stopped after " << o.stop_after_shards << " shards (--stop-after-shards)\n";
    return 3;
  }
  FinishCache(o, plan, *tokenizer, out);
  return 0;
}

int RunTokens(const Options& o) {
  TokenManifest manifest;
  manifest.vocab_size = o.vocab_size;
  const uint32_t width = o.token_dtype == "uint32" ? 4 : 2;
  ThrowIfError(PlanTokenFiles(o.inputs, o.val_inputs, o.val_fraction, width, o.vocab_size, o.threads, &manifest));
  const std::string partial = o.out + ".partial";
  std::error_code ec;
  std::filesystem::remove_all(partial, ec);
  std::filesystem::create_directories(partial, ec);
  if (ec) throw TokenizeError("cannot create " + partial + ": " + ec.message());
  std::ofstream(partial + "/args.json") << ResumeArgs(o).dump(1) << "\n";
  std::string error;
  if (!WriteTokenManifest(partial + "/meta.json", manifest, &error)) throw TokenizeError(error);
  std::filesystem::rename(partial, o.out, ec);
  if (ec && !std::filesystem::is_directory(o.out))
    throw TokenizeError("cannot rename " + partial + ": " + ec.message());
  if (ec) std::filesystem::remove_all(partial, ec);
  std::cout << "diloco-tokenize: " << manifest.TrainTokens() << " train and " << manifest.ValTokens()
            << " validation tokens (" << manifest.documents << " token files used in place, vocab " << o.vocab_size
            << ") -> " << o.out << "\n";
  return 0;
}

// The flags of the encode / decode / digest subcommands.
struct CodecFlags {
  std::string model_path, input;
  bool add_special_tokens = false;
  CLI::App* encode = nullptr;
  CLI::App* decode = nullptr;
  CLI::App* digest = nullptr;
};

// The tokenizing flags into `o` (--text into `text`) and the encode / decode / digest subcommands into `codec`; returns
// the options that must be given unless a subcommand runs (--vocab-size, --out).
std::vector<CLI::Option*> AddFlags(CLI::App& app, Options& o, std::string& text, CodecFlags& codec) {
  app.add_option("--text", text, "one input text file (the same as --input FILE --format text)");
  app.add_option("--input", o.inputs, "an input file (repeatable)");
  app.add_option("--input-list", o.input_list, "a file listing input files, one a line");
  app.add_option("--val-input", o.val_inputs, "a validation input file (repeatable; default: the tail of the inputs)");
  app.add_option("--val-input-list", o.val_input_list, "a file listing validation input files, one a line");
  app.add_option("--format", o.format, "text | jsonl | tokens")->check(CLI::IsMember({"text", "jsonl", "tokens"}));
  app.add_option("--jsonl-field", o.jsonl_field, "jsonl: the string field holding a document");
  app.add_option("--token-dtype", o.token_dtype, "tokens, raw files: uint16 | uint32")
      ->check(CLI::IsMember({"uint16", "uint32"}));
  app.add_option("--on-bad-record", o.on_bad_record, "jsonl: fail | skip")->check(CLI::IsMember({"fail", "skip"}));
  CLI::Option* vocab_opt = app.add_option("--vocab-size", o.vocab_size, "model.vocab_size");
  app.add_option("--val-fraction", o.val_fraction, "tail fraction kept for validation (without val inputs)");
  CLI::Option* out_opt = app.add_option("--out", o.out, "output directory (appears atomically)");
  app.add_option("--tokenizer-model", o.tokenizer_model,
                 "use this SentencePiece model or tokenizer.json instead of training one");
  app.add_option("--train-mb", o.train_mb, "train the tokenizer on the first this many MB of training text");
  app.add_option("--threads", o.threads, "encoding threads (0: every core)");
  app.add_option("--shard-tokens", o.shard_tokens, "ids per shard (cut at work-item boundaries)");
  app.add_option("--stop-after-shards", o.stop_after_shards)->group("");  // tests: exit 3 after N shards
  app.add_option("--work-item-bytes", o.item_bytes)->group("");           // tests: small work items
  codec.encode = app.add_subcommand("encode", "print a text's token ids");
  codec.encode->add_option("--model", codec.model_path, "SentencePiece model or tokenizer.json")->required();
  codec.encode->add_option("--text", codec.input, "the text")->required();
  codec.encode->add_flag("--add-special-tokens", codec.add_special_tokens,
                         "add the special tokens transformers' tokenizer(text) adds (a prompt's BOS)");
  codec.decode = app.add_subcommand("decode", "print the text of token ids");
  codec.decode->add_option("--model", codec.model_path, "SentencePiece model or tokenizer.json")->required();
  codec.decode->add_option("--ids", codec.input, "token ids, space- or comma-separated")->required();
  codec.digest = app.add_subcommand("digest", "print the vocabulary digest the coordinator compares at Join");
  codec.digest->add_option("--model", codec.model_path, "SentencePiece model or tokenizer.json")->required();
  return {vocab_opt, out_opt};
}

// The whole program but the error boundary: returns the exit code, throws TokenizeError.
int Main(int argc, char** argv) {
  Options o;
  CLI::App app{"Tokenize a run's inputs into DiLoCo token shards (the token cache)"};
  std::string text;
  CodecFlags codec;
  const std::vector<CLI::Option*> required = AddFlags(app, o, text, codec);
  if (const int code = diloco::ParseFlags(app, argc, argv); code >= 0) return code;
  if (*codec.digest) return RunDigest(codec.model_path);
  if (*codec.encode || *codec.decode) {
    if (*codec.decode) std::replace(codec.input.begin(), codec.input.end(), ',', ' ');
    return RunCodec(static_cast<bool>(*codec.encode), codec.model_path, codec.input, codec.add_special_tokens);
  }
  for (CLI::Option* opt : required) {
    if (opt->count() == 0)
      throw TokenizeError(opt->get_name() + " is required (or use the encode / decode / digest subcommand)");
  }
  if (!text.empty()) o.inputs.insert(o.inputs.begin(), text);
  ThrowIfError(ReadList(o.input_list, &o.inputs));
  ThrowIfError(ReadList(o.val_input_list, &o.val_inputs));
  if (o.threads <= 0) o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (o.shard_tokens == 0 || o.item_bytes == 0) {
    throw TokenizeError("--shard-tokens and --work-item-bytes must be positive");
  }
  if (o.format == "tokens") return RunTokens(o);
  return RunEncode(o, o.format == "jsonl" ? InputFormat::kJsonl : InputFormat::kText);
}

}  // namespace
}  // namespace diloco::tokenize

// The one place diloco-tokenize ends with an error: one line on stderr and the exit code.
int main(int argc, char** argv) {
  try {
    return diloco::tokenize::Main(argc, argv);
  } catch (const diloco::tokenize::TokenizeError& e) {
    std::cerr << "diloco-tokenize: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {  // e.g. a filesystem or JSON error a step did not expect
    std::cerr << "diloco-tokenize: error: " << e.what() << "\n";
    return 1;
  }
}
