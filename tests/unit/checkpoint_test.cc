// Coordinator checkpoints (proto/checkpoint.h): round trip, corruption and truncation detection, pruning.
#include "proto/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "tests/unit/scratch_dir_test.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class CheckpointTest : public ScratchDirTest {
 protected:
  static CheckpointData Sample() {
    CheckpointData d;
    d.round = 7;
    d.fingerprint = "0123456789abcdef";
    d.params = {{"emb.weight", at::randn({4, 3})}, {"head.bias", at::randn({5})}, {"scalar", at::randn({})}};
    for (const auto& [name, t] : d.params) d.momentum.push_back(at::randn(t.sizes()));
    d.evals = {{0, 5.5, 0, 0}, {3, 4.25, 3000, 123456}, {7, 3.125, 7000, 288064}};
    return d;
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // `bytes` (a checkpoint file with its checksum, edited) written to `path` as `version`, with the checksum redone.
  static void WriteAsVersion(const std::string& path, uint32_t version, std::string bytes) {
    bytes.resize(bytes.size() - 8);
    std::memcpy(&bytes[8], &version, sizeof(version));
    const uint64_t h = XXH64(bytes.data(), bytes.size(), 0);
    bytes.append(reinterpret_cast<const char*>(&h), sizeof(h));
    WriteAll(path, bytes);
  }
  static void WriteAll(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::set<std::string> Files() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.insert(e.path().filename().string());
    return names;
  }
};

TEST_F(CheckpointTest, PathHasEightDigitRound) {
  EXPECT_EQ(CheckpointPath("/x/ckpts", 12), "/x/ckpts/ckpt-00000012.bin");
}

TEST_F(CheckpointTest, RoundTrip) {
  const CheckpointData saved = Sample();
  const std::string path = CheckpointPath(dir_.string(), saved.round);
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  EXPECT_EQ(Files(), (std::set<std::string>{"ckpt-00000007.bin"})) << "no .tmp left behind";

  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->round, 7);
  EXPECT_EQ(loaded->fingerprint, saved.fingerprint);
  ASSERT_EQ(loaded->params.size(), saved.params.size());
  for (size_t i = 0; i < saved.params.size(); ++i) {
    EXPECT_EQ(loaded->params[i].first, saved.params[i].first);
    EXPECT_EQ(loaded->params[i].second.sizes(), saved.params[i].second.sizes());
    EXPECT_TRUE(loaded->params[i].second.equal(saved.params[i].second)) << saved.params[i].first;
  }
  ASSERT_EQ(loaded->momentum.size(), saved.momentum.size());
  for (size_t i = 0; i < saved.momentum.size(); ++i) {
    EXPECT_TRUE(loaded->momentum[i].equal(saved.momentum[i])) << "momentum " << i;
  }
  ASSERT_EQ(loaded->evals.size(), 3u);
  EXPECT_EQ(loaded->evals[2].round, 7);
  EXPECT_EQ(loaded->evals[2].val_loss, 3.125);
  EXPECT_EQ(loaded->evals[0].val_loss, 5.5);
  EXPECT_EQ(loaded->evals[1].tokens, 3000);
  EXPECT_EQ(loaded->evals[2].bytes_pushed_committed, 288064);
}

// Tensors large enough that the load reads them in several 16 MiB blocks, with O_DIRECT for their 4 KiB-aligned
// interior and the page cache for the unaligned head and tail (odd sizes put every tensor at an unaligned offset):
// every element comes back, and a byte flipped inside a directly read interior is caught by the checksum.
TEST_F(CheckpointTest, RoundTripOfLargeTensorsAtUnalignedOffsets) {
  CheckpointData saved;
  saved.round = 3;
  saved.fingerprint = "large";
  saved.params = {{"odd", at::randn({3})}, {"big", at::randn({5'000'001})}, {"mid", at::randn({1023, 1025})}};
  for (const auto& [name, t] : saved.params) saved.momentum.push_back(at::randn(t.sizes()));
  const std::string path = CheckpointPath(dir_.string(), saved.round);
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());

  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->params.size(), 3u);
  for (size_t i = 0; i < saved.params.size(); ++i) {
    EXPECT_TRUE(loaded->params[i].second.equal(saved.params[i].second)) << saved.params[i].first;
    EXPECT_TRUE(loaded->momentum[i].equal(saved.momentum[i])) << "momentum " << i;
  }
  // In place: the loaded tensors are ordinary float32 tensors the outer step can update.
  loaded->params[1].second.add_(1.0f);
  EXPECT_TRUE(loaded->params[1].second.equal(saved.params[1].second + 1.0f));

  std::string bytes = ReadAll(path);
  bytes[bytes.size() / 3] ^= 0x10;  // inside "big"'s data, far from any tensor's head or tail
  WriteAll(path, bytes);
  absl::StatusOr<CheckpointData> corrupt = LoadCheckpoint(path);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr("checksum"));
}

// A version-1 file (evals without tokens and bytes, written by earlier releases) still loads, with those zero.
TEST_F(CheckpointTest, VersionOneFileStillLoads) {
  CheckpointData saved = Sample();
  saved.evals = {{4, 2.5, 99, 77}};
  const std::string path = CheckpointPath(dir_.string(), saved.round);
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  std::string bytes = ReadAll(path);
  // Tail of version 5: ... uint32 count, int64 round, f64 loss, int64 tokens, int64 bytes, then the member section
  // (uint64 theta_id 0, uint32 0: members_config "", uint32 0 members), the theta id section (uint32 0), the run
  // totals (uint8 flag, 3 x int64), uint64 xxh64.
  bytes.erase(bytes.size() - 8 - 25, 25);  // drop the run totals
  bytes.erase(bytes.size() - 8 - 20, 20);  // the member and theta id sections
  bytes.erase(bytes.size() - 8 - 16, 16);  // and tokens and bytes
  WriteAsVersion(path, 1, bytes);
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->evals.size(), 1u);
  EXPECT_EQ(loaded->evals[0].round, 4);
  EXPECT_EQ(loaded->evals[0].val_loss, 2.5);
  EXPECT_EQ(loaded->evals[0].tokens, 0);
  EXPECT_EQ(loaded->evals[0].bytes_pushed_committed, 0);
  EXPECT_TRUE(loaded->params[0].second.equal(saved.params[0].second));
}

// Version 3 keeps the members the round committed with (a restarted coordinator expects them and knows which of
// their pushes counted); a version-2 file (no member section) still loads, with none.
TEST_F(CheckpointTest, MembersRoundTripAndAVersionTwoFileLoadsWithNone) {
  CheckpointData saved = Sample();
  saved.theta_id = 0xfedcba9876543210ULL;
  saved.members_config = "0123456789abcdef";
  saved.members = {{"worker-0", 0, 0, 1, 0, 6}, {"worker-1", 1, 2, 4, 17, -1}};
  const std::string path = CheckpointPath(dir_.string(), saved.round);
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->theta_id, 0xfedcba9876543210ULL);
  EXPECT_EQ(loaded->members_config, "0123456789abcdef");
  ASSERT_EQ(loaded->members.size(), 2u);
  EXPECT_EQ(loaded->members[1].id, "worker-1");
  EXPECT_EQ(loaded->members[1].shard_index, 1);
  EXPECT_EQ(loaded->members[1].shard_reader, 2);
  EXPECT_EQ(loaded->members[1].cluster_size, 4);
  EXPECT_EQ(loaded->members[1].inner_steps, 17);
  EXPECT_EQ(loaded->members[1].last_applied_base, -1);
  EXPECT_EQ(loaded->members[0].last_applied_base, 6);

  saved.members.clear();
  saved.members_config.clear();
  saved.theta_id = 0;
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  std::string bytes = ReadAll(path);
  bytes.erase(bytes.size() - 8 - 25, 25);  // version 5's run totals
  bytes.erase(bytes.size() - 8 - 20, 20);  // the (empty) member and theta id sections
  WriteAsVersion(path, 2, bytes);
  loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->members.empty());
  EXPECT_EQ(loaded->evals.size(), saved.evals.size());
}

// Version 4 keeps lost members (their `active` false) and the ids of the earlier thetas pushes may be computed
// against; a version-3 file (a member record without the flag, no theta id section) loads with every member active
// and no earlier ids.
TEST_F(CheckpointTest, LostMembersAndEarlierThetaIdsRoundTripAndAVersionThreeFileLoadsAsActive) {
  CheckpointData saved = Sample();
  saved.theta_id = 77;
  saved.members_config = "cfg";
  saved.members = {{"worker-0", 0, 0, 1, 0, 6, /*active=*/true}, {"worker-1", 1, 0, 1, 0, 4, /*active=*/false}};
  saved.earlier_theta_ids = {{5, 0x1111222233334444ULL}, {6, 55}};
  const std::string path = CheckpointPath(dir_.string(), saved.round);
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->members.size(), 2u);
  EXPECT_TRUE(loaded->members[0].active);
  EXPECT_FALSE(loaded->members[1].active);
  EXPECT_EQ(loaded->members[1].last_applied_base, 4);
  ASSERT_EQ(loaded->earlier_theta_ids.size(), 2u);
  EXPECT_EQ(loaded->earlier_theta_ids[0].round, 5);
  EXPECT_EQ(loaded->earlier_theta_ids[0].id, 0x1111222233334444ULL);
  EXPECT_EQ(loaded->earlier_theta_ids[1].round, 6);
  EXPECT_EQ(loaded->earlier_theta_ids[1].id, 55u);

  // The same file as version 3 wrote it: each member record without its flag (nor version 5's contributions), no
  // theta id section (nor run totals).
  saved.earlier_theta_ids.clear();
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  std::string bytes = ReadAll(path);
  bytes.erase(bytes.size() - 8 - 25, 25);           // version 5's run totals
  bytes.erase(bytes.size() - 8 - 4, 4);             // the (empty) theta id section
  const size_t record = 4 + 8 + 4 + 4 + 4 + 8 + 8;  // "worker-1" with its version 3 fields
  bytes.erase(bytes.size() - 8 - 25, 25);           // worker-1's flag and contributions
  bytes.erase(bytes.size() - 8 - record - 25, 25);  // worker-0's
  WriteAsVersion(path, 3, bytes);
  loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->members.size(), 2u);
  EXPECT_EQ(loaded->members[0].last_applied_base, 6);
  EXPECT_EQ(loaded->members[1].last_applied_base, 4);
  EXPECT_TRUE(loaded->members[0].active && loaded->members[1].active) << "version 3 recorded active members only";
  EXPECT_TRUE(loaded->earlier_theta_ids.empty());
}

// Version 5 keeps what each member contributed and the run's totals (status and summary.json go on from them after a
// restart; before, they started over from 0, the data-parallel figure always); a version-4 file loads with neither.
TEST_F(CheckpointTest, ContributionsAndRunTotalsRoundTripAndAVersionFourFileLoadsWithout) {
  CheckpointData saved = Sample();
  saved.members = {{"worker-0", 0, 0, 1, 0, 6, true, 7, 17920, 3000000},
                   {"worker-1", 1, 0, 1, 0, 6, false, 5, 12800, 1}};
  saved.totals = RunTotalsRecord{30720, 3000001, 9876543210LL};
  const std::string path = CheckpointPath(dir_.string(), saved.round);
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->members.size(), 2u);
  EXPECT_EQ(loaded->members[0].rounds_contributed, 7);
  EXPECT_EQ(loaded->members[0].tokens, 17920);
  EXPECT_EQ(loaded->members[0].bytes_pushed, 3000000);
  EXPECT_EQ(loaded->members[1].rounds_contributed, 5);
  EXPECT_FALSE(loaded->members[1].active);
  ASSERT_TRUE(loaded->totals.has_value());
  EXPECT_EQ(loaded->totals->tokens_committed, 30720);
  EXPECT_EQ(loaded->totals->bytes_pushed_committed, 3000001);
  EXPECT_EQ(loaded->totals->dp_equivalent_bytes, 9876543210LL);

  // Not recorded: a flag says so.
  saved.totals.reset();
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_FALSE(loaded->totals.has_value());

  // The same file as version 4 wrote it.
  std::string bytes = ReadAll(path);
  bytes.erase(bytes.size() - 8 - 25, 25);               // the run totals
  const size_t record = 4 + 8 + 4 + 4 + 4 + 8 + 8 + 1;  // "worker-1" with its version 4 fields
  bytes.erase(bytes.size() - 8 - 4 - 24, 24);           // worker-1's contributions (before the empty theta id section)
  bytes.erase(bytes.size() - 8 - 4 - record - 24, 24);  // worker-0's
  WriteAsVersion(path, 4, bytes);
  loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->members.size(), 2u);
  EXPECT_EQ(loaded->members[0].last_applied_base, 6);
  EXPECT_TRUE(loaded->members[0].active);
  EXPECT_FALSE(loaded->members[1].active);
  EXPECT_EQ(loaded->members[0].rounds_contributed, 0);
  EXPECT_FALSE(loaded->totals.has_value());
}

TEST_F(CheckpointTest, RoundTripWithoutMomentumOrEvals) {
  CheckpointData saved = Sample();
  saved.momentum.clear();
  saved.evals.clear();
  const std::string path = (dir_ / "plain.bin").string();
  ASSERT_TRUE(SaveCheckpoint(path, saved).ok());
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->momentum.empty());
  EXPECT_TRUE(loaded->evals.empty());
  EXPECT_TRUE(loaded->params[1].second.equal(saved.params[1].second));
}

// A tensor that cannot be written (here a sparse one: no contiguous storage; in a run, an allocation failing) makes
// the save an error, with its .tmp removed and no checkpoint: the writer's retries of the last round's checkpoint
// start clean. Before, the exception left SaveCheckpoint with the file open and the .tmp on disk.
TEST_F(CheckpointTest, ATensorThatCannotBeWrittenIsAnErrorAndLeavesNoFile) {
  CheckpointData saved = Sample();
  saved.params[1].second = saved.params[1].second.to_sparse();
  const std::string path = CheckpointPath(dir_.string(), 4);
  absl::Status s;
  EXPECT_NO_THROW(s = SaveCheckpoint(path, saved));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(s.message()).find("writing " + path + ".tmp failed: "), std::string::npos) << s;
  EXPECT_EQ(Files(), std::set<std::string>{});
}

TEST_F(CheckpointTest, FlippedByteIsDataLossChecksum) {
  const std::string path = CheckpointPath(dir_.string(), 1);
  ASSERT_TRUE(SaveCheckpoint(path, Sample()).ok());
  const std::string good = ReadAll(path);
  for (size_t pos : {size_t{8}, good.size() / 2, good.size() - 9, good.size() - 1}) {  // header, data, tail, hash
    std::string bad = good;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x01);
    WriteAll(path, bad);
    absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
    ASSERT_FALSE(loaded.ok()) << "byte " << pos;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << "byte " << pos;
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("checksum")) << "byte " << pos;
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(path));
  }
}

// A dimension with a high bit flipped (4 x (3 + 2^62) wraps to 12 elements in 64 bits) is caught by the shape check
// as a corrupt file, not built into a tensor (which threw out of LoadCheckpoint and ended the coordinator's start).
TEST_F(CheckpointTest, AShapeWhoseProductWrapsIsCorrupt) {
  const std::string path = CheckpointPath(dir_.string(), 1);
  ASSERT_TRUE(SaveCheckpoint(path, Sample()).ok());
  std::string bytes = ReadAll(path);
  const size_t name = bytes.find("emb.weight");
  ASSERT_NE(name, std::string::npos);
  const size_t dims = name + std::strlen("emb.weight") + sizeof(uint32_t);  // after the name and ndim
  int64_t d[2];
  std::memcpy(d, bytes.data() + dims, sizeof d);
  ASSERT_EQ(d[0], 4);
  ASSERT_EQ(d[1], 3);
  d[1] += int64_t{1} << 62;
  std::memcpy(bytes.data() + dims, d, sizeof d);
  WriteAll(path, bytes);
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, TruncatedFileIsRejected) {
  const std::string path = CheckpointPath(dir_.string(), 2);
  ASSERT_TRUE(SaveCheckpoint(path, Sample()).ok());
  const std::string good = ReadAll(path);
  for (size_t keep : {good.size() - 1, good.size() / 2, size_t{12}, size_t{0}}) {
    WriteAll(path, good.substr(0, keep));
    absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
    ASSERT_FALSE(loaded.ok()) << "kept " << keep << " bytes";
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << "kept " << keep << " bytes";
  }
}

TEST_F(CheckpointTest, MissingFileIsNotFound) {
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint((dir_ / "nope.bin").string());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("nope.bin"));
}

TEST_F(CheckpointTest, OtherFileIsNotACheckpoint) {
  const std::string path = (dir_ / "other.bin").string();
  WriteAll(path, "this is not a checkpoint at all, just text");
  absl::StatusOr<CheckpointData> loaded = LoadCheckpoint(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, LoadNewestSkipsCorruptFiles) {
  CheckpointData d = Sample();
  for (int64_t round : {1, 2, 3}) {
    d.round = round;
    ASSERT_TRUE(SaveCheckpoint(CheckpointPath(dir_.string(), round), d).ok());
  }
  const std::string newest = CheckpointPath(dir_.string(), 3);
  std::string bytes = ReadAll(newest);
  bytes[bytes.size() / 2] ^= 0x40;
  WriteAll(newest, bytes);
  std::vector<std::string> skipped;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->data.round, 2);
  EXPECT_EQ(loaded->path, CheckpointPath(dir_.string(), 2));
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("ckpt-00000003.bin"));
  EXPECT_THAT(skipped[0], HasSubstr("checksum"));
}

// A newest checkpoint that cannot be opened at all (here a directory by its name; permissions or an I/O error alike)
// stops the resume with its name: before, it was skipped as corrupt and an older checkpoint resumed (or theta_0,
// with none), and pruning then deleted the new run's checkpoints around the one left unreadable.
TEST_F(CheckpointTest, LoadNewestStopsAtAFileThatCannotBeOpened) {
  ASSERT_TRUE(SaveCheckpoint(CheckpointPath(dir_.string(), 1), Sample()).ok());
  fs::create_directories(CheckpointPath(dir_.string(), 2));
  std::vector<std::string> skipped;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_.string(), &skipped);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("ckpt-00000002.bin: cannot open"));
  EXPECT_TRUE(skipped.empty());
}

// A newest checkpoint in a format this build does not know (a newer diloco wrote it; its checksum holds) stops the
// resume with what to do: before, it was skipped as corrupt and the older one resumed, training its rounds again.
// A file whose version reads as newer only because a byte flipped fails its checksum and is skipped as before.
TEST_F(CheckpointTest, LoadNewestStopsAtACheckpointOfANewerFormat) {
  CheckpointData d = Sample();
  for (int64_t round : {1, 2}) {
    d.round = round;
    ASSERT_TRUE(SaveCheckpoint(CheckpointPath(dir_.string(), round), d).ok());
  }
  const std::string newest = CheckpointPath(dir_.string(), 2);
  WriteAsVersion(newest, 6, ReadAll(newest));
  std::vector<std::string> skipped;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_.string(), &skipped);
  ASSERT_FALSE(loaded.ok()) << "resumed from " << loaded->path;
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("ckpt-00000002.bin: format version 6 was written by a newer diloco"));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("run that version, or start with --fresh"));
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("an older checkpoint"));
  EXPECT_TRUE(skipped.empty());

  std::string flipped = ReadAll(newest);
  flipped[8] = 9;  // the version field, the checksum left as it was
  WriteAll(newest, flipped);
  loaded = LoadNewestCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->data.round, 1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("checksum"));
}

TEST_F(CheckpointTest, LoadNewestInEmptyDirIsNotFound) {
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir_.string(), nullptr);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(dir_.string()));
}

// --fresh: the earlier run's checkpoints go into before-fresh-<time>/ whole (other files stay), after which the
// directory has none to prune or resume; an empty directory has nothing to move.
TEST_F(CheckpointTest, SetAsideMovesEveryCheckpointIntoOneFolder) {
  auto nothing = SetAsideCheckpoints(dir_.string());
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(*nothing, "");
  CheckpointData d = Sample();
  for (int64_t round : {3, 4}) {
    d.round = round;
    ASSERT_TRUE(SaveCheckpoint(CheckpointPath(dir_.string(), round), d).ok());
  }
  WriteAll((dir_ / "notes.txt").string(), "keep me");
  auto aside = SetAsideCheckpoints(dir_.string());
  ASSERT_TRUE(aside.ok()) << aside.status();
  EXPECT_THAT(*aside, HasSubstr((dir_ / "before-fresh-").string()));
  EXPECT_EQ(Files(), (std::set<std::string>{fs::path(*aside).filename().string(), "notes.txt"}));
  EXPECT_FALSE(LoadNewestCheckpoint(dir_.string(), nullptr).ok());
  auto moved = LoadCheckpoint((fs::path(*aside) / "ckpt-00000004.bin").string());
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->round, 4);
  EXPECT_TRUE(fs::exists(fs::path(*aside) / "ckpt-00000003.bin"));
}

TEST_F(CheckpointTest, UnfinishedSavesAreRemovedAndCheckpointsKept) {
  ASSERT_TRUE(SaveCheckpoint(CheckpointPath(dir_.string(), 1), Sample()).ok());
  WriteAll(CheckpointPath(dir_.string(), 2) + ".tmp", "half a checkpoint");
  WriteAll((dir_ / "notes.bin.tmp").string(), "not ours");
  EXPECT_EQ(RemoveUnfinishedCheckpoints(dir_.string()), 1);
  EXPECT_EQ(Files(), (std::set<std::string>{"ckpt-00000001.bin", "notes.bin.tmp"}));
}

TEST_F(CheckpointTest, PruneKeepsNewestN) {
  CheckpointData d = Sample();
  for (int64_t round : {1, 9, 10, 100, 2}) {
    d.round = round;
    ASSERT_TRUE(SaveCheckpoint(CheckpointPath(dir_.string(), round), d).ok());
  }
  WriteAll((dir_ / "notes.txt").string(), "keep me");
  PruneCheckpoints(dir_.string(), 0);
  EXPECT_EQ(Files().size(), 6u) << "keep 0 keeps all";
  PruneCheckpoints(dir_.string(), 2);
  EXPECT_EQ(Files(), (std::set<std::string>{"ckpt-00000010.bin", "ckpt-00000100.bin", "notes.txt"}));
  PruneCheckpoints(dir_.string(), 5);
  EXPECT_EQ(Files().size(), 3u);
  absl::StatusOr<CheckpointData> newest = LoadCheckpoint(CheckpointPath(dir_.string(), 100));
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->round, 100);
}

}  // namespace
}  // namespace diloco
