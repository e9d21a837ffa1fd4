// allocscope HTML report: the verdict of `allocscope fit`, where the
// capture is one of its dry runs, and for a search the card's memory against
// the value. Inlined after report.js, in the same script: it uses that
// file's helpers (svg, html, fmtBytes, ...), and report.js calls drawFit()
// before this file's top level runs (function declarations only here).
// ---- allocscope fit's verdict, where the capture is one of its dry runs
function drawFit() {
  const F = D.fit;
  if (!F) return;
  document.getElementById("fit-section").style.display = "";
  const on = F.search ? ` with ${F.search}=${F.value}` : "";
  document.getElementById("fit-title").textContent = `Will it fit? ${F.verdict} on a virtual ${F.gpu}${on}`;
  const t = document.getElementById("fit-figures");
  const row = (k, v) => { const tr = html("tr", {}, t); html("td", {}, tr, k); html("td", { class: "num" }, tr, v); };
  const b = (v) => (v == null ? "?" : fmtBytes(v));
  row("peak allocated", b(F.peak_allocated_bytes));
  row("peak reserved", b(F.peak_reserved_bytes));
  row("outside the allocator (CUDA context, libraries)", b(F.outside_allocator_bytes));
  row("the card", b(F.total_bytes));
  if (F.shortfall_bytes != null) row("short by", b(F.shortfall_bytes));
  else row("headroom at the peak", b(F.headroom_bytes));
  const notes = document.getElementById("fit-notes");
  if (F.command) html("div", { class: "muted" }, notes, "command: " + F.command.join(" "));
  t.dataset.verdict = F.verdict;
  if (F.memory) drawFitMemory(F);
}

// ---- a search's line: the card's memory at its peak against the value,
// fixed + per unit, stacked by part (reports/scaling.py), with the runs
function drawFitMemory(F) {
  // (constants here, not at the top level: report.js runs the page before this file's top level would)
  const PART_COLORS = { allocator_rounding: "#c9b5d6", cached_and_fragmented: "#fdd0a2", outside_allocator: "#98a2b3" };
  const PART_LABELS = { allocator_rounding: "rounding", cached_and_fragmented: "cached and fragmented",
    outside_allocator: "outside the allocator (CUDA context)", optimizer_state: "optimizer state" };
  const M = F.memory, name = M.name;
  document.getElementById("fit-memory-section").style.display = "";
  document.getElementById("fit-memory-title").textContent =
    `Memory at the peak against ${name}: ${fmtBytes(M.fixed_bytes)} + ${fmtBytes(Math.round(M.per_unit_bytes))} per ${name}` +
    (M.linear ? " (proportional)" : M.values.length > 2 ? " (the line bends)" : "");
  const box = document.getElementById("fit-memory");
  const W = box.clientWidth || 1100, H = 300, m = { l: 70, r: 16, t: 12, b: 28 };
  const root = svg("svg", { width: W, height: H }, box);
  const xmax = Math.max(...M.values, ...M.changes.map((c) => c.value), F.value || 0) * 1.05;
  const at = (p, x) => Math.max(0, p.fixed_bytes + p.per_unit_bytes * x);
  // fixed parts at the bottom, what grows above them, cached memory (where the line bends) on top
  const FIRST = ["outside_allocator", "parameter", "buffer", "gradient", "optimizer_state", "workspace"];
  const LAST = ["allocator_rounding", "cached_and_fragmented"];
  const rank = (k) => (FIRST.includes(k) ? FIRST.indexOf(k) : LAST.includes(k) ? 100 + LAST.indexOf(k) : 50);
  const parts = Object.keys(M.parts).filter((k) => at(M.parts[k], 0) > 0 || at(M.parts[k], xmax) > 0)
    .sort((a, b) => rank(a) - rank(b));
  const total = (x) => parts.reduce((s, k) => s + at(M.parts[k], x), 0);
  let ymax = Math.max(total(xmax), ...M.measured_bytes, 1);
  const card = F.total_bytes && F.total_bytes <= 2 * ymax ? F.total_bytes : null;  // drawn where it does not flatten the rest
  if (card) ymax = Math.max(ymax, card);
  const X = (v) => m.l + v / xmax * (W - m.l - m.r), Y = (v) => H - m.b - v / (ymax * 1.05) * (H - m.t - m.b);
  const ax = svg("g", { class: "axis" }, root);
  for (const v of niceTicks(ymax, 5)) {
    svg("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v), stroke: "#eef0f3" }, ax);
    svg("text", { x: m.l - 6, y: Y(v) + 4, "text-anchor": "end" }, ax).textContent = fmtBytes(v);
  }
  for (let i = 0; i <= 6; i++) {
    const v = xmax * i / 6;
    svg("text", { x: X(v), y: H - 8, "text-anchor": "middle" }, ax).textContent = `${name}=${Math.round(v)}`;
  }
  // the parts, stacked (each a straight band: fixed + per unit x value)
  let below = () => 0;
  parts.forEach((k, i) => {
    const lo = below, hi = ((prev) => (x) => prev(x) + at(M.parts[k], x))(lo);
    const d = `M${X(0)},${Y(hi(0))}L${X(xmax)},${Y(hi(xmax))}L${X(xmax)},${Y(lo(xmax))}L${X(0)},${Y(lo(0))}Z`;
    const p = M.parts[k];
    titled(svg("path", { d, fill: PART_COLORS[k] || colorOf(k, i), "fill-opacity": 0.85, class: "part" }, root),
      `${PART_LABELS[k] || k}: ${fmtBytes(p.fixed_bytes)} + ${fmtBytes(Math.round(p.per_unit_bytes))} per ${name}`);
    below = hi;
  });
  svg("line", { x1: X(0), y1: Y(M.fixed_bytes), x2: X(xmax), y2: Y(M.fixed_bytes + M.per_unit_bytes * xmax), stroke: "#1d2430", "stroke-width": 1.5, class: "fitted" }, root);
  M.values.forEach((v, i) => titled(svg("circle", { cx: X(v), cy: Y(M.measured_bytes[i]), r: 4, fill: "#fff", stroke: "#1d2430", "stroke-width": 1.5, class: "run" }, root),
    `${name}=${v}: ${fmtBytes(M.measured_bytes[i])} measured`));
  for (const c of M.changes) {
    titled(svg("line", { x1: X(c.value), x2: X(c.value), y1: m.t, y2: H - m.b, stroke: "#667085", "stroke-dasharray": "2 3", class: "change" }, root),
      `from ${name}=${c.value}: ${c.what}`);
  }
  if (card) {
    titled(svg("line", { x1: m.l, x2: W - m.r, y1: Y(card), y2: Y(card), stroke: "#d62728", "stroke-dasharray": "6 3", class: "card" }, root),
      `the card: ${fmtBytes(card)}`);
  }
  if (F.value != null) svg("line", { x1: X(F.value), x2: X(F.value), y1: m.t, y2: H - m.b, stroke: "#2f6feb", "stroke-width": 1, class: "this-run" }, root);
  box.dataset.drawn = String(parts.length);
  box.dataset.points = String(M.values.length);
  const lg = html("div", { class: "legend" }, document.getElementById("fit-memory-legend"));
  parts.forEach((k, i) => { const e = html("span", {}, lg); html("i", { style: "background:" + (PART_COLORS[k] || colorOf(k, i)) }, e); e.append(PART_LABELS[k] || k); });
  const notes = document.getElementById("fit-memory-notes");
  html("div", { class: "muted" }, notes, `From the ${M.values.length} runs of the search that fit (${M.values.join(", ")}; circles): ` +
    "each part's line through its bytes at those runs (the card's memory at the peak: the reserved peak and what is outside the allocator). " +
    (F.value != null ? `The blue line is this page's run (${name}=${F.value}).` : ""));
  for (const c of M.changes) html("div", { class: "muted" }, notes, `from ${name}=${c.value}: ${c.what}`);
}
