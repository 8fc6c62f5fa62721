#include "proto/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace diloco {
namespace {

constexpr char kMagic[8] = {'D', 'L', 'C', 'O', 'C', 'K', 'P', 'T'};
// Every version keeps the magic, the version right after it and the xxh64 trailer: a newer file is told from a
// corrupt one by its checksum (LoadCheckpoint).
constexpr uint32_t kVersion = 5;  // 2: evals carry tokens and bytes; 3: members; 4: lost members, earlier theta ids;
                                  // 5: members' contributions, the run's totals
constexpr uint32_t kMaxThetaIds = 1u << 20;  // a bound on a corrupt count (outer.max_staleness + 1 are written)
constexpr uint32_t kMaxMembers = 1u << 20;   // a bound on a corrupt count (coordinator.max_members is far below)

// Appends to a file while hashing every byte.
class HashingWriter {
 public:
  explicit HashingWriter(FILE* f) : f_(f), state_(XXH64_createState()) { XXH64_reset(state_, 0); }
  ~HashingWriter() { XXH64_freeState(state_); }
  void Bytes(const void* p, size_t n) {
    XXH64_update(state_, p, n);
    ok_ = ok_ && fwrite(p, 1, n, f_) == n;
  }
  template <typename T>
  void Pod(T v) {
    Bytes(&v, sizeof(v));
  }
  void String(const std::string& s) {
    Pod<uint32_t>(static_cast<uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  void Floats(const at::Tensor& t) {
    at::Tensor c = t.to(at::kFloat).contiguous();
    Bytes(c.data_ptr(), c.numel() * sizeof(float));
  }
  void Finish() {
    const uint64_t h = XXH64_digest(state_);
    ok_ = ok_ && fwrite(&h, 1, sizeof(h), f_) == sizeof(h);
  }
  bool ok() const { return ok_; }

 private:
  FILE* f_;
  XXH64_state_t* state_;
  bool ok_ = true;
};

// A load in three passes, so that the bulk of it runs on several threads: (1) the parser reads the small fields
// (headers, evals) through stdio and records where each tensor's data lies, seeking past it; (2) ReadAndVerify fills
// the tensors with parallel preads of 16 MiB on reader threads while (3) the calling thread hashes the body in file
// order, from the kept fields and each block as it arrives. Bounds are checked against the body's size (the file
// less its checksum).
// Pass 2 reads the 4 KiB-aligned interior of each tensor's data with O_DIRECT (the disk DMAs into the tensor: no page
// cache copy, which on a small machine costs more CPU than the disk leaves time for) and its unaligned head and tail,
// under 4 KiB each, through the page cache. For that, each tensor's memory is allocated so that its address is
// congruent to its file offset modulo 4 KiB (AlignedLike). Where O_DIRECT is refused (a file system without it), the
// whole read goes through the page cache.
class ScanningReader {
 public:
  static constexpr uint64_t kDirectAlign = 4096;

  ScanningReader(FILE* f, std::string path, uint64_t end) : f_(f), path_(std::move(path)), end_(end) {}
  bool Bytes(void* p, size_t n) {
    if (n > end_ - pos_ || fread(p, 1, n, f_) != n) return false;
    if (pieces_.empty() || pieces_.back().data.defined()) pieces_.emplace_back();
    pieces_.back().fields.append(static_cast<const char*>(p), n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Pod(T* v) {
    return Bytes(v, sizeof(T));
  }
  bool String(std::string* s) {
    uint32_t n = 0;
    if (!Pod(&n) || n > remaining()) return false;
    s->resize(n);
    return Bytes(s->data(), n);
  }
  // Allocates a float32 tensor of `dims` whose data comes next in the file (memory placed for O_DIRECT, see above),
  // records it and skips its bytes (ReadAndVerify reads them). False when the file is too short.
  bool Floats(const std::vector<int64_t>& dims, at::Tensor* t) {
    uint64_t numel = 1;
    for (int64_t d : dims) numel *= static_cast<uint64_t>(d);
    const uint64_t n = numel * sizeof(float);
    if (n > end_ - pos_ || fseeko(f_, static_cast<off_t>(n), SEEK_CUR) != 0) return false;
    *t = AlignedLike(dims, pos_ % kDirectAlign, n);
    pieces_.push_back(Piece{std::string(), *t, pos_});
    pos_ += n;
    return true;
  }
  bool AtEnd() const { return pos_ == end_; }
  uint64_t remaining() const { return end_ - pos_; }

  // Reads every tensor's data (pass 2) on `threads` threads while this thread hashes the body in file order as the
  // blocks arrive (pass 3); true when all of it was read and the 8 bytes after the body are its xxHash64.
  bool ReadAndVerify(int threads) {
    const int direct_fd = open(path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    std::vector<size_t> first_block;
    const std::vector<Block> blocks = PlanBlocks(direct_fd >= 0, &first_block);
    std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> state(XXH64_createState(), XXH64_freeState);
    XXH64_reset(state.get(), 0);
    bool ok = true;
    {
      BlockReader reader(blocks, direct_fd, fileno(f_), threads);
      for (size_t p = 0; p < pieces_.size() && ok; ++p) {
        if (!pieces_[p].data.defined()) {
          XXH64_update(state.get(), pieces_[p].fields.data(), pieces_[p].fields.size());
          continue;
        }
        const size_t last = p + 1 < pieces_.size() ? first_block[p + 1] : blocks.size();
        for (size_t i = first_block[p]; i < last && ok; ++i) {
          ok = reader.Wait(i);
          if (ok) XXH64_update(state.get(), blocks[i].dest, blocks[i].bytes);
        }
      }
    }  // the reader's threads stop after their current block and are joined
    if (direct_fd >= 0) close(direct_fd);
    uint64_t stored = 0;
    return ok && pread(fileno(f_), &stored, sizeof(stored), static_cast<off_t>(end_)) == sizeof(stored) &&
           XXH64_digest(state.get()) == stored;
  }

 private:
  // One read of the body: `bytes` at file `offset` into `dest`, with O_DIRECT (4 KiB-aligned interior) or buffered.
  struct Block {
    uint64_t offset, bytes;
    char* dest;
    bool direct;
  };

  // The blocks of every tensor's data in file order, at most 16 MiB each: a tensor's 4 KiB-aligned interior direct
  // (when `direct`), its head and tail buffered. first_block[p] is piece p's first block.
  std::vector<Block> PlanBlocks(bool direct, std::vector<size_t>* first_block) const {
    constexpr uint64_t kBlock = uint64_t{16} << 20;
    std::vector<Block> blocks;
    first_block->assign(pieces_.size(), 0);
    auto add = [&](uint64_t offset, uint64_t bytes, char* dest, bool is_direct) {
      for (uint64_t done = 0; done < bytes; done += kBlock) {
        blocks.push_back({offset + done, std::min(kBlock, bytes - done), dest + done, is_direct});
      }
    };
    for (size_t p = 0; p < pieces_.size(); ++p) {
      const Piece& piece = pieces_[p];
      (*first_block)[p] = blocks.size();
      if (!piece.data.defined()) continue;
      char* dest = static_cast<char*>(piece.data.data_ptr());
      const uint64_t begin = piece.offset;
      const uint64_t end = begin + static_cast<uint64_t>(piece.data.numel()) * sizeof(float);
      const uint64_t inner_begin = (begin + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      const uint64_t inner_end = end / kDirectAlign * kDirectAlign;
      if (!direct || inner_end <= inner_begin) {
        add(begin, end - begin, dest, false);
        continue;
      }
      add(begin, inner_begin - begin, dest, false);
      add(inner_begin, inner_end - inner_begin, dest + (inner_begin - begin), true);
      add(inner_end, end - inner_end, dest + (inner_end - begin), false);
    }
    return blocks;
  }

  // Reads `blocks` on a pool of threads (each takes the next unread block); Wait(i) blocks until block i arrived.
  // Thread-safety: Wait is called by the owning thread only; the destructor stops the pool after the blocks being
  // read and joins it.
  class BlockReader {
   public:
    BlockReader(const std::vector<Block>& blocks, int direct_fd, int buffered_fd, int threads)
        : blocks_(blocks), direct_fd_(direct_fd), buffered_fd_(buffered_fd), done_(blocks.size(), 0) {
      for (int t = 0; t < std::max(threads, 1); ++t) pool_.emplace_back([this] { ReadLoop(); });
    }
    ~BlockReader() {
      next_ = blocks_.size();
      for (std::thread& t : pool_) t.join();
    }
    // True once block i is read; false once any read failed.
    bool Wait(size_t i) {
      absl::MutexLock lock(&mu_);
      while (done_[i] == 0 && !failed_) arrived_.Wait(&mu_);
      return !failed_;
    }

   private:
    void ReadLoop() {
      for (size_t i = next_++; i < blocks_.size(); i = next_++) {
        const bool ok = ReadOne(blocks_[i]);
        absl::MutexLock lock(&mu_);
        done_[i] = 1;
        failed_ = failed_ || !ok;
        arrived_.SignalAll();
        if (failed_) return;
      }
    }
    bool ReadOne(const Block& b) const {
      int fd = b.direct ? direct_fd_ : buffered_fd_;
      for (uint64_t got = 0; got < b.bytes;) {
        const ssize_t n = pread(fd, b.dest + got, b.bytes - got, static_cast<off_t>(b.offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EINVAL && fd == direct_fd_) {  // O_DIRECT refused for this range: the page cache
          fd = buffered_fd_;
          continue;
        }
        if (n <= 0) return false;
        got += static_cast<uint64_t>(n);
      }
      return true;
    }

    const std::vector<Block>& blocks_;
    const int direct_fd_, buffered_fd_;
    std::atomic<size_t> next_{0};
    absl::Mutex mu_;
    absl::CondVar arrived_;  // signalled when a block is read or a read failed
    std::vector<char> done_ ABSL_GUARDED_BY(mu_);
    bool failed_ ABSL_GUARDED_BY(mu_) = false;
    std::vector<std::thread> pool_;
  };

  struct Piece {
    std::string fields;  // small fields, as read
    at::Tensor data;     // or a tensor's data, at `offset` in the file
    uint64_t offset = 0;
  };

  // A float32 tensor of `dims` (`bytes` of data) whose data address is `phase` bytes past a 4 KiB boundary, so that
  // file offsets and memory addresses are congruent modulo 4 KiB. Its memory is freed with the tensor.
  static at::Tensor AlignedLike(const std::vector<int64_t>& dims, uint64_t phase, uint64_t bytes) {
    const uint64_t size = (phase + bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign + kDirectAlign;
    void* base = std::aligned_alloc(kDirectAlign, size);
    if (base == nullptr) throw std::bad_alloc();
    return at::from_blob(
        static_cast<char*>(base) + phase, dims, [base](void*) { std::free(base); }, at::kFloat);
  }

  FILE* f_;
  std::string path_;
  uint64_t end_;
  uint64_t pos_ = 0;
  std::vector<Piece> pieces_;
};

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", what));
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int64_t round) {
  return absl::StrFormat("%s/ckpt-%08d.bin", dir, round);
}

absl::Status SaveCheckpoint(const std::string& path, const CheckpointData& data) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("checkpoint dir ", dir, ": ", ec.message()));
  const std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp, ": ", strerror(errno)));
  setvbuf(f, nullptr, _IOFBF, 1 << 20);
  HashingWriter w(f);
  // A tensor conversion can throw (an allocation): the file is closed and removed, and the throw is this write's
  // error, so that a caller trying again (the last round's checkpoint) leaks neither.
  try {
    w.Bytes(kMagic, sizeof(kMagic));
    w.Pod<uint32_t>(kVersion);
    w.Pod<int64_t>(data.round);
    w.String(data.fingerprint);
    w.Pod<uint32_t>(static_cast<uint32_t>(data.params.size()));
    for (const auto& [name, t] : data.params) {
      w.String(name);
      w.Pod<uint32_t>(static_cast<uint32_t>(t.dim()));
      for (int64_t d : t.sizes()) w.Pod<int64_t>(d);
      w.Floats(t);
    }
    w.Pod<uint32_t>(static_cast<uint32_t>(data.momentum.size()));
    for (const at::Tensor& m : data.momentum) w.Floats(m);
    w.Pod<uint32_t>(static_cast<uint32_t>(data.evals.size()));
    for (const EvalRecord& e : data.evals) {
      w.Pod<int64_t>(e.round);
      w.Pod<double>(e.val_loss);
      w.Pod<int64_t>(e.tokens);
      w.Pod<int64_t>(e.bytes_pushed_committed);
    }
    w.Pod<uint64_t>(data.theta_id);
    w.String(data.members_config);
    w.Pod<uint32_t>(static_cast<uint32_t>(data.members.size()));
    for (const MemberRecord& m : data.members) {
      w.String(m.id);
      w.Pod<int32_t>(m.shard_index);
      w.Pod<int32_t>(m.shard_reader);
      w.Pod<int32_t>(m.cluster_size);
      w.Pod<int64_t>(m.inner_steps);
      w.Pod<int64_t>(m.last_applied_base);
      w.Pod<uint8_t>(m.active ? 1 : 0);
      w.Pod<int64_t>(m.rounds_contributed);
      w.Pod<int64_t>(m.tokens);
      w.Pod<int64_t>(m.bytes_pushed);
    }
    w.Pod<uint32_t>(static_cast<uint32_t>(data.earlier_theta_ids.size()));
    for (const ThetaIdRecord& t : data.earlier_theta_ids) {
      w.Pod<int64_t>(t.round);
      w.Pod<uint64_t>(t.id);
    }
    const RunTotalsRecord totals = data.totals.value_or(RunTotalsRecord{});
    w.Pod<uint8_t>(data.totals ? 1 : 0);
    w.Pod<int64_t>(totals.tokens_committed);
    w.Pod<int64_t>(totals.bytes_pushed_committed);
    w.Pod<int64_t>(totals.dp_equivalent_bytes);
    w.Finish();
  } catch (const std::exception& e) {
    fclose(f);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("writing ", tmp, " failed: ", e.what()));
  }
  const bool flushed = fflush(f) == 0 && fsync(fileno(f)) == 0;
  fclose(f);
  if (!w.ok() || !flushed) {
    std::remove(tmp.c_str());
    return absl::DataLossError(absl::StrCat("writing ", tmp, " failed (disk full?)"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, " -> ", path, ": ", strerror(errno)));
  }
  const int dfd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

namespace {
// The body of a checkpoint after its magic (up to its checksum) into *data, with bounds checks.
absl::Status ParseBody(ScanningReader& r, const std::string& path, CheckpointData* data) {
  uint32_t version = 0, count = 0;
  if (!r.Pod(&version)) return Corrupt(path, "truncated header");
  if (version < 1) return Corrupt(path, absl::StrCat("unsupported version ", version));
  if (version > kVersion) {  // (LoadCheckpoint reports it only when the checksum holds: not a flipped byte)
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", path, ": format version ", version,
                                                      " was written by a newer diloco (this one reads versions 1 to ",
                                                      kVersion, ")"));
  }
  if (!r.Pod(&data->round) || !r.String(&data->fingerprint) || !r.Pod(&count)) return Corrupt(path, "truncated header");
  for (uint32_t i = 0; i < count; ++i) {
    std::string name;
    uint32_t ndim = 0;
    if (!r.String(&name) || !r.Pod(&ndim) || ndim > 8) return Corrupt(path, "bad tensor header");
    std::vector<int64_t> dims(ndim);
    uint64_t numel = 1;
    for (int64_t& d : dims) {
      if (!r.Pod(&d) || d < 0) return Corrupt(path, "bad tensor shape");
      // Divided, not multiplied: a flipped high bit in a dimension must not wrap the product back into range.
      const uint64_t fits = r.remaining() / sizeof(float);
      if (d > 0 && numel > fits / static_cast<uint64_t>(d)) {
        return Corrupt(path, absl::StrCat("tensor '", name, "' truncated"));
      }
      numel *= static_cast<uint64_t>(d);
    }
    at::Tensor t;
    if (!r.Floats(dims, &t)) return Corrupt(path, absl::StrCat("tensor '", name, "' truncated"));
    data->params.emplace_back(name, t);
  }
  uint32_t momentum_count = 0;
  if (!r.Pod(&momentum_count) || (momentum_count != 0 && momentum_count != count)) {
    return Corrupt(path, "bad momentum section");
  }
  for (uint32_t i = 0; i < momentum_count; ++i) {
    at::Tensor m;
    if (!r.Floats(data->params[i].second.sizes().vec(), &m)) return Corrupt(path, "momentum truncated");
    data->momentum.push_back(m);
  }
  uint32_t eval_count = 0;
  if (!r.Pod(&eval_count)) return Corrupt(path, "bad eval section");
  for (uint32_t i = 0; i < eval_count; ++i) {
    EvalRecord e;
    if (!r.Pod(&e.round) || !r.Pod(&e.val_loss)) return Corrupt(path, "eval history truncated");
    if (version >= 2 && (!r.Pod(&e.tokens) || !r.Pod(&e.bytes_pushed_committed))) {
      return Corrupt(path, "eval history truncated");
    }
    data->evals.push_back(e);
  }
  if (version >= 3) {
    uint32_t member_count = 0;
    if (!r.Pod(&data->theta_id) || !r.String(&data->members_config) || !r.Pod(&member_count) ||
        member_count > kMaxMembers) {
      return Corrupt(path, "bad member section");
    }
    for (uint32_t i = 0; i < member_count; ++i) {
      MemberRecord m;
      if (!r.String(&m.id) || !r.Pod(&m.shard_index) || !r.Pod(&m.shard_reader) || !r.Pod(&m.cluster_size) ||
          !r.Pod(&m.inner_steps) || !r.Pod(&m.last_applied_base)) {
        return Corrupt(path, "member section truncated");
      }
      uint8_t active = 1;
      if (version >= 4 && !r.Pod(&active)) return Corrupt(path, "member section truncated");
      if (active > 1) return Corrupt(path, absl::StrCat("bad member flag ", static_cast<int>(active)));
      m.active = active == 1;
      if (version >= 5 && (!r.Pod(&m.rounds_contributed) || !r.Pod(&m.tokens) || !r.Pod(&m.bytes_pushed))) {
        return Corrupt(path, "member section truncated");
      }
      data->members.push_back(std::move(m));
    }
  }
  if (version >= 4) {
    uint32_t id_count = 0;
    if (!r.Pod(&id_count) || id_count > kMaxThetaIds) return Corrupt(path, "bad theta id section");
    for (uint32_t i = 0; i < id_count; ++i) {
      ThetaIdRecord t;
      if (!r.Pod(&t.round) || !r.Pod(&t.id)) return Corrupt(path, "theta id section truncated");
      data->earlier_theta_ids.push_back(t);
    }
  }
  if (version >= 5) {
    uint8_t recorded = 0;
    RunTotalsRecord totals;
    if (!r.Pod(&recorded) || recorded > 1 || !r.Pod(&totals.tokens_committed) ||
        !r.Pod(&totals.bytes_pushed_committed) || !r.Pod(&totals.dp_equivalent_bytes)) {
      return Corrupt(path, "bad run totals section");
    }
    if (recorded == 1) data->totals = totals;
  }
  if (!r.AtEnd()) return Corrupt(path, "trailing bytes before the checksum");
  return absl::OkStatus();
}

// Whether the file's last 8 bytes are the xxHash64 of the bytes before them (read through a bounded buffer).
bool FileChecksumMatches(const std::string& path, uint64_t size) {
  FILE* f = size >= sizeof(uint64_t) ? fopen(path.c_str(), "rb") : nullptr;
  if (f == nullptr) return false;
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, fclose);
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> state(XXH64_createState(), XXH64_freeState);
  XXH64_reset(state.get(), 0);
  std::vector<char> buf(1 << 20);
  for (uint64_t left = size - sizeof(uint64_t); left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), left));
    if (fread(buf.data(), 1, n, f) != n) return false;
    XXH64_update(state.get(), buf.data(), n);
    left -= n;
  }
  uint64_t stored = 0;
  return fread(&stored, 1, sizeof(stored), f) == sizeof(stored) && XXH64_digest(state.get()) == stored;
}
}  // namespace

absl::StatusOr<CheckpointData> LoadCheckpoint(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  FILE* f = ec ? nullptr : fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint ", path, ": cannot open (", ec ? ec.message() : strerror(errno), ")"));
  }
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, fclose);  // (stdio's small buffer: the scan seeks past the data)
  if (size < sizeof(kMagic) + sizeof(uint64_t))
    return Corrupt(path, "not a DiLoCo checkpoint (bad magic or too short)");
  ScanningReader r(f, path, size - sizeof(uint64_t));
  char magic[sizeof(kMagic)];
  if (!r.Bytes(magic, sizeof(magic)) || memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return Corrupt(path, "not a DiLoCo checkpoint (bad magic or too short)");
  }
  CheckpointData data;
  absl::Status parsed = ParseBody(r, path, &data);
  const int threads = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  if (parsed.ok() && r.ReadAndVerify(threads)) return data;
  // A corrupt file is reported as such, whichever check tripped first (a flipped header byte can read as a bad shape).
  if (parsed.ok() || !FileChecksumMatches(path, size)) {
    return Corrupt(path, "checksum mismatch (torn or corrupted file)");
  }
  return parsed;
}

namespace {
// Files "ckpt-*<suffix>" in dir, sorted by name (checkpoints: oldest first, as names sort by round).
std::vector<std::string> CheckpointFiles(const std::string& dir, const std::string& suffix = ".bin") {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 5 + suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}
}  // namespace

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& dir, std::vector<std::string>* skipped) {
  const std::vector<std::string> files = CheckpointFiles(dir);
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    auto data = LoadCheckpoint(*it);
    if (data.ok()) return LoadedCheckpoint{*it, std::move(*data)};
    // A file that cannot be opened (permissions, I/O) or that a newer diloco wrote may be the run's newest good one:
    // not skipped for an older one (a resume from it would train rounds already trained again).
    if (data.status().code() == absl::StatusCode::kNotFound) {
      return absl::FailedPreconditionError(absl::StrCat(data.status().message(), "; fix it or move it out of ", dir,
                                                        " (an older checkpoint is not used instead)"));
    }
    if (data.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(
          absl::StrCat(data.status().message(), ": run that version, or start with --fresh (an older checkpoint in ",
                       dir, " is not used instead)"));
    }
    if (skipped != nullptr) skipped->push_back(std::string(data.status().message()));
  }
  return absl::NotFoundError(absl::StrCat("no valid checkpoint in ", dir));
}

absl::StatusOr<std::string> SetAsideCheckpoints(const std::string& dir) {
  const std::vector<std::string> files = CheckpointFiles(dir);
  if (files.empty()) return std::string();
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  std::string aside = (std::filesystem::path(dir) / absl::StrCat("before-fresh-", stamp)).string();
  std::error_code ec;
  for (int n = 2; std::filesystem::exists(aside, ec); ++n) {  // two fresh starts within a second
    aside = (std::filesystem::path(dir) / absl::StrCat("before-fresh-", stamp, "-", n)).string();
  }
  if (!std::filesystem::create_directory(aside, ec) || ec) {
    return absl::InternalError(absl::StrCat("cannot create ", aside, ": ", ec.message()));
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::filesystem::rename(files[i], std::filesystem::path(aside) / std::filesystem::path(files[i]).filename(), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot move ", files[i], " into ", aside, " (", ec.message(), "); ", i,
                                              " of ", files.size(), " checkpoints were moved there"));
    }
  }
  return aside;
}

int RemoveUnfinishedCheckpoints(const std::string& dir) {
  int removed = 0;
  for (const std::string& path : CheckpointFiles(dir, ".bin.tmp")) {
    std::error_code ec;
    if (std::filesystem::remove(path, ec)) ++removed;
  }
  return removed;
}

void PruneCheckpoints(const std::string& dir, int64_t keep) {
  if (keep <= 0) return;
  const std::vector<std::string> files = CheckpointFiles(dir);
  std::error_code ec;
  for (size_t i = 0; i + keep < files.size(); ++i) std::filesystem::remove(files[i], ec);
}

}  // namespace diloco
