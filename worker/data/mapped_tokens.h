// MappedTokens: one split of a token manifest (worker/data/token_manifest.h) mapped read-only, in place. Each distinct
// file is mapped once (PROT_READ, MAP_SHARED, MADV_RANDOM) whole; the ids stay in their stored width (uint16 or
// uint32, little endian) and are only read when a window is copied out, after which its pages are unmapped again
// (MADV_DONTNEED; they stay in the page cache): the resident set holds no corpus pages between copies. The split's
// global token index runs over the segments in order; a copy may span segments. Owns the mappings (unmapped on
// destruction); move-only. Copy is const and thread-safe; Open/move are not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/token_manifest.h"

namespace diloco {

class MappedTokens {
 public:
  // Maps `segments` (absolute paths). Errors name the file: cannot open or map it, or it is shorter than its
  // segments say (truncated).
  static absl::StatusOr<MappedTokens> Open(const std::vector<TokenSegment>& segments);

  MappedTokens() = default;
  MappedTokens(MappedTokens&& other) noexcept;
  MappedTokens& operator=(MappedTokens&& other) noexcept;
  MappedTokens(const MappedTokens&) = delete;
  MappedTokens& operator=(const MappedTokens&) = delete;
  ~MappedTokens();

  int64_t size() const { return size_; }
  // Copies ids [begin, begin + n) of the split into out[0, n) as int64. Requires begin + n <= size().
  void Copy(int64_t begin, int64_t n, int64_t* out) const;

 private:
  struct Mapping {
    void* address = nullptr;
    size_t length = 0;
  };
  struct Piece {
    const unsigned char* ids;  // the segment's first id inside its mapping
    uint32_t width;
    int64_t begin;  // global index of the segment's first id
    int64_t count;
    const unsigned char* map_begin;  // the whole mapping the segment lies in (DropPages stays inside it)
    const unsigned char* map_end;
  };
  void Release();

  std::vector<Mapping> mappings_;
  std::vector<Piece> pieces_;  // in split order, non-empty segments only
  int64_t size_ = 0;
};

}  // namespace diloco
