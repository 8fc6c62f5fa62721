#include "worker/data/mapped_tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace diloco {
namespace {

template <typename T>
void Widen(const unsigned char* ids, int64_t n, int64_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    T id;
    std::memcpy(&id, ids + i * sizeof(T), sizeof(T));  // segments may start at any byte offset
    out[i] = static_cast<int64_t>(id);
  }
}

// Unmaps the pages of [data, data + bytes) from this process (they stay in the page cache, and a later read faults
// them back in): without it, every page a window ever touched stays in the resident set (with the kernel's large
// page-cache folios, hundreds of KB per window), and a worker's RSS grows with the corpus it walks. The mapping is
// shared and read-only, so nothing is lost.
// The region dropped is the 2 MiB-aligned span around the window: the kernel maps pages around a faulting one too
// (fault-around, large folios), never beyond that span.
// Clamped to the mapping [map_begin, map_end) (rounded out to whole pages: the mapping starts page aligned).
void DropPages(const unsigned char* data, size_t bytes, const unsigned char* map_begin, const unsigned char* map_end) {
  constexpr uintptr_t span = uintptr_t{2} << 20;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(map_begin);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(map_end) + page - 1) & ~(page - 1);
  const uintptr_t begin = std::max(lo, reinterpret_cast<uintptr_t>(data) & ~(span - 1));
  const uintptr_t end = std::min(hi, (reinterpret_cast<uintptr_t>(data) + bytes + span - 1) & ~(span - 1));
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

absl::StatusOr<MappedTokens> MappedTokens::Open(const std::vector<TokenSegment>& segments) {
  MappedTokens tokens;
  std::map<std::pair<dev_t, ino_t>, size_t> mapped;  // (device, inode) -> index in mappings_
  for (const TokenSegment& s : segments) {
    if (s.count == 0) continue;
    const int fd = open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return absl::NotFoundError(absl::StrCat("token file ", s.path, ": cannot open (", strerror(errno), ")"));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      close(fd);
      return absl::InternalError(absl::StrCat("token file ", s.path, ": cannot stat (", strerror(errno), ")"));
    }
    const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
    if (s.offset > file_bytes || s.count > (file_bytes - s.offset) / s.width) {
      close(fd);
      return absl::DataLossError(absl::StrCat(
          "token file ", s.path, ": the manifest says ", s.count, " ids of ", s.width, " bytes from byte ", s.offset,
          " (", s.offset + s.count * s.width, " bytes) but the file holds ", file_bytes, " bytes (truncated?)"));
    }
    auto [it, inserted] = mapped.emplace(std::make_pair(st.st_dev, st.st_ino), tokens.mappings_.size());
    if (inserted) {
      void* address = mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (address == MAP_FAILED) {
        close(fd);
        return absl::InternalError(absl::StrCat("token file ", s.path, ": cannot map (", strerror(errno), ")"));
      }
      madvise(address, file_bytes, MADV_RANDOM);  // windows are read in shuffled order; readahead would be waste
      tokens.mappings_.push_back({address, file_bytes});
    }
    close(fd);  // the mapping keeps the file
    const auto* base = static_cast<const unsigned char*>(tokens.mappings_[it->second].address);
    tokens.pieces_.push_back({base + s.offset, s.width, tokens.size_, static_cast<int64_t>(s.count), base,
                              base + tokens.mappings_[it->second].length});
    tokens.size_ += static_cast<int64_t>(s.count);
  }
  return tokens;
}

MappedTokens::MappedTokens(MappedTokens&& other) noexcept
    : mappings_(std::move(other.mappings_)), pieces_(std::move(other.pieces_)), size_(other.size_) {
  other.mappings_.clear();
  other.pieces_.clear();
  other.size_ = 0;
}

MappedTokens& MappedTokens::operator=(MappedTokens&& other) noexcept {
  if (this != &other) {
    Release();
    mappings_ = std::move(other.mappings_);
    pieces_ = std::move(other.pieces_);
    size_ = other.size_;
    other.mappings_.clear();
    other.pieces_.clear();
    other.size_ = 0;
  }
  return *this;
}

MappedTokens::~MappedTokens() { Release(); }

void MappedTokens::Release() {
  for (const Mapping& m : mappings_) munmap(m.address, m.length);
  mappings_.clear();
  pieces_.clear();
  size_ = 0;
}

void MappedTokens::Copy(int64_t begin, int64_t n, int64_t* out) const {
  // The last piece that starts at or before `begin`.
  auto piece = std::upper_bound(pieces_.begin(), pieces_.end(), begin,
                                [](int64_t index, const Piece& p) { return index < p.begin; }) -
               1;
  while (n > 0) {
    const int64_t skip = begin - piece->begin;
    const int64_t take = std::min(n, piece->count - skip);
    const unsigned char* ids = piece->ids + skip * piece->width;
    if (piece->width == 2) {
      Widen<uint16_t>(ids, take, out);
    } else {
      Widen<uint32_t>(ids, take, out);
    }
    DropPages(ids, static_cast<size_t>(take) * piece->width, piece->map_begin, piece->map_end);
    begin += take;
    out += take;
    n -= take;
    ++piece;
  }
}

}  // namespace diloco
