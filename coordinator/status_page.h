// The coordinator's HTTP status page ("/"): one self-contained HTML document (inline CSS, inline JavaScript that
// draws inline SVG; no CDN, nothing fetched from outside the coordinator). In the browser it polls /status.json every
// 2 s and shows the round and phase, the members (state, tokens/s, last training loss) and validation loss against
// rounds and against bytes communicated. A constant; thread-safe.
#pragma once

namespace diloco {

// The page's HTML, UTF-8.
const char* StatusPageHtml();

}  // namespace diloco
