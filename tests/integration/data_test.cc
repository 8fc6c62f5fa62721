// Real data end to end (docs/models-and-data.md "Data"): pre-tokenized files in nanoGPT's and llm.c's .bin formats
// (written by numpy
// from the ids of tinyshakespeare) and a jsonl corpus with a bad line train a run through diloco-launch, and the
// validation loss falls.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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

// diloco-launch on config/tiny.yaml with the run's files in `dir` and `data` as --set overrides (data.files and
// friends; data.text is then unused). Returns the run's summary.json after checking the exit code.
nlohmann::json Launch(const std::string& dir, const std::vector<std::string>& data) {
  std::vector<std::string> args = {SourceDir() + "/config/tiny.yaml", "--set", "run.output_dir=" + dir, "--set",
                                   "data.cache_dir=" + dir + "/cache"};
  for (const std::string& d : data) args.insert(args.end(), {"--set", d});
  RunningProcess launch("diloco-launch", args);
  EXPECT_EQ(launch.Wait(240), 0) << launch.output();
  return ReadJson(dir + "/summary.json");
}

// The token manifest of the run in `dir` (its only cache directory).
TokenManifest CacheManifest(const std::string& dir) {
  TokenManifest manifest;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/cache")) {
    if (!entry.is_directory()) continue;
    std::string error;
    EXPECT_TRUE(ReadTokenManifest(entry.path().string() + "/meta.json", &manifest, &error)) << error;
  }
  return manifest;
}

void ExpectLossFalls(const nlohmann::json& summary) {
  ASSERT_EQ(summary["round"].get<int64_t>(), 3) << summary.dump();
  const auto& evals = summary["evals"];
  ASSERT_GE(evals.size(), 2u) << summary.dump();
  const double first = evals.front()["val_loss"].get<double>(), last = evals.back()["val_loss"].get<double>();
  EXPECT_LT(last, first - 0.3) << "validation loss " << first << " -> " << last;
}

TEST(Data, NanoGptAndLlmcBinFilesTrainEndToEnd) {
  if (!std::filesystem::exists(DILOCO_PYTHON)) GTEST_SKIP() << "no Python with numpy at " << DILOCO_PYTHON;
  const std::string dir = ScratchDir("data_bin");
  // Real ids: tinyshakespeare through the tiny config's tokenizer, rewritten by numpy in the users' formats.
  auto config = LoadConfig(
      SourceDir() + "/config/tiny.yaml",
      {"data.text=" + SourceDir() + "/tests/data/tinyshakespeare.txt", "data.cache_dir=" + BinDir() + "/test-cache"});
  ASSERT_TRUE(config.ok()) << config.status();
  auto cache = EnsureTokenized(*config, BinDir() + "/diloco-tokenize");
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_EQ(Shell(std::string(DILOCO_PYTHON) + " " + SourceDir() + "/tests/integration/shard_to_bin.py " +
                  cache->train_path() + " " + dir + "/bin"),
            0);

  for (const std::string name : {"nanogpt", "llmc"}) {
    SCOPED_TRACE(name);
    const std::string run = dir + "/" + name;
    const nlohmann::json summary = Launch(run, {"data.files=[" + dir + "/bin/" + name + ".bin]", "data.format=tokens"});
    ExpectLossFalls(summary);
    const TokenManifest manifest = CacheManifest(run);  // the file is used in place, its header skipped
    ASSERT_EQ(manifest.train.size(), 1u);
    EXPECT_EQ(manifest.train[0].path, dir + "/bin/" + name + ".bin");
    EXPECT_EQ(manifest.train[0].offset, name == "llmc" ? 1024u : 0u);
  }
}

TEST(Data, JsonlCorpusWithABadLineTrainsAndCountsIt) {
  const std::string dir = ScratchDir("data_jsonl");
  // One document per paragraph of tinyshakespeare (paragraphs end at a blank line), and one line that is not JSON.
  std::ifstream in(SourceDir() + "/tests/data/tinyshakespeare.txt");
  std::ofstream out(dir + "/corpus.jsonl");
  std::string line, paragraph;
  int documents = 0;
  while (std::getline(in, line)) {
    if (!line.empty()) {
      paragraph += line + "\n";
      continue;
    }
    if (paragraph.empty()) continue;
    out << nlohmann::json{{"id", documents}, {"text", paragraph}}.dump() << "\n";
    if (++documents == 100) out << "{\"text\": broken\n";
    paragraph.clear();
  }
  out.close();
  ASSERT_GT(documents, 5000);

  const nlohmann::json summary =
      Launch(dir, {"data.files=[" + dir + "/*.jsonl]", "data.format=jsonl", "data.on_bad_record=skip"});
  ExpectLossFalls(summary);
  const TokenManifest manifest = CacheManifest(dir);
  EXPECT_EQ(manifest.bad_records, 1u);
  EXPECT_EQ(manifest.documents, static_cast<uint64_t>(documents));
}

}  // namespace
}  // namespace diloco::testing
