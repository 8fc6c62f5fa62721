// diloco-tokenize and the token cache (config/data_cache.h) with real files and the real binary: an existing
// SentencePiece model's ids appear unchanged in the shards (checked against Debian's spm_encode), jsonl input with
// bad lines (fail names FILE:LINE, skip counts), pre-tokenized files used in place (nanoGPT and llm.c .bin written
// by numpy), resume after an interrupted run, and the one-line input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "tests/process_harness.h"
#include "worker/data/token_manifest.h"

namespace diloco::testing {
namespace {

const std::string kTokenizer = "diloco-tokenize";

std::string Shakespeare() { return SourceDir() + "/tests/data/tinyshakespeare.txt"; }

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

Config MakeConfig(const std::string& dir, int vocab_size) {
  auto config = ParseConfig("model: {vocab_size: " + std::to_string(vocab_size) + "}\n", "test",
                            {"data.cache_dir=" + dir + "/cache"});
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// The ids of a split, read through the manifest's segments.
std::vector<uint32_t> SplitIds(const std::vector<TokenSegment>& segments) {
  std::vector<uint32_t> ids;
  for (const TokenSegment& s : segments) {
    std::ifstream in(s.path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(s.offset));
    for (uint64_t i = 0; i < s.count; ++i) {
      uint32_t id = 0;
      in.read(reinterpret_cast<char*>(&id), s.width);
      ids.push_back(id);
    }
  }
  return ids;
}

TokenManifest ReadManifest(const TokenCache& cache) {
  TokenManifest manifest;
  std::string error;
  EXPECT_TRUE(ReadTokenManifest(cache.meta_path(), &manifest, &error)) << error;
  return manifest;
}

std::vector<uint32_t> ParseIds(const std::string& text) {
  std::vector<uint32_t> ids;
  std::istringstream in(text);
  for (uint32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// A model diloco-tokenize trains on the shipped text (vocab 100: unk 0, bos 1, eos 2, <nl> 3).
std::string TrainedModel(const std::string& dir) {
  RunningProcess made(kTokenizer, {"--text", Shakespeare(), "--vocab-size", "100", "--out", dir + "/made"});
  EXPECT_EQ(made.Wait(120), 0) << made.output();
  return dir + "/made/tokenizer.model";
}

// SentencePiece splits an argument string on spaces and its "input" on commas: a tokenizer trained under a run
// directory holding both must be the one trained under a plain path.
TEST(Tokenize, ATokenizerTrainsUnderADirectoryWithSpacesAndCommas) {
  const std::string dir = ScratchDir("tok_odd_dir");
  const std::string plain = TrainedModel(dir);
  const std::string odd_dir = dir + "/a run, with spaces";
  std::filesystem::create_directories(odd_dir);
  const std::string odd = TrainedModel(odd_dir);
  ASSERT_TRUE(std::filesystem::exists(odd));
  const std::string text = "Before we proceed any further, hear me speak.";
  RunningProcess a(kTokenizer, {"encode", "--model", plain, "--text", text});
  RunningProcess b(kTokenizer, {"encode", "--model", odd, "--text", text});
  ASSERT_EQ(a.Wait(60), 0) << a.output();
  ASSERT_EQ(b.Wait(60), 0) << b.output();
  EXPECT_GT(ParseIds(a.output()).size(), 8u) << a.output();
  EXPECT_EQ(ParseIds(b.output()), ParseIds(a.output()));
}

TEST(Tokenize, GivenModelIdsAppearUnchangedInTheShards) {
  const std::string dir = ScratchDir("tok_given_ids");
  const std::string model = TrainedModel(dir);
  WriteText(dir + "/train.txt", "First Citizen:\nBefore we proceed any further, hear me speak.\n");
  WriteText(dir + "/val.txt", "All:\nSpeak, speak.\n");
  Config config = MakeConfig(dir, 128);
  config.data.files = {dir + "/train.txt"};
  config.data.val_files = {dir + "/val.txt"};
  config.data.tokenizer = model;
  auto cache = EnsureTokenized(config, BinDir() + "/" + kTokenizer);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const TokenManifest manifest = ReadManifest(*cache);
  EXPECT_EQ(manifest.bos_id, 1);
  EXPECT_EQ(manifest.eos_id, 2);
  EXPECT_EQ(manifest.newline_id, 3);
  EXPECT_EQ(manifest.documents, 2u);
  EXPECT_EQ(ReadFile(cache->tokenizer_model_path()), ReadFile(model));

  // Debian's spm_encode, one line of ids per input line.
  ASSERT_EQ(Shell("spm_encode --model " + model + " --output_format=id < " + dir + "/train.txt > " + dir + "/spm.txt"),
            0);
  std::ifstream spm(dir + "/spm.txt");
  std::string line1, line2;
  ASSERT_TRUE(std::getline(spm, line1) && std::getline(spm, line2));
  std::vector<uint32_t> expected = {1};  // BOS, line 1, <nl>, line 2, <nl>, EOS
  for (uint32_t id : ParseIds(line1)) expected.push_back(id);
  expected.push_back(3);
  for (uint32_t id : ParseIds(line2)) expected.push_back(id);
  expected.insert(expected.end(), {3, 2});
  ASSERT_GT(expected.size(), 12u);
  EXPECT_EQ(SplitIds(manifest.train), expected);
}

// diloco-tokenize digest, which the coordinator and workers compare at Join: a trained SentencePiece model's is the
// reference digest (tests/golden/vocab_digest.py) of the pieces sentencepiece's id_to_piece gives. The same text
// trained on 1 and on 2 threads gives files that differ (each records its trainer's thread count) and one digest, so
// hosts with other core counts agree; another text gives another vocabulary and another digest.
TEST(Tokenize, TheVocabularyDigestIsTheReferencesAndIgnoresTheTrainingThreads) {
  if (!std::filesystem::exists(DILOCO_PYTHON)) GTEST_SKIP() << "no Python with sentencepiece at " << DILOCO_PYTHON;
  const std::string dir = ScratchDir("tok_digest");
  std::map<std::string, std::string> models;  // by name: the model's path
  for (const auto& [name, threads, text] :
       {std::tuple{"one", "1", Shakespeare()}, std::tuple{"two", "2", Shakespeare()},
        std::tuple{"other", "1", dir + "/other.txt"}}) {
    if (std::string(name) == "other") {
      std::string upper = ReadFile(Shakespeare());
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      WriteText(text, upper);
    }
    RunningProcess made(kTokenizer,
                        {"--text", text, "--vocab-size", "100", "--threads", threads, "--out", dir + "/" + name});
    ASSERT_EQ(made.Wait(120), 0) << made.output();
    models[name] = dir + "/" + name + "/tokenizer.model";
  }
  std::map<std::string, std::string> digests;
  for (const auto& [name, model] : models) {
    const auto [code, ours] = RunToEnd(kTokenizer, {"digest", "--model", model});
    ASSERT_EQ(code, 0) << ours;
    ASSERT_EQ(Shell(std::string(DILOCO_PYTHON) + " " + SourceDir() + "/tests/golden/vocab_digest.py " + model + " > " +
                    dir + "/" + name + ".txt"),
              0);
    EXPECT_EQ(ours, ReadFile(dir + "/" + name + ".txt")) << name;
    digests[name] = ours;
  }
  EXPECT_NE(ReadFile(models["one"]), ReadFile(models["two"])) << "the trainer's thread count is in the file";
  EXPECT_EQ(digests["one"], digests["two"]);
  EXPECT_NE(digests["one"], digests["other"]);
}

// A prompt's special tokens from a SentencePiece model, as transformers 5.25 reads a tokenizer.model directory: the
// post-processor of a tokenizer.json beside it; else the add_bos_token / add_eos_token of the tokenizer_config.json
// beside it (false when it does not say); with neither (a model this tool trained, whose documents start with BOS),
// BOS. A config that is not JSON is one line, and only where a prompt needs it.
TEST(Tokenize, APromptsSpecialTokensFollowTheTokenizerConfig) {
  const std::string dir = ScratchDir("tok_prompt_special");
  const std::string model = TrainedModel(dir);
  auto encode = [&](bool special) {
    std::vector<std::string> args = {"encode", "--model", model, "--text", "ROMEO: speak"};
    if (special) args.push_back("--add-special-tokens");
    RunningProcess p(kTokenizer, args);
    EXPECT_EQ(p.Wait(30), 0) << p.output();
    return ParseIds(p.output());
  };
  const std::vector<uint32_t> plain = encode(false);
  ASSERT_FALSE(plain.empty());
  auto with = [&](std::vector<uint32_t> before, std::vector<uint32_t> after) {
    before.insert(before.end(), plain.begin(), plain.end());
    before.insert(before.end(), after.begin(), after.end());
    return before;
  };
  EXPECT_EQ(encode(true), with({1}, {})) << "no tokenizer_config.json: BOS";
  const std::string config = dir + "/made/tokenizer_config.json";
  WriteText(config, R"({"tokenizer_class": "LlamaTokenizer"})");
  EXPECT_EQ(encode(true), plain) << "a config that does not say: none";
  WriteText(config, R"({"add_bos_token": true, "add_eos_token": true})");
  EXPECT_EQ(encode(true), with({1}, {2}));
  WriteText(config, R"({"add_bos_token": false})");
  EXPECT_EQ(encode(true), plain);
  // A tokenizer.json beside the model (the hub's Llama 2 / Mistral layout): transformers reads it, and its
  // post-processor decides, whatever tokenizer_config.json says.
  const std::string json = dir + "/made/tokenizer.json";
  WriteText(json, R"({"post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                         "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}})");
  EXPECT_EQ(encode(true), with({1}, {2}));
  std::filesystem::remove(json);
  WriteText(config, R"({"add_bos_token": "yes"})");
  EXPECT_EQ(encode(false), plain) << "training text does not read it";
  RunningProcess bad(kTokenizer, {"encode", "--model", model, "--text", "x", "--add-special-tokens"});
  EXPECT_EQ(bad.Wait(30), 1);
  EXPECT_TRUE(bad.WaitForOutput(
      "diloco-tokenize: error: encoding failed: " + config + ": add_bos_token must be true or false", 10))
      << bad.output();
}

TEST(Tokenize, JsonlBadLinesFailWithFileAndLineOrAreSkippedAndCounted) {
  const std::string dir = ScratchDir("tok_jsonl");
  const std::string model = TrainedModel(dir);
  std::string jsonl;
  for (int i = 1; i <= 10; ++i) {
    jsonl += i == 2   ? "this is not json\n"
             : i == 3 ? "{\"body\": \"no text field\"}\n"
                      : "{\"text\": \"record " + std::to_string(i) + "\", \"n\": 1}\n";
  }
  WriteText(dir + "/docs.jsonl", jsonl);
  const std::vector<std::string> args = {"--format", "jsonl",          "--input", dir + "/docs.jsonl", "--vocab-size",
                                         "100",      "--val-fraction", "0.2",     "--tokenizer-model", model};
  RunningProcess failing(kTokenizer, With(args, {"--out", dir + "/fail"}));
  EXPECT_EQ(failing.Wait(60), 1);
  EXPECT_TRUE(failing.WaitForOutput(dir + "/docs.jsonl:2: not JSON", 10)) << failing.output();
  RunningProcess no_field(kTokenizer, With(args, {"--jsonl-field", "title", "--out", dir + "/nofield"}));
  EXPECT_EQ(no_field.Wait(60), 1);
  EXPECT_TRUE(no_field.WaitForOutput(dir + "/docs.jsonl:1: no string field 'title'", 10)) << no_field.output();

  Config config = MakeConfig(dir, 128);
  config.data.files = {dir + "/docs.jsonl"};
  config.data.format = DataFormat::kJsonl;
  config.data.val_fraction = 0.2;
  config.data.tokenizer = model;
  EXPECT_FALSE(EnsureTokenized(config, BinDir() + "/" + kTokenizer).ok());  // on_bad_record: fail
  config.data.on_bad_record = BadRecordPolicy::kSkip;
  auto cache = EnsureTokenized(config, BinDir() + "/" + kTokenizer);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const TokenManifest manifest = ReadManifest(*cache);
  EXPECT_EQ(manifest.bad_records, 2u);
  EXPECT_EQ(manifest.documents, 8u);
  // Validation = the last 20% of the records (lines 9 and 10), each [BOS] ids [EOS].
  RunningProcess r9(kTokenizer, {"encode", "--model", model, "--text", "record 9"});
  RunningProcess r10(kTokenizer, {"encode", "--model", model, "--text", "record 10"});
  ASSERT_EQ(r9.Wait(30), 0);
  ASSERT_EQ(r10.Wait(30), 0);
  std::vector<uint32_t> expected = {1};
  for (uint32_t id : ParseIds(r9.output())) expected.push_back(id);
  expected.insert(expected.end(), {2, 1});
  for (uint32_t id : ParseIds(r10.output())) expected.push_back(id);
  expected.push_back(2);
  EXPECT_EQ(SplitIds(manifest.val), expected);
}

TEST(Tokenize, TokenFilesAreUsedInPlace) {
  const std::string dir = ScratchDir("tok_files");
  if (!std::filesystem::exists(DILOCO_PYTHON)) GTEST_SKIP() << "no Python with numpy at " << DILOCO_PYTHON;
  ASSERT_EQ(Shell(std::string(DILOCO_PYTHON) + " " + SourceDir() + "/tests/integration/make_token_files.py " + dir), 0);
  Config config = MakeConfig(dir, 50257);
  config.data.format = DataFormat::kTokens;
  config.data.files = {dir + "/nanogpt.bin", dir + "/llmc.bin"};
  config.data.val_fraction = 0.2;  // 1500 ids: the last 300 (of llmc.bin) validate
  auto cache = EnsureTokenized(config, BinDir() + "/" + kTokenizer);
  ASSERT_TRUE(cache.ok()) << cache.status();
  TokenManifest m = ReadManifest(*cache);
  ASSERT_EQ(m.train.size(), 2u);
  ASSERT_EQ(m.val.size(), 1u);
  EXPECT_EQ(m.train[0].path, dir + "/nanogpt.bin");
  EXPECT_EQ(m.train[0].offset, 0u);
  EXPECT_EQ(m.train[0].width, 2u);
  EXPECT_EQ(m.train[0].count, 1000u);
  EXPECT_EQ(m.train[1].path, dir + "/llmc.bin");
  EXPECT_EQ(m.train[1].offset, 1024u);
  EXPECT_EQ(m.train[1].count, 200u);
  EXPECT_EQ(m.val[0].path, dir + "/llmc.bin");
  EXPECT_EQ(m.val[0].offset, 1024u + 2 * 200);
  EXPECT_EQ(m.val[0].count, 300u);
  EXPECT_EQ(SplitIds(m.val).front(), 7u * 200);
  EXPECT_EQ(SplitIds(m.train)[999], 999u);

  config.model.vocab_size = 200000;  // llm.c's llama3 layout: uint32 ids
  config.data.files = {dir + "/llmc3.bin"};
  config.data.val_files = {dir + "/nanogpt.bin"};
  cache = EnsureTokenized(config, BinDir() + "/" + kTokenizer);
  ASSERT_TRUE(cache.ok()) << cache.status();
  m = ReadManifest(*cache);
  ASSERT_EQ(m.train.size(), 1u);
  EXPECT_EQ(m.train[0].width, 4u);
  EXPECT_EQ(m.train[0].offset, 1024u);
  EXPECT_EQ(m.train[0].count, 300u);
  EXPECT_EQ(SplitIds(m.train)[299], 100299u);
  EXPECT_EQ(m.val[0].count, 1000u);

  // Each file refused with exit code 1 and the line naming it.
  auto refused = [&](const std::string& file, const std::string& vocab, const std::string& message) {
    RunningProcess p(kTokenizer, {"--format", "tokens", "--input", dir + "/" + file, "--vocab-size", vocab, "--out",
                                  dir + "/refused-" + file});
    EXPECT_EQ(p.Wait(30), 1) << file;
    EXPECT_TRUE(p.WaitForOutput(message, 10)) << p.output();
  };
  refused("bad_id.bin", "50257", dir + "/bad_id.bin: token id 60000 at position 123 is >= model.vocab_size 50257");
  refused("truncated.bin", "50257", "truncated.bin: header says 1000 tokens but the file holds 900 (truncated?)");
  // Raw uint32 ids read as uint16 (the default) would pass every id check as (low, high) halves: refused by their
  // high halves (0 for a GPT-2 vocabulary, 0 or 1 for Llama 3's), and read whole with --token-dtype uint32. Real
  // uint16 ids, enough for the check to look at, pass under a small and a large vocabulary.
  for (const char* vocab : {"50257", "200000"}) {
    RunningProcess real(kTokenizer, {"--format", "tokens", "--input", dir + "/long16.bin", "--vocab-size", vocab,
                                     "--val-fraction", "0.1", "--out", dir + "/long16-" + vocab});
    EXPECT_EQ(real.Wait(30), 0) << real.output();
  }
  refused("wide.bin", "50257",
          dir +
              "/wide.bin: every second uint16 of the first 4000 ids is 0, as uint32 ids read as uint16 are; set "
              "data.token_dtype: uint32");
  refused("wide3.bin", "128256", dir + "/wide3.bin: every second uint16 of the first 4000 ids is at most 1");
  RunningProcess wide(kTokenizer, {"--format", "tokens", "--input", dir + "/wide.bin", "--vocab-size", "50257",
                                   "--token-dtype", "uint32", "--val-fraction", "0.1", "--out", dir + "/wide"});
  EXPECT_EQ(wide.Wait(30), 0) << wide.output();
  TokenManifest wide_manifest;
  std::string error;
  ASSERT_TRUE(ReadTokenManifest(dir + "/wide/meta.json", &wide_manifest, &error)) << error;
  EXPECT_EQ(SplitIds(wide_manifest.train).size() + SplitIds(wide_manifest.val).size(), 2000u);
  EXPECT_EQ(SplitIds(wide_manifest.train)[1], 3u);
}

TEST(Tokenize, AnInterruptedRunResumesFromTheLastFinishedShard) {
  const std::string dir = ScratchDir("tok_resume");
  const std::string model = TrainedModel(dir);
  const std::vector<std::string> args = {
      "--text",         Shakespeare(), "--vocab-size",      "128",  "--tokenizer-model", model,
      "--shard-tokens", "50000",       "--work-item-bytes", "65536"};
  RunningProcess whole(kTokenizer, With(args, {"--out", dir + "/whole", "--threads", "1"}));
  ASSERT_EQ(whole.Wait(120), 0) << whole.output();
  RunningProcess first(kTokenizer, With(args, {"--out", dir + "/cut", "--threads", "2", "--stop-after-shards", "3"}));
  ASSERT_EQ(first.Wait(120), 3) << first.output();
  EXPECT_TRUE(std::filesystem::exists(dir + "/cut.partial/train-00002.tok"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/cut"));
  RunningProcess rest(kTokenizer, With(args, {"--out", dir + "/cut", "--threads", "2"}));
  ASSERT_EQ(rest.Wait(120), 0) << rest.output();
  EXPECT_TRUE(rest.WaitForOutput("resuming " + dir + "/cut.partial after 3 train and 0 validation shards", 10))
      << rest.output();
  EXPECT_FALSE(std::filesystem::exists(dir + "/cut.partial"));
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/whole")) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(ReadFile(dir + "/cut/" + name), ReadFile(entry.path().string())) << name;
    ++files;
  }
  EXPECT_GT(files, 10);  // > 3 train shards, val, meta.json, tokenizer.model

  RunningProcess other(kTokenizer, With(args, {"--out", dir + "/other", "--stop-after-shards", "1"}));
  ASSERT_EQ(other.Wait(120), 3);
  RunningProcess changed(kTokenizer, With(args, {"--out", dir + "/other", "--val-fraction", "0.2"}));
  ASSERT_EQ(changed.Wait(120), 0) << changed.output();
  EXPECT_TRUE(
      changed.WaitForOutput("discarding the unfinished " + dir + "/other.partial: its 'val_fraction' differs", 10))
      << changed.output();
}

TEST(Tokenize, TextFilesAreDocumentsAndValidateOnTheTailOfTheirConcatenation) {
  const std::string dir = ScratchDir("tok_text_files");
  const std::string model = TrainedModel(dir);
  std::filesystem::create_directories(dir + "/in/sub");
  std::string a, b;
  for (int i = 0; i < 100; ++i) a += "Line " + std::to_string(i) + " of the first file.\n";
  for (int i = 0; i < 100; ++i) b += "Line " + std::to_string(i) + " of the second file.\n";
  WriteText(dir + "/in/a.txt", a);
  WriteText(dir + "/in/sub/b.txt", b);
  Config config = MakeConfig(dir, 128);
  config.data.files = {dir + "/in"};  // a directory: every file below, sorted
  config.data.val_fraction = 0.25;
  config.data.tokenizer = model;
  auto cache = EnsureTokenized(config, BinDir() + "/" + kTokenizer);
  ASSERT_TRUE(cache.ok()) << cache.status();
  const TokenManifest m = ReadManifest(*cache);
  EXPECT_EQ(m.documents, 3u);  // a.txt, the head of b.txt, its tail
  const std::vector<uint32_t> train = SplitIds(m.train), val = SplitIds(m.val);
  EXPECT_EQ(std::count(train.begin(), train.end(), 1u), 2);  // two BOS: a.txt and b.txt's head
  EXPECT_EQ(std::count(val.begin(), val.end(), 1u), 1);
  const std::string all = a + b;  // the cut: after the first '\n' at 75% of the concatenation's bytes
  const size_t val_begin = all.find('\n', static_cast<size_t>(static_cast<double>(all.size()) * 0.75)) + 1;
  ASSERT_GT(val_begin, a.size());
  EXPECT_EQ(std::count(val.begin(), val.end(), 3u), std::count(all.begin() + val_begin, all.end(), '\n'));
  EXPECT_EQ(val.back(), 2u);  // EOS ends b.txt's tail
}

TEST(Tokenize, InputErrorsNameTheKeyAndThePath) {
  const std::string dir = ScratchDir("tok_input_errors");
  std::filesystem::create_directories(dir + "/empty");
  Config config = MakeConfig(dir, 128);
  auto message = [&]() {
    auto cache = EnsureTokenized(config, BinDir() + "/" + kTokenizer);
    return cache.ok() ? std::string("ok") : std::string(cache.status().message());
  };
  config.data.files = {dir + "/nope.txt"};
  EXPECT_EQ(message(), "data.files: '" + dir + "/nope.txt' does not exist; fix the path in data.files");
  config.data.files = {dir + "/*.jsonl"};
  EXPECT_EQ(message(), "data.files: '" + dir + "/*.jsonl' matches no file");
  config.data.files = {dir + "/empty"};
  EXPECT_EQ(message(), "data.files: directory '" + dir + "/empty' holds no file; put the inputs in it");
  config.data.files = {Shakespeare()};
  config.data.val_files = {dir + "/val.txt"};
  EXPECT_EQ(message(), "data.val_files: '" + dir + "/val.txt' does not exist; fix the path in data.val_files");
  // A text too small for the vocabulary: the hint says so (before, it said the vocabulary had to be larger).
  {
    std::ofstream small(dir + "/small.txt");
    for (int i = 0; i < 200; ++i) small << "to be or not to be, that is the question.\n";
  }
  RunningProcess made(kTokenizer, {"--text", dir + "/small.txt", "--vocab-size", "128", "--out", dir + "/small"});
  EXPECT_EQ(made.Wait(120), 1) << made.output();
  const std::string small = made.output();
  EXPECT_NE(small.find("the text is too small to learn that many pieces: give more text (data.text, data.files) or a "
                       "smaller model.vocab_size"),
            std::string::npos)
      << small;
  EXPECT_NE(small.find("Vocabulary size too high (128)"), std::string::npos) << small;
}

}  // namespace
}  // namespace diloco::testing
