// EncodeInOrder: the tokenizer's pipeline over one split. A reader thread cuts the split into work items
// (work_items.h), `threads` encoder threads encode them with one shared DocumentEncoder, and the calling thread gets
// the encoded items back in input order (a reorder buffer), so the output is the same for any number of threads.
// At most 2 x threads + 2 items are in flight at once (read but not yet consumed): memory stays bounded whatever the
// input size. Everything it starts is joined before it returns.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "worker/tokenizer/document_encoder.h"
#include "worker/tokenizer/input_plan.h"
#include "worker/tokenizer/work_items.h"

namespace diloco::tokenize {

// Calls consume(item) for every item of `ranges` from `start`, in order, on the calling thread; consume returns false
// to stop early (setting item.error to fail). Returns "" when the split was consumed or stopped, else the first error
// (read, encode, or consume's).
std::string EncodeInOrder(const std::vector<InputRange>& ranges, SplitPosition start, uint64_t item_bytes,
                          const DocumentEncoder& encoder, int threads,
                          const std::function<bool(EncodedItem&)>& consume);

}  // namespace diloco::tokenize
