// tokenizer.json in diloco-tokenize (worker/tokenizer/hf_tokenizer.h) against the tokenizers library itself:
// tests/golden/make_tokenizer_json.py trains, at test time, one small BPE tokenizer of each kind we read (GPT-2's
// ByteLevel; Llama 3's and Qwen2's Split regex + ByteLevel, Qwen2 with NFC; Llama 2's byte_fallback with Prepend +
// Replace; byte_fallback with Metaspace) on a text with accents, CJK, emoji, tabs, runs of spaces and long digit runs
// plus tinyshakespeare lines, and writes Tokenizer.encode(text, add_special_tokens=False).ids and decode(ids). The
// real binary must print exactly those ids and that text, put them in shards with the BOS / EOS of the config.json
// beside the tokenizer (on several threads, as the SentencePiece path), and refuse what it does not implement with
// one line naming the component. With --add-special-tokens it prints Tokenizer.encode(text).ids, the post-processor's
// special tokens around them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "config/config_loader.h"
#include "config/data_cache.h"
#include "config/subprocess.h"
#include "tests/process_harness.h"
#include "worker/data/token_manifest.h"

namespace diloco::testing {
namespace {

const std::string kTokenizer = "diloco-tokenize";
const char* const kKinds[] = {"gpt2", "llama3", "qwen2", "llama2", "metaspace"};
// Encode and decode also run a Split regex that matches empty (make_tokenizer_json.py "lookahead"): the library splits
// at an empty match (before, those were dropped: "the" stayed one word and took the merge of "th" and "e").
const char* const kEncodeKinds[] = {"gpt2", "llama3", "qwen2", "llama2", "metaspace", "lookahead"};

// The golden files, made once per test process, in a directory of the process's own (ctest runs each test in a
// process of its own, two at a time with -j2: a shared directory would be remade under the other's feet).
class TokenizerJsonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ScratchDir("tokenizer_json_" + std::to_string(::getpid()));
    if (!std::filesystem::exists(DILOCO_PYTHON)) return;
    ASSERT_EQ(Shell(std::string(DILOCO_PYTHON) + " " + SourceDir() + "/tests/golden/make_tokenizer_json.py " + dir_ +
                    " " + SourceDir() + "/tests/data/tinyshakespeare.txt"),
              0);
    golden_ = ReadJson(dir_ + "/golden.json");
  }
  void SetUp() override {
    if (!std::filesystem::exists(DILOCO_PYTHON)) GTEST_SKIP() << "no Python with tokenizers at " << DILOCO_PYTHON;
  }
  static std::string Model(const std::string& kind) { return dir_ + "/" + kind + "/tokenizer.json"; }

  static std::string dir_;
  static nlohmann::json golden_;
};
std::string TokenizerJsonTest::dir_;
nlohmann::json TokenizerJsonTest::golden_;

// Runs diloco-tokenize with args to its end: its exit code and its whole output (stdout + stderr).
std::pair<int, std::string> RunTokenizer(const std::vector<std::string>& args) { return RunToEnd(kTokenizer, args); }

std::string JoinIds(const std::vector<int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  return out;
}

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

TEST_F(TokenizerJsonTest, EncodePrintsTheLibrarysIdsAndDecodeItsText) {
  const auto& texts = golden_.at("texts");
  for (const char* kind : kEncodeKinds) {
    const auto& k = golden_.at("kinds").at(kind);
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const std::string ids = JoinIds(k.at("ids")[i].get<std::vector<int>>());
      const auto [encoded, ids_line] = RunTokenizer({"encode", "--model", Model(kind), "--text", text});
      ASSERT_EQ(encoded, 0) << ids_line;
      EXPECT_EQ(ids_line, ids + "\n") << kind << ": '" << text << "'";
      const auto [decoded, back] = RunTokenizer({"decode", "--model", Model(kind), "--ids", ids});
      ASSERT_EQ(decoded, 0) << back;
      EXPECT_EQ(back, k.at("decoded")[i].get<std::string>()) << kind << ": '" << text << "'";
      // Byte-level without a normalizer gives the text back (decode skips special tokens, as the library's does).
      const bool lossless =
          (std::string(kind) == "gpt2" || std::string(kind) == "llama3" || std::string(kind) == "lookahead") &&
          text.find("<|bos|>") == std::string::npos && text.find("<|pad|>") == std::string::npos;
      if (lossless) EXPECT_EQ(back, text) << kind;
    }
  }
}

// Ill-formed UTF-8 (a cut 4-byte and 3-byte sequence, an encoded surrogate, an overlong form, a cut CJK character at
// the end): encoded as the library encodes the text Python's decode(errors="replace") makes, one U+FFFD per maximal
// subpart, and the byte-level kinds decode the bytes' own tokens as Rust's from_utf8_lossy does. Before, each bad
// byte became a U+FFFD of its own ("\xf0\x9f\x98A" gave three).
TEST_F(TokenizerJsonTest, IllFormedUtf8IsReplacedPerMaximalSubpartAsTheLibraryDoes) {
  const std::string hex = golden_.at("invalid_hex").get<std::string>();
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  for (const char* kind : kKinds) {
    const auto& k = golden_.at("kinds").at(kind);
    const auto [encoded, ids_line] = RunTokenizer({"encode", "--model", Model(kind), "--text", bytes});
    ASSERT_EQ(encoded, 0) << ids_line;
    EXPECT_EQ(ids_line, JoinIds(k.at("invalid_ids").get<std::vector<int>>()) + "\n") << kind;
    if (!k.contains("cut_ids")) continue;
    const auto [decoded, back] =
        RunTokenizer({"decode", "--model", Model(kind), "--ids", JoinIds(k.at("cut_ids").get<std::vector<int>>())});
    ASSERT_EQ(decoded, 0) << back;
    EXPECT_EQ(back, k.at("cut_decoded").get<std::string>()) << kind;
  }
}

TEST_F(TokenizerJsonTest, ShardsHoldTheIdsWithBosAndEosPerDocumentOnAnyNumberOfThreads) {
  const auto& texts = golden_.at("texts");
  std::string jsonl;
  for (const auto& t : texts) jsonl += nlohmann::json({{"text", t}}).dump() + "\n";
  std::ofstream(dir_ + "/docs.jsonl") << jsonl;
  std::ofstream(dir_ + "/val.jsonl") << nlohmann::json({{"text", "All:\nSpeak, speak."}}).dump() << "\n";
  for (const char* kind : {"gpt2", "llama2"}) {
    const auto& k = golden_.at("kinds").at(kind);
    std::vector<uint32_t> expected;
    for (size_t i = 0; i < texts.size(); ++i) {
      expected.push_back(k.at("bos").get<uint32_t>());
      for (int id : k.at("ids")[i]) expected.push_back(static_cast<uint32_t>(id));
      expected.push_back(k.at("eos").get<uint32_t>());
    }
    for (const char* threads : {"1", "2"}) {
      const std::string out = dir_ + "/cache-" + kind + "-" + threads;
      const auto [code, output] = RunTokenizer(
          {"--format", "jsonl", "--input", dir_ + "/docs.jsonl", "--val-input", dir_ + "/val.jsonl", "--vocab-size",
           "1024", "--tokenizer-model", Model(kind), "--threads", threads, "--work-item-bytes", "100", "--out", out});
      ASSERT_EQ(code, 0) << output;
      TokenManifest manifest;
      std::string error;
      ASSERT_TRUE(ReadTokenManifest(out + "/meta.json", &manifest, &error)) << error;
      EXPECT_EQ(manifest.bos_id, k.at("bos").get<int64_t>());
      EXPECT_EQ(manifest.eos_id, k.at("eos").get<int64_t>());
      EXPECT_EQ(manifest.tokenizer, "tokenizer.json");
      EXPECT_EQ(manifest.documents, texts.size() + 1);
      EXPECT_EQ(SplitIds(manifest.train), expected) << kind << " on " << threads << " threads";
      EXPECT_EQ(ReadFile(out + "/tokenizer.json"), ReadFile(Model(kind)));
    }
  }
}

// --format text: a document (a whole file) is cut into work items at line ends and encoded item by item on several
// threads; the shards hold [BOS] + the ids of one encode() of the whole file + [EOS], whatever the cuts. Before, the
// Metaspace / Prepend kinds (Llama 2, Mistral) put a "▁" in front of every item, and a cut inside a run of
// newlines or before a line's leading spaces split what the byte-level regexes (GPT-2, Llama 3, Qwen2) keep as one
// word.
TEST_F(TokenizerJsonTest, TextShardsHoldTheIdsOfTheWholeFileHoweverItIsCut) {
  const std::string document = golden_.at("document").get<std::string>();
  std::ofstream(dir_ + "/document.txt") << document;
  std::ofstream(dir_ + "/val.txt") << "All:\nSpeak, speak.\n";
  for (const char* kind : kKinds) {
    const auto& k = golden_.at("kinds").at(kind);
    std::vector<uint32_t> expected = {k.at("bos").get<uint32_t>()};
    for (int id : k.at("document_ids")) expected.push_back(static_cast<uint32_t>(id));
    expected.push_back(k.at("eos").get<uint32_t>());
    for (const char* item_bytes : {"40", "97", "1048576"}) {
      const std::string out = dir_ + "/text-cache-" + kind + "-" + item_bytes;
      const auto [code, output] = RunTokenizer(
          {"--format", "text", "--input", dir_ + "/document.txt", "--val-input", dir_ + "/val.txt", "--vocab-size",
           "1024", "--tokenizer-model", Model(kind), "--threads", "2", "--work-item-bytes", item_bytes, "--out", out});
      ASSERT_EQ(code, 0) << output;
      TokenManifest manifest;
      std::string error;
      ASSERT_TRUE(ReadTokenManifest(out + "/meta.json", &manifest, &error)) << error;
      EXPECT_EQ(SplitIds(manifest.train), expected) << kind << " in work items of " << item_bytes << " bytes";
    }
  }
}

// A SentencePiece model without our "<nl>" symbol (Llama 2's, Mistral's tokenizer.model) encodes a text, and a
// --format text document however it is cut into work items, as the sentencepiece library does: the whole text in
// one call, the dummy prefix "▁" at its start only. Before, the text was encoded line by line: every line after the
// first started with a "▁" neither the library nor transformers puts there.
TEST_F(TokenizerJsonTest, ASentencePieceModelWithoutANewlineSymbolEncodesAsTheLibraryDoes) {
  const std::string model = dir_ + "/sp_llama2/tokenizer.model";
  const auto& sp = golden_.at("sentencepiece");
  const auto& texts = golden_.at("texts");
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string ids = JoinIds(sp.at("ids")[i].get<std::vector<int>>());
    const auto [encoded, ids_line] = RunTokenizer({"encode", "--model", model, "--text", texts[i]});
    ASSERT_EQ(encoded, 0) << ids_line;
    EXPECT_EQ(ids_line, ids + "\n") << "'" << texts[i].get<std::string>() << "'";
    const auto [decoded, back] = RunTokenizer({"decode", "--model", model, "--ids", ids});
    ASSERT_EQ(decoded, 0) << back;
    EXPECT_EQ(back, sp.at("decoded")[i].get<std::string>()) << "'" << texts[i].get<std::string>() << "'";
  }
  const std::string document = golden_.at("document").get<std::string>();
  std::ofstream(dir_ + "/sp-document.txt") << document;
  std::ofstream(dir_ + "/sp-val.txt") << "All:\nSpeak, speak.\n";
  std::vector<uint32_t> expected = {sp.at("bos").get<uint32_t>()};
  for (int id : sp.at("document_ids")) expected.push_back(static_cast<uint32_t>(id));
  expected.push_back(sp.at("eos").get<uint32_t>());
  for (const char* item_bytes : {"40", "97", "1048576"}) {
    const std::string out = dir_ + "/sp-text-cache-" + item_bytes;
    const auto [code, output] = RunTokenizer({"--format", "text", "--input", dir_ + "/sp-document.txt", "--val-input",
                                              dir_ + "/sp-val.txt", "--vocab-size", "1000", "--tokenizer-model", model,
                                              "--threads", "2", "--work-item-bytes", item_bytes, "--out", out});
    ASSERT_EQ(code, 0) << output;
    TokenManifest manifest;
    std::string error;
    ASSERT_TRUE(ReadTokenManifest(out + "/meta.json", &manifest, &error)) << error;
    EXPECT_EQ(manifest.tokenizer, "tokenizer.model");
    EXPECT_EQ(SplitIds(manifest.train), expected) << "in work items of " << item_bytes << " bytes";
  }
}

// The prompt's ids with the special tokens the post-processor adds, as Tokenizer.encode(text).ids gives them: none
// (gpt2's ByteLevel, qwen2's none), BOS through a Sequence (llama3), BOS and EOS from a template (llama2), cls and sep
// (metaspace's RobertaProcessing).
TEST_F(TokenizerJsonTest, EncodeWithSpecialTokensPrintsTheLibrarysIds) {
  const auto& texts = golden_.at("texts");
  for (const char* kind : kKinds) {
    const auto& k = golden_.at("kinds").at(kind);
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto [code, ids_line] =
          RunTokenizer({"encode", "--model", Model(kind), "--text", texts[i], "--add-special-tokens"});
      ASSERT_EQ(code, 0) << ids_line;
      EXPECT_EQ(ids_line, JoinIds(k.at("special_ids")[i].get<std::vector<int>>()) + "\n") << kind << ": " << texts[i];
    }
  }
}

// diloco-tokenize digest, which the coordinator and workers compare at Join: the reference digest
// (tests/golden/vocab_digest.py) of the pieces tokenizers' id_to_token gives, added tokens included (llama2's
// normalized added tokens in their normalized form, "▁sword"); every kind's vocabulary differs, and so does its
// digest, but lookahead's, gpt2's vocabulary under another pre-tokenizer (the ids stand for the same pieces).
TEST_F(TokenizerJsonTest, TheVocabularyDigestIsTheReferencesOverTheLibrarysTokens) {
  std::map<std::string, std::string> digests;  // by kind
  for (const char* kind : kEncodeKinds) {
    const auto [code, ours] = RunTokenizer({"digest", "--model", Model(kind)});
    ASSERT_EQ(code, 0) << ours;
    const std::string reference = dir_ + "/" + kind + "/digest.txt";
    ASSERT_EQ(Shell(std::string(DILOCO_PYTHON) + " " + SourceDir() + "/tests/golden/vocab_digest.py " + Model(kind) +
                    " > " + reference),
              0);
    EXPECT_EQ(ours, ReadFile(reference)) << kind;
    EXPECT_EQ(ours.size(), 17u) << ours;  // 16 hex digits and a newline
    digests[kind] = ours;
  }
  EXPECT_EQ(digests["lookahead"], digests["gpt2"]);
  digests.erase("lookahead");
  std::set<std::string> distinct;
  for (const auto& [kind, digest] : digests) distinct.insert(digest);
  EXPECT_EQ(distinct.size(), digests.size());
}

// A post-processor we do not read does not stop the file from tokenizing text (training adds no special tokens);
// a prompt with its special tokens is refused with one line naming it.
TEST_F(TokenizerJsonTest, AnUnknownPostProcessorIsNamedOnlyWhereItIsNeeded) {
  nlohmann::json j = ReadJson(Model("gpt2"));
  j["post_processor"] = {{"type", "Lookahead"}};
  std::filesystem::create_directories(dir_ + "/odd");
  const std::string path = dir_ + "/odd/tokenizer.json";
  std::ofstream(path) << j.dump();
  const auto [plain, plain_ids] = RunTokenizer({"encode", "--model", path, "--text", "x"});
  ASSERT_EQ(plain, 0) << plain_ids;
  EXPECT_EQ(plain_ids, JoinIds(golden_["kinds"]["gpt2"]["ids"].back().get<std::vector<int>>()) + "\n");
  const auto [code, output] = RunTokenizer({"encode", "--model", path, "--text", "x", "--add-special-tokens"});
  EXPECT_EQ(code, 1);
  EXPECT_NE(
      output.find("diloco-tokenize: error: encoding failed: " + path + ": post_processor Lookahead is not implemented"),
      std::string::npos)
      << output;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
}

// Tokenizes the first golden text with kind's tokenizer.json alone (no config.json beside it) and reads the manifest.
TokenManifest TokenizeAlone(const std::string& dir, const std::string& kind, const nlohmann::json& golden) {
  std::filesystem::create_directories(dir + "/alone-" + kind);
  std::filesystem::copy_file(dir + "/" + kind + "/tokenizer.json", dir + "/alone-" + kind + "/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/one.jsonl") << nlohmann::json({{"text", golden["texts"][0]}}).dump() << "\n";
  std::ofstream(dir + "/one-val.jsonl") << nlohmann::json({{"text", "x"}}).dump() << "\n";
  const std::string out = dir + "/cache-alone-" + kind;
  const auto [code, output] = RunTokenizer({"--format", "jsonl", "--input", dir + "/one.jsonl", "--val-input",
                                            dir + "/one-val.jsonl", "--vocab-size", "1024", "--tokenizer-model",
                                            dir + "/alone-" + kind + "/tokenizer.json", "--out", out});
  EXPECT_EQ(code, 0) << output;
  TokenManifest manifest;
  std::string error;
  EXPECT_TRUE(ReadTokenManifest(out + "/meta.json", &manifest, &error)) << error;
  return manifest;
}

TEST_F(TokenizerJsonTest, WithoutTheModelsConfigDocumentsHaveNoBosOrEos) {
  const TokenManifest manifest = TokenizeAlone(dir_, "gpt2", golden_);
  EXPECT_EQ(manifest.bos_id, -1);
  EXPECT_EQ(manifest.eos_id, -1);
  std::vector<uint32_t> expected;
  for (int id : golden_["kinds"]["gpt2"]["ids"][0]) expected.push_back(static_cast<uint32_t>(id));
  EXPECT_EQ(SplitIds(manifest.train), expected);
}

// Without the model's config, the post-processor's template names BOS / EOS: both from llama2's "<|bos|> $A <|eos|>",
// BOS alone from llama3's (inside a Sequence).
TEST_F(TokenizerJsonTest, WithoutTheModelsConfigTheTemplateNamesBosAndEos) {
  const TokenManifest llama2 = TokenizeAlone(dir_, "llama2", golden_);
  EXPECT_EQ(llama2.bos_id, golden_["kinds"]["llama2"]["bos"].get<int64_t>());
  EXPECT_EQ(llama2.eos_id, golden_["kinds"]["llama2"]["eos"].get<int64_t>());
  const TokenManifest llama3 = TokenizeAlone(dir_, "llama3", golden_);
  EXPECT_EQ(llama3.bos_id, golden_["kinds"]["llama3"]["bos"].get<int64_t>());
  EXPECT_EQ(llama3.eos_id, -1);
}

// A run stopped after some shards resumes from them with a tokenizer.json as with a SentencePiece model (it used to
// find no tokenizer.model in the unfinished directory and start over), and ends with the same files as a run that
// was not stopped.
TEST_F(TokenizerJsonTest, AnInterruptedRunResumesFromTheLastFinishedShard) {
  const std::vector<std::string> args = {"--text",
                                         SourceDir() + "/tests/data/tinyshakespeare.txt",
                                         "--vocab-size",
                                         "1024",
                                         "--tokenizer-model",
                                         Model("llama3"),
                                         "--shard-tokens",
                                         "20000",
                                         "--work-item-bytes",
                                         "16384",
                                         "--threads",
                                         "2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), args.begin(), args.end());
    return more;
  };
  const auto [whole_code, whole_log] = RunTokenizer(with({"--out", dir_ + "/resume-whole"}));
  ASSERT_EQ(whole_code, 0) << whole_log;
  const auto [first_code, first_log] = RunTokenizer(with({"--out", dir_ + "/resume-cut", "--stop-after-shards", "2"}));
  ASSERT_EQ(first_code, 3) << first_log;
  const auto [rest_code, rest_log] = RunTokenizer(with({"--out", dir_ + "/resume-cut"}));
  ASSERT_EQ(rest_code, 0) << rest_log;
  EXPECT_NE(rest_log.find("resuming " + dir_ + "/resume-cut.partial after 2 train and 0 validation shards"),
            std::string::npos)
      << rest_log;
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/resume-whole")) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(ReadFile(dir_ + "/resume-cut/" + name), ReadFile(entry.path().string())) << name;
    ++files;
  }
  EXPECT_GT(files, 5);  // > 2 train shards, val, meta.json, tokenizer.json, config.json
}

TEST_F(TokenizerJsonTest, DataTokenizerMakesTheTokenCacheWithIt) {
  std::ofstream(dir_ + "/train.txt") << "First Citizen:\nBefore we proceed any further, hear me speak.\n";
  std::ofstream(dir_ + "/valid.txt") << "All:\nSpeak, speak.\n";
  auto config = ParseConfig("model: {vocab_size: 1024}\n", "test", {"data.cache_dir=" + dir_ + "/cache"});
  ASSERT_TRUE(config.ok()) << config.status();
  config->data.files = {dir_ + "/train.txt"};
  config->data.val_files = {dir_ + "/valid.txt"};
  config->data.tokenizer = Model("llama3");
  auto cache = EnsureTokenized(*config, BinDir() + "/" + kTokenizer);
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_EQ(cache->tokenizer_path(), cache->dir + "/tokenizer.json");
  TokenManifest manifest;
  std::string error;
  ASSERT_TRUE(ReadTokenManifest(cache->meta_path(), &manifest, &error)) << error;
  const auto [code, ids_line] = RunTokenizer({"encode", "--model", Model("llama3"), "--text",
                                              "First Citizen:\nBefore we proceed any further, hear me speak.\n"});
  ASSERT_EQ(code, 0) << ids_line;
  std::vector<uint32_t> expected = {golden_["kinds"]["llama3"]["bos"].get<uint32_t>()};
  std::istringstream in(ids_line);
  for (uint32_t id; in >> id;) expected.push_back(id);
  expected.push_back(golden_["kinds"]["llama3"]["eos"].get<uint32_t>());
  EXPECT_EQ(SplitIds(manifest.train), expected);
}

TEST_F(TokenizerJsonTest, WhatIsNotImplementedIsRefusedWithOneLineNamingIt) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"WordPiece", "the model WordPiece is not supported"},
      {"Unigram", "the model Unigram is not supported"},
      {"Lowercase", "the normalizer Lowercase is not supported"},
      {"Whitespace", "the pre-tokenizer Whitespace is not supported"},
      {"WordPiece-decoder", "the decoder WordPiece is not supported"}};
  for (const auto& [file, message] : cases) {
    const std::string path = dir_ + "/refused/" + file + ".json";
    const auto [code, output] = RunTokenizer({"encode", "--model", path, "--text", "hello"});
    EXPECT_EQ(code, 1);
    EXPECT_NE(output.find("diloco-tokenize: error: " + path + ": " + message), std::string::npos) << output;
    EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  }
  // Given for a token cache, the tokenizer is named as given (before: as its copy in the cache being written).
  const std::string unigram = dir_ + "/refused/Unigram.json";
  std::ofstream(dir_ + "/refused-input.txt") << "First Citizen:\nBefore we proceed.\n";
  const auto [code, output] = RunTokenizer({"--format", "text", "--input", dir_ + "/refused-input.txt", "--val-input",
                                            dir_ + "/refused-input.txt", "--vocab-size", "1024", "--tokenizer-model",
                                            unigram, "--out", dir_ + "/refused-cache"});
  EXPECT_NE(code, 0);
  EXPECT_NE(output.find(unigram + ": the model Unigram is not supported"), std::string::npos) << output;
}

}  // namespace
}  // namespace diloco::testing
