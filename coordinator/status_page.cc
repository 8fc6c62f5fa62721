#include "coordinator/status_page.h"

namespace diloco {
namespace {

// The page reads only the keys StatusToJson (proto/status_json.cc) writes. Validation loss against bytes uses each
// EvalPoint's bytes_pushed_committed; should an eval lack it (an older coordinator), the x value is an estimate
// (eval round x the last round's pushed bytes) and the chart's caption says so.
constexpr char kStatusPageHtml[] = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>DiLoCo coordinator</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.3em; margin: 0 0 .4em; }
  table { border-collapse: collapse; margin: .8em 0; }
  th, td { padding: .25em .8em; border-bottom: 1px solid #ddd; text-align: right; }
  th:first-child, td:first-child, td.state { text-align: left; }
  .state-active { color: #1a7f37; } .state-lost { color: #cf222e; } .state-left { color: #777; }
  .charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
  figure { margin: 0; } figcaption { font-weight: 600; max-width: 440px; }
  svg { background: #fafafa; border: 1px solid #ddd; }
  svg text { font-size: 11px; fill: #444; }
  .line { fill: none; stroke: #0969da; stroke-width: 1.5; } .pt { fill: #0969da; }
  .axis { stroke: #888; } .grid { stroke: #e5e5e5; }
  .error { color: #cf222e; } .muted { color: #777; }
</style>
</head>
<body>
<h1>DiLoCo coordinator <span id="run" class="muted"></span></h1>
<p>round <b id="round">-</b> of <b id="rounds-total">-</b> &middot; phase <b id="phase">-</b>
   <span id="phase-reason" class="muted"></span></p>
<p id="traffic" class="muted"></p>
<p id="error" class="error"></p>
<table id="members">
  <thead><tr><th>worker</th><th>state</th><th>tokens/s</th><th>last loss</th><th>rounds</th><th>tokens</th>
             <th>heartbeat age</th></tr></thead>
  <tbody></tbody>
</table>
<div class="charts">
  <figure><figcaption>validation loss vs round</figcaption>
          <svg id="chart-round" width="440" height="270"></svg></figure>
  <figure><figcaption id="bytes-caption">validation loss vs bytes pushed</figcaption>
          <svg id="chart-bytes" width="440" height="270"></svg></figure>
</div>
<p id="updated" class="muted"></p>
<script>
"use strict";
const SVGNS = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtBytes(b) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(b) >= 1000 && i < units.length - 1) { b /= 1000; i++; }
  return (i === 0 ? b.toFixed(0) : b.toPrecision(3)) + " " + units[i];
}

function ticks(lo, hi, n, minStep) {
  const step0 = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = Math.max(minStep || 0, [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0));
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

// points: [{x, y, label}]; draws axes, a line and one circle per point. xStep: smallest x tick step (1 for rounds).
function drawChart(svg, points, xFmt, xStep) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const L = 52, R = 14, T = 12, B = 34;
  if (points.length === 0) {
    svg.appendChild(svgEl("text", {x: W / 2, y: H / 2, "text-anchor": "middle"}, "no evaluation yet"));
    return;
  }
  let x0 = Math.min(...points.map((p) => p.x)), x1 = Math.max(...points.map((p) => p.x));
  let y0 = Math.min(...points.map((p) => p.y)), y1 = Math.max(...points.map((p) => p.y));
  if (x1 === x0) { x1 = x0 > 0 ? x0 * 1.1 : x0 + 1; x0 = x0 > 0 ? x0 * 0.9 : x0; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.08; y0 -= pad; y1 += pad;
  const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
  const sy = (y) => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  for (const v of ticks(y0, y1, 5)) {
    svg.appendChild(svgEl("line", {class: "grid", x1: L, x2: W - R, y1: sy(v), y2: sy(v)}));
    svg.appendChild(svgEl("text", {x: L - 4, y: sy(v) + 4, "text-anchor": "end"}, v.toFixed(2)));
  }
  for (const v of ticks(x0, x1, 5, xStep)) {
    svg.appendChild(svgEl("line", {class: "grid", x1: sx(v), x2: sx(v), y1: T, y2: H - B}));
    svg.appendChild(svgEl("text", {x: sx(v), y: H - B + 14, "text-anchor": "middle"}, xFmt(v)));
  }
  svg.appendChild(svgEl("line", {class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
  svg.appendChild(svgEl("line", {class: "axis", x1: L, x2: L, y1: T, y2: H - B}));
  svg.appendChild(svgEl("text", {x: 12, y: T + (H - T - B) / 2, "text-anchor": "middle",
                                 transform: `rotate(-90 12 ${T + (H - T - B) / 2})`}, "val loss"));
  svg.appendChild(svgEl("polyline", {class: "line",
                                     points: points.map((p) => `${sx(p.x)},${sy(p.y)}`).join(" ")}));
  for (const p of points) {
    const c = svgEl("circle", {class: "pt", cx: sx(p.x), cy: sy(p.y), r: 3.5, "data-x": p.x, "data-y": p.y});
    c.appendChild(svgEl("title", {}, p.label));
    svg.appendChild(c);
  }
}

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function render(s) {
  $("run").textContent = s.run_name ? "(" + s.run_name + ")" : "";
  $("round").textContent = s.round;
  $("rounds-total").textContent = s.rounds_total;
  $("phase").textContent = s.phase;
  $("phase-reason").textContent = s.phase_reason ? "(" + s.phase_reason + ")" : "";
  $("traffic").textContent = `pushed ${fmtBytes(s.bytes_pushed_committed)} in committed rounds` +
      (s.dp_equivalent_bytes > 0 ? ` (data parallel: ${fmtBytes(s.dp_equivalent_bytes)}, ` +
                                   `${s.dp_ratio.toFixed(1)}x more)` : "") +
      ` · received ${fmtBytes(s.bytes_received)} · sent ${fmtBytes(s.bytes_sent)}` +
      ` · last round ${s.last_round_seconds.toFixed(2)} s, outer step ${s.last_outer_step_seconds.toFixed(3)} s`;

  const body = $("members").tBodies[0];
  while (body.firstChild) body.removeChild(body.firstChild);
  for (const w of s.workers) {
    const tr = document.createElement("tr");
    tr.className = "member";
    tr.setAttribute("data-worker", w.id);
    tr.setAttribute("data-state", w.state);
    const reported = w.pushed_this_round || w.rounds_contributed > 0;  // loss and tokens/s come with pushes
    const parts = w.parts > 0 ? ` (parts ${w.parts_received}/${w.parts})` : "";  // a push in parts under way
    tr.append(cell(w.id), cell(w.state + parts, "state state-" + w.state),
              cell(reported ? Math.round(w.tokens_per_s).toString() : "-"),
              cell(reported ? w.last_loss.toFixed(4) : "-"), cell(w.rounds_contributed), cell(w.tokens),
              cell(w.heartbeat_age_s.toFixed(1) + " s"));
    body.appendChild(tr);
  }

  const evals = s.evals || [];
  drawChart($("chart-round"), evals.map((e) => ({x: e.round, y: e.val_loss,
                                                  label: `round ${e.round}: val loss ${e.val_loss.toFixed(4)}`})),
            (v) => v.toFixed(0), 1);
  const exact = evals.length > 0 && evals.every((e) => typeof e.bytes_pushed_committed === "number");
  const bytesAt = (e) => exact ? e.bytes_pushed_committed : e.round * s.last_round_bytes_pushed;
  $("bytes-caption").textContent = exact
      ? "validation loss vs bytes pushed (committed rounds)"
      : "validation loss vs bytes pushed, estimated as round \u00d7 last round's pushed bytes (" +
        fmtBytes(s.last_round_bytes_pushed) + ")";
  drawChart($("chart-bytes"),
            evals.map((e) => ({x: bytesAt(e), y: e.val_loss,
                               label: `${fmtBytes(bytesAt(e))}: val loss ${e.val_loss.toFixed(4)}`})),
            fmtBytes);
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

async function refresh() {
  try {
    const r = await fetch("status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("status.json: HTTP " + r.status);
    render(await r.json());
    $("error").textContent = "";
  } catch (e) {
    $("error").textContent = "cannot reach the coordinator: " + e.message;
  } finally {
    setTimeout(refresh, 2000);
  }
}
refresh();
</script>
</body>
</html>
)HTML";

}  // namespace

const char* StatusPageHtml() { return kStatusPageHtml; }

}  // namespace diloco
