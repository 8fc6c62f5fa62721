#include "proto/peer_text.h"

#include "absl/strings/str_cat.h"

namespace diloco {

absl::Status ValidateWorkerId(absl::string_view id) {
  if (id.empty()) return absl::InvalidArgumentError("request without a worker id");
  if (id.size() > kMaxWorkerIdLength) {
    return absl::InvalidArgumentError(absl::StrCat("worker id '", Truncated(id, 64), "' is ", id.size(),
                                                   " characters long; at most ", kMaxWorkerIdLength, " are allowed"));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker id has byte 0x", absl::Hex(c, absl::kZeroPad2), " at position ", i,
                       "; allowed: letters, digits and . _ : - (at most ", kMaxWorkerIdLength, ")"));
    }
  }
  return absl::OkStatus();
}

std::string Truncated(absl::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  // The note is at most 30 bytes; what is kept shrinks until prefix + note fits.
  size_t keep = max > 30 ? max - 30 : 0;
  std::string out = absl::StrCat(text.substr(0, keep), " ... (", text.size() - keep, " bytes cut)");
  while (out.size() > max && keep > 0) {
    --keep;
    out = absl::StrCat(text.substr(0, keep), " ... (", text.size() - keep, " bytes cut)");
  }
  return out.size() <= max ? out : out.substr(0, max);
}

absl::Status WithBoundedMessage(const absl::Status& status) {
  if (status.message().size() <= kMaxRefusalBytes) return status;
  return absl::Status(status.code(), Truncated(status.message(), kMaxRefusalBytes));
}

}  // namespace diloco
