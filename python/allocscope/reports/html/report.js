// allocscope HTML report. Plain SVG drawn from the JSON block above: no
// library, no network. Each chart marks what it drew in data-* attributes
// (data-drawn, data-range, data-view) so that tests can check it.
"use strict";
const D = JSON.parse(document.getElementById("allocscope-data").textContent);
const SVG = "http://www.w3.org/2000/svg";
const CAT_COLORS = {
  parameter: "#4e79a7", buffer: "#9c755f", gradient: "#f28e2b", optimizer_state: "#e15759",
  activation: "#59a14f", input: "#edc948", output: "#ff9da7", kv_cache: "#d37295", temporary: "#b07aa1",
  engine: "#86bcb6", workspace: "#76b7b2",
  other: "#bab0ac", unknown: "#d3d3d3",
};
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
  "#9c755f", "#bab0ac", "#86bcb6", "#d37295"];

function fmtBytes(b) {
  const neg = b < 0; b = Math.abs(b);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return (neg ? "-" : "") + (i === 0 ? b.toFixed(0) : b.toFixed(2)) + " " + units[i];
}
function fmtTime(ns) { return (ns / 1e9).toFixed(ns < 1e9 ? 3 : 2) + " s"; }
function esc(s) { return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c])); }
function svg(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function html(tag, attrs, parent, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function titled(e, text) { svg("title", {}, e).textContent = text; return e; }
function colorOf(name, i) { return CAT_COLORS[name] || PALETTE[i % PALETTE.length]; }
function hashColor(s) {
  let h = 0;
  for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
  return "hsl(" + (Math.abs(h) % 50 + 20) + ",70%," + (68 + Math.abs(h >> 8) % 14) + "%)";
}
function niceTicks(max, n) {
  if (max <= 0) return [0];
  const raw = max / n, mag = Math.pow(2, Math.floor(Math.log2(raw)));
  const step = [1, 2, 4, 8].map((m) => m * mag).find((s) => s >= raw) || mag * 8;
  const out = [];
  for (let v = 0; v <= max * 1.0001; v += step) out.push(v);
  return out;
}
function legend(parent, names) {
  const box = html("div", { class: "legend" }, parent);
  names.forEach((n, i) => { const s = html("span", {}, box); html("i", { style: "background:" + colorOf(n, i) }, s); s.append(n); });
  return box;
}

// ---- header
function header() {
  const c = D.capture, p = D.focus;
  document.title = "allocscope: " + c.path;
  const h = document.getElementById("head");
  html("h1", {}, h, "allocscope report: " + c.path);
  html("div", { class: "sub" }, h, `${c.device_type}, ${c.events.toLocaleString()} events, ${fmtTime(c.duration_ns)}` +
    (c.complete ? "" : " (incomplete capture)") + (c.torch ? `, torch ${c.torch}` : ""));
  if (c.virtual_gpu) {
    html("div", { class: "sub virtual", id: "virtual-note" }, h, `On a virtual ${c.virtual_gpu}: torch's real caching ` +
      "allocator on allocscope's virtual GPU, where kernels take no time. The memory is the card's; the times are " +
      "not, so the timeline's axis is events (time is a button away).");
  }
  const k = html("div", { class: "kpis" }, h);
  const kpi = (v, label) => { const d = html("div", { class: "kpi" }, k); html("b", {}, d, v); html("span", {}, d, label); };
  kpi(fmtBytes(p.allocated_bytes), "allocated at the " + D.focus_label);
  if (p.reserved_bytes != null) kpi(fmtBytes(p.reserved_bytes), "reserved then");
  if (D.peak_reserved) kpi(fmtBytes(D.peak_reserved.reserved_bytes), "peak reserved");
  kpi(fmtBytes(D.theory.total), "textbook estimate");
  if (D.timeline.device_total) kpi(fmtBytes(D.timeline.device_total), "device memory");
  if (D.ooms.length) kpi(String(D.ooms.length), "out-of-memory errors");
  const w = document.getElementById("warnings");
  for (const t of D.warnings) html("div", { class: "warn" }, w, "warning: " + t);
  if (!c.watched.length) html("div", { class: "warn" }, w, "No model was watched: categories and the estimate need rec.watch(model, optimizer).");
}

// ---- the ranks of a run, where the page reports the worst of them
function drawRanks() {
  const R = D.ranks;
  if (!R) return;
  document.getElementById("ranks-section").style.display = "";
  const of = R.world_size ? ` of a job of ${R.world_size}` : "";
  // a job's ranks, or the processes of a run (some without a rank: named by pid)
  const byRank = R.ranks.every((r) => r.rank != null);
  const name = (r) => r.process;
  const worst = R.ranks.find((r) => r.capture === R.worst_capture);
  const median = R.ranks.find((r) => r.capture === R.median_capture);
  document.getElementById("ranks-title").textContent =
    `${R.ranks.length} ${byRank ? "ranks" : "processes"}${of}: this page reports the worst, ${name(worst)}`;
  const t = document.getElementById("ranks-table");
  const b = (v) => (v == null ? "?" : fmtBytes(v));
  const head = html("tr", {}, t);
  for (const h of [byRank ? "rank" : "process", "card", "peak allocated", "peak reserved", "device used", "NCCL", "others' contexts on it", "also on cards"]) html("th", {}, head, h);
  for (const r of R.ranks) {
    const tr = html("tr", r === worst ? { class: "worst" } : {}, t);
    html("td", {}, tr, byRank ? String(r.rank) : name(r));
    html("td", {}, tr, r.card == null ? "?" : `cuda:${r.card}`);
    for (const k of ["peak_allocated_bytes", "peak_reserved_bytes", "device_used_bytes", "nccl_bytes"]) html("td", { class: "num" }, tr, b(r[k]));
    html("td", { class: "num" }, tr, r.other_contexts == null ? "?" : r.other_contexts ? `${r.other_contexts} (${fmtBytes(r.other_contexts_bytes)})` : "0");
    html("td", {}, tr, (r.stray_cards || []).map((c) => `cuda:${c}`).join(", ") || "-");
  }
  const notes = document.getElementById("ranks-notes");
  if (worst !== median) {
    const noun = byRank ? "rank" : "process";
    html("div", {}, notes, `${byRank ? `Rank ${worst.rank}` : `The process with ${name(worst)}`} uses ${fmtBytes(R.worst_over_median_bytes)} more than the median ${noun} (${byRank ? median.rank : name(median)}).`);
    for (const d of R.differences) {
      const sign = d.difference_bytes > 0 ? "+" : "-";
      html("div", { class: "muted" }, notes, `${d.dimension} ${d.name}: ${sign}${fmtBytes(Math.abs(d.difference_bytes))} (${fmtBytes(d.worst_bytes)} against ${fmtBytes(d.median_bytes)})`);
    }
  }
}

// ---- the timeline
// On the virtual GPU kernels take no time: seconds there are the CPU's
// set-up, not the card's work, so events are the default axis.
const TL = { mode: "category", range: null, axis: D.capture.virtual_gpu ? "event" : "time" };
function timelineSeries() {
  const t = D.timeline;
  const src = TL.mode === "module" ? t.by_module : t.by_category;
  return Object.keys(src).map((name) => ({ name, values: src[name] }));
}
function drawTimeline() {
  const box = document.getElementById("timeline");
  box.innerHTML = "";
  const t = D.timeline, n = t.time_ns.length;
  // By time, or by event number: the latter gives idle seconds no width.
  const useTime = TL.axis === "time" && n > 1 && t.time_ns[n - 1] > t.time_ns[0];
  const xs = useTime ? t.time_ns : t.event;
  // The axis starts just before memory first moves (views.timeline_view's
  // start): what came before it is a flat line.
  const first = xs[t.start || 0];
  const full = [first, xs[n - 1] > first ? xs[n - 1] : first + 1];
  const [x0, x1] = TL.range || full;
  let lo = 0, hi = n - 1;
  while (lo < n - 1 && xs[lo + 1] < x0) lo++;
  while (hi > 0 && xs[hi - 1] > x1) hi--;
  const W = box.clientWidth || 1100, H = 330, m = { l: 70, r: 16, t: 12, b: 28 };
  const root = svg("svg", { width: W, height: H }, box);
  const series = timelineSeries();
  const lines = [["reserved", t.reserved, "#1d2430", "6 3"], ["device used", t.device_used, "#d62728", "2 3"]].filter((l) => l[1]);
  let ymax = 1;
  for (let i = lo; i <= hi; i++) {
    ymax = Math.max(ymax, t.allocated[i]);
    for (const l of lines) ymax = Math.max(ymax, l[1][i]);
  }
  const X = (v) => m.l + (v - x0) / (x1 - x0) * (W - m.l - m.r);
  const Y = (v) => H - m.b - v / (ymax * 1.05) * (H - m.t - m.b);
  const ax = svg("g", { class: "axis" }, root);
  for (const v of niceTicks(ymax, 5)) {
    svg("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v), stroke: "#eef0f3" }, ax);
    svg("text", { x: m.l - 6, y: Y(v) + 4, "text-anchor": "end" }, ax).textContent = fmtBytes(v);
  }
  for (let i = 0; i <= 6; i++) {
    const v = x0 + (x1 - x0) * i / 6;
    svg("text", { x: X(v), y: H - 8, "text-anchor": "middle" }, ax).textContent = useTime ? fmtTime(v) : "event " + Math.round(v);
  }
  const plot = svg("g", { "clip-path": "url(#clip)" }, root);
  const clip = svg("clipPath", { id: "clip" }, svg("defs", {}, root));
  svg("rect", { x: m.l, y: 0, width: W - m.l - m.r, height: H - m.b }, clip);
  const base = new Float64Array(hi - lo + 1);
  let drawn = 0;
  series.forEach((s, si) => {
    let top = "", bottom = "";
    for (let i = lo; i <= hi; i++) {
      const y0 = base[i - lo], y1 = y0 + s.values[i];
      base[i - lo] = y1;
      top += (i === lo ? "M" : "L") + X(xs[i]).toFixed(1) + "," + Y(y1).toFixed(1);
      bottom = "L" + X(xs[i]).toFixed(1) + "," + Y(y0).toFixed(1) + bottom;
    }
    titled(svg("path", { d: top + bottom + "Z", fill: colorOf(s.name, si), "fill-opacity": 0.85, class: "area" }, plot), s.name);
    drawn++;
  });
  for (const [name, vals, color, dash] of lines) {
    let d = "";
    for (let i = lo; i <= hi; i++) d += (i === lo ? "M" : "L") + X(xs[i]).toFixed(1) + "," + Y(vals[i]).toFixed(1);
    titled(svg("path", { d, fill: "none", stroke: color, "stroke-width": 1.5, "stroke-dasharray": dash, class: "line" }, plot), name);
  }
  const at = (e) => { // x of an event index, from the nearest point
    let j = 0;
    while (j < n - 1 && t.event[j + 1] <= e) j++;
    return useTime ? t.time_ns[j] : t.event[j];
  };
  // Marks: drawn when few enough are in view to tell apart (zoom in for the rest).
  const inView = D.marks.filter((mk) => { const x = useTime ? mk.time_ns : mk.event; return x >= x0 && x <= x1; });
  if (inView.length <= 80) {
    for (const mk of inView) {
      const x = X(useTime ? mk.time_ns : mk.event);
      titled(svg("line", { x1: x, x2: x, y1: m.t, y2: H - m.b, stroke: "#98a2b3", "stroke-width": 0.7, class: "mark" }, plot), mk.label);
      if (inView.length <= 12) svg("text", { x: x + 3, y: m.t + 10, fill: "#667085" }, plot).textContent = mk.label;
    }
  }
  box.dataset.marks = String(inView.length <= 80 ? inView.length : 0);
  const pk = D.focus, px = useTime ? pk.time_ns : pk.event;
  if (px >= x0 && px <= x1) {
    titled(svg("circle", { cx: X(px), cy: Y(pk.allocated_bytes), r: 4.5, fill: "#fff", stroke: "#d62728", "stroke-width": 2, class: "peak" }, plot),
      `${D.focus_label}: ${fmtBytes(pk.allocated_bytes)} allocated`);
  }
  for (const o of D.ooms) {
    const x = useTime ? o.time_ns : at(o.event);
    if (x < x0 || x > x1) continue;
    titled(svg("line", { x1: X(x), x2: X(x), y1: m.t, y2: H - m.b, stroke: "#d62728", "stroke-width": 2, class: "oom" }, plot),
      "out of memory: " + fmtBytes(o.size) + " requested");
  }
  // Hover read-out and drag-to-zoom.
  const tip = html("div", { class: "tip" }, box);
  const cursor = svg("line", { y1: m.t, y2: H - m.b, stroke: "#667085", "stroke-width": 0.8, visibility: "hidden" }, root);
  const brush = svg("rect", { y: m.t, height: H - m.t - m.b, fill: "#2f6feb", "fill-opacity": 0.15, visibility: "hidden" }, root);
  const overlay = svg("rect", { x: m.l, y: m.t, width: W - m.l - m.r, height: H - m.t - m.b, fill: "transparent", class: "overlay" }, root);
  const inv = (px) => x0 + (px - m.l) / (W - m.l - m.r) * (x1 - x0);
  const local = (ev) => ev.clientX - root.getBoundingClientRect().left;
  let dragFrom = null;
  overlay.addEventListener("mousedown", (ev) => { dragFrom = local(ev); ev.preventDefault(); });
  overlay.addEventListener("mousemove", (ev) => {
    const px = local(ev);
    if (dragFrom !== null) {
      brush.setAttribute("x", Math.min(px, dragFrom)); brush.setAttribute("width", Math.abs(px - dragFrom));
      brush.setAttribute("visibility", "visible");
    }
    const v = inv(px);
    let j = lo;
    while (j < hi && xs[j + 1] <= v) j++;
    cursor.setAttribute("x1", X(xs[j])); cursor.setAttribute("x2", X(xs[j])); cursor.setAttribute("visibility", "visible");
    let text = (useTime ? fmtTime(xs[j]) + ", " : "") + "event " + t.event[j] + "\nallocated " + fmtBytes(t.allocated[j]);
    for (const [name, vals] of lines) text += "\n" + name + " " + fmtBytes(vals[j]);
    for (const s of series) if (s.values[j]) text += "\n  " + s.name + " " + fmtBytes(s.values[j]);
    tip.textContent = text; tip.style.display = "block";
    tip.style.left = Math.min(px + 14, W - 240) + "px"; tip.style.top = "14px";
  });
  overlay.addEventListener("mouseleave", () => { tip.style.display = "none"; cursor.setAttribute("visibility", "hidden"); });
  window.addEventListener("mouseup", function up(ev) {
    window.removeEventListener("mouseup", up);
    if (dragFrom === null) return;
    const a = inv(Math.min(dragFrom, local(ev))), b = inv(Math.max(dragFrom, local(ev)));
    dragFrom = null;
    if (Math.abs(X(b) - X(a)) > 4) { TL.range = [a, b]; drawTimeline(); } else brush.setAttribute("visibility", "hidden");
  }, { once: false });
  box.dataset.range = x0 + "," + x1;
  box.dataset.axis = useTime ? "time" : "event";
  box.dataset.drawn = String(drawn);
  box.dataset.points = String(hi - lo + 1);
  const lg = document.getElementById("timeline-legend");
  lg.innerHTML = "";
  legend(lg, series.map((s) => s.name));
  if (inView.length > 80) html("span", { class: "muted" }, lg.firstChild, `${inView.length} marks in view (zoom in to see them)`);
  for (const [name, , color, dash] of lines) {
    const s = html("span", {}, lg.firstChild);
    s.innerHTML = `<svg width="22" height="8"><line x1="0" x2="22" y1="4" y2="4" stroke="${color}" stroke-width="2" stroke-dasharray="${dash}"/></svg> ${esc(name)}`;
  }
}

// ---- the waterfall from the estimate to the measured bytes
function drawWaterfall() {
  const box = document.getElementById("waterfall");
  const rows = [{ label: "estimate", from: 0, to: D.theory.total, kind: "total", detail: "the textbook estimate" }];
  let run = D.theory.total;
  for (const g of D.gap) {
    if (!g.bytes) continue;
    rows.push({ label: (g.bytes > 0 ? "+ " : "- ") + g.item, from: run, to: run + g.bytes, kind: g.bytes > 0 ? "up" : "down", detail: g.detail });
    run += g.bytes;
  }
  rows.push({ label: "= measured", from: 0, to: D.measured.total_bytes, kind: "total", detail: D.measured.basis.replace(/_/g, " ") });
  const W = box.clientWidth || 560, rowH = 24, m = { l: 150, r: 90 };
  const H = rows.length * rowH + 10;
  const root = svg("svg", { width: W, height: H }, box);
  const max = Math.max(...rows.map((r) => Math.max(r.from, r.to)), 1);
  const X = (v) => m.l + v / max * (W - m.l - m.r);
  rows.forEach((r, i) => {
    const y = 5 + i * rowH;
    svg("text", { x: m.l - 8, y: y + 15, "text-anchor": "end" }, root).textContent = r.label;
    const color = r.kind === "total" ? "#4e79a7" : r.kind === "up" ? "#e15759" : "#59a14f";
    titled(svg("rect", { x: X(Math.min(r.from, r.to)), y: y + 3, width: Math.max(1, Math.abs(X(r.to) - X(r.from))), height: rowH - 8, fill: color, class: "bar" }, root),
      r.label + ": " + fmtBytes(r.to - r.from) + "\n" + r.detail);
    svg("text", { x: X(Math.max(r.from, r.to)) + 6, y: y + 15 }, root).textContent = fmtBytes(Math.abs(r.to - r.from));
  });
  box.dataset.drawn = String(rows.length);
  const notes = document.getElementById("waterfall-notes");
  for (const n of D.theory.notes || []) html("div", { class: "muted" }, notes, "note: " + n);
}

// ---- icicle of live memory: by Python stack or by module
const FG = { view: "stack", zoom: null, library: false };
function drawFlame() {
  const box = document.getElementById("flame");
  box.innerHTML = "";
  const tree = FG.view === "module" ? D.module_tree : FG.library && D.stack_tree_all ? D.stack_tree_all : D.stack_tree;
  const names = tree.names, cats = tree.categories;
  const root = FG.zoom || tree.root;
  const W = box.clientWidth || 1100, rowH = 18;
  let depth = 0;
  (function d(n, k) { depth = Math.max(depth, k); n[3].forEach((c) => d(c, k + 1)); })(root, 1);
  const H = Math.max(depth * rowH, rowH) + 2;
  const s = svg("svg", { width: W, height: H }, box);
  let drawn = 0;
  const total = root[1] || 1;
  function draw(n, x, w, k) {
    if (w < 0.5) return;
    const name = names[n[0]], cat = n[2] >= 0 ? cats[n[2]] : null;
    const g = svg("g", { class: "node", transform: `translate(${x.toFixed(1)},${k * rowH})` }, s);
    const fill = cat && (n[3].length === 0 || cats.includes(name)) ? CAT_COLORS[cat] : hashColor(name);
    svg("rect", { width: Math.max(w - 0.5, 0.5), height: rowH - 1, fill, rx: 1 }, g);
    titled(g, `${name}\n${fmtBytes(n[1])} (${(100 * n[1] / total).toFixed(1)}%)` + (cat ? "\n" + cat : ""));
    if (w > 40) {
      const label = svg("text", { x: 4, y: 13 }, g);
      const maxChars = Math.floor((w - 8) / 6.2);
      label.textContent = name.length > maxChars ? name.slice(0, Math.max(maxChars - 1, 1)) + "\u2026" : name;
    }
    g.addEventListener("click", () => { FG.zoom = n === root && FG.zoom ? null : n; drawFlame(); });
    drawn++;
    let cx = x;
    for (const c of n[3]) { const cw = w * c[1] / (n[1] || 1); draw(c, cx, cw, k + 1); cx += cw; }
  }
  draw(root, 0, W, 0);
  box.dataset.view = FG.view;
  box.dataset.library = String(FG.library);
  const lib = document.getElementById("flame-library");
  if (lib) { lib.classList.toggle("on", FG.library); lib.style.display = FG.view === "stack" ? "" : "none"; }
  box.dataset.drawn = String(drawn);
  for (const b of document.querySelectorAll("#flame-toolbar button[data-view]")) b.classList.toggle("on", b.dataset.view === FG.view);
}

// ---- the allocator's segments
let SEG_LIMIT = 60;
function drawSegments() {
  const sec = document.getElementById("allocator");
  const A = D.allocator;
  if (!A) { sec.style.display = "none"; return; }
  const box = document.getElementById("segments");
  box.innerHTML = "";
  const segs = A.view.segments.slice(0, SEG_LIMIT);
  const W = box.clientWidth || 1100, rowH = 14, m = { l: 170, r: 10 };
  const H = segs.length * rowH + 4;
  const s = svg("svg", { width: W, height: H }, box);
  const biggest = Math.max(...segs.map((x) => x.size), 1);
  let drawn = 0;
  segs.forEach((seg, i) => {
    const y = 2 + i * rowH, width = Math.max(30, (W - m.l - m.r) * seg.size / biggest);
    svg("text", { x: m.l - 6, y: y + 10, "text-anchor": "end" }, s).textContent =
      `${fmtBytes(seg.size)} ${seg.pool}${seg.expandable ? " exp." : ""}${seg.stream ? " s" + seg.stream : ""}`;
    titled(svg("rect", { x: m.l, y, width, height: rowH - 3, fill: "#f2f4f7", stroke: "#d0d5dd", "stroke-width": 0.5 }, s),
      `segment 0x${seg.address.toString(16)}: ${fmtBytes(seg.size)}, ${seg.pool} pool, stream ${seg.stream}`);
    for (const [off, size, req, state, cat] of seg.blocks) {
      if (state === "inactive") continue;
      const fill = state === "allocated" ? (cat >= 0 ? CAT_COLORS[A.view.categories[cat]] : "#98a2b3") : "#fdb462";
      titled(svg("rect", { x: m.l + width * off / seg.size, y, width: Math.max(0.6, width * size / seg.size), height: rowH - 3, fill, class: "block" }, s),
        `${fmtBytes(size)} block (${fmtBytes(req)} requested) at +${off}\n${state}` + (cat >= 0 ? ", " + A.view.categories[cat] : ""));
      drawn++;
    }
  });
  box.dataset.drawn = String(drawn);
  const more = document.getElementById("segments-more");
  const hidden = A.view.segments.length - segs.length + A.view.omitted;
  more.style.display = hidden > 0 ? "" : "none";
  more.textContent = `show ${Math.min(hidden, 400)} more segments`;
  more.onclick = () => { SEG_LIMIT += 400; drawSegments(); };
}
function allocatorFigures() {
  const A = D.allocator;
  if (!A) return;
  document.getElementById("allocator-title").textContent = A.title;
  const f = A.figures, t = document.getElementById("allocator-figures");
  const rows = [
    ["reserved", f.reserved, f.segments + " segments"],
    ["allocated", f.allocated, "rounding and unsplit remainders " + fmtBytes(f.internal_fragmentation)],
    ["cached free", f.cached_free, "largest block " + fmtBytes(f.largest_free_block) + ", external fragmentation " + (100 * f.external_fragmentation).toFixed(1) + "%"],
    ["unreleasable", f.unreleasable_free, "free inside " + f.fragmented_segments + " segments that also hold live blocks"],
    ["awaiting streams", f.pending_free, "freed, still in use by another stream"],
  ];
  for (const [a, b, c] of rows) {
    const tr = html("tr", {}, t);
    html("td", {}, tr, a); html("td", { class: "num" }, tr, fmtBytes(b)); html("td", { class: "muted" }, tr, c);
  }
  if (A.replay) html("p", { class: "muted" }, document.getElementById("allocator-notes"), A.replay);
  if (D.oom) {
    const o = D.oom, box = html("div", { class: "warn oom" }, document.getElementById("allocator-notes"));
    box.textContent = `Out of memory at event ${o.event}: ${fmtBytes(o.request.size)} requested` +
      (o.shortfall != null ? `, short by ${fmtBytes(o.shortfall)}` : "") + ". " +
      Object.entries(o.cached_unusable || {}).filter(([, v]) => v).map(([k, v]) => fmtBytes(v) + " cached but " + k.replace(/_/g, " ")).join(", ");
  }
}

// ---- sortable tables
function table(id, columns, rows) {
  const box = document.getElementById(id);
  if (!rows.length) { html("p", { class: "muted" }, box, "(none)"); return; }
  const wrap = html("div", { class: "scroll" }, box);
  const t = html("table", {}, wrap), head = html("tr", {}, html("thead", {}, t)), body = html("tbody", {}, t);
  let sortKey = null, dir = -1;
  function fill() {
    body.innerHTML = "";
    const sorted = sortKey === null ? rows : rows.slice().sort((a, b) => {
      const x = a[sortKey], y = b[sortKey];
      return (typeof x === "number" ? x - y : String(x).localeCompare(String(y))) * dir;
    });
    for (const r of sorted) {
      const tr = html("tr", {}, body);
      for (const c of columns) html("td", { class: c.cls || "" }, tr, c.fmt ? c.fmt(r[c.key]) : r[c.key]);
    }
    box.dataset.sort = sortKey === null ? "" : sortKey + (dir > 0 ? ":asc" : ":desc");
  }
  for (const c of columns) {
    const th = html("th", { class: c.cls === "num" ? "num" : "" }, head, c.label);
    th.addEventListener("click", () => {
      dir = sortKey === c.key ? -dir : (c.cls === "num" ? -1 : 1);
      sortKey = c.key;
      for (const o of head.children) o.classList.remove("asc", "desc");
      th.classList.add(dir > 0 ? "asc" : "desc");
      fill();
    });
  }
  fill();
}
function tables() {
  const B = { fmt: fmtBytes, cls: "num" }, N = { cls: "num" };
  table("sites", [{ key: "live_bytes", label: "live", ...B }, { key: "allocated_bytes", label: "allocated (all)", ...B },
    { key: "allocations", label: "count", ...N }, { key: "site", label: "site", cls: "site" }], D.sites);
  table("groups", [{ key: "bytes", label: "bytes", ...B }, { key: "count", label: "n", ...N }, { key: "category", label: "category" },
    { key: "module", label: "module" }, { key: "site", label: "site", cls: "site" }], D.groups);
  table("leaks", [{ key: "bytes", label: "bytes", ...B }, { key: "count", label: "n", ...N }, { key: "category", label: "category" },
    { key: "module", label: "module" }, { key: "last_iteration", label: "last iteration", ...N }, { key: "site", label: "site", cls: "site" }], D.leaks);
  table("iterations", [{ key: "iteration", label: "iteration", ...N }, { key: "peak_allocated_bytes", label: "peak", ...B },
    { key: "growth_bytes", label: "growth", ...B }, { key: "leaked_bytes", label: "leaked", ...B }], D.iterations);
  if (D.kv_cache) {  // generation's KV cache, in tokens where the watched model's config says a token's bytes
    const kv = D.kv_cache, p = document.createElement("p"), sites = document.getElementById("sites");
    p.id = "kv-cache";
    p.textContent = `KV cache: ${fmtBytes(kv.bytes)} at this moment, at most ${fmtBytes(kv.most_bytes)}` + (kv.shape
      ? `; ${kv.tokens.toLocaleString()} tokens of ${fmtBytes(kv.shape.bytes_per_token)} (at most ` +
        `${kv.most_tokens.toLocaleString()}), ${kv.tokens_per_gib.toLocaleString()} tokens a GiB` : "");
    sites.parentNode.insertBefore(p, sites);
  }
  if (D.serving) {  // a serving engine's memory, as the capture measured it (reports/serving.py)
    const s = D.serving, p = document.createElement("p"), sites = document.getElementById("sites");
    const parts = [`weights ${fmtBytes(s.weights_bytes)}`];
    if (s.kv_cache_bytes != null) parts.push(`KV cache ${fmtBytes(s.kv_cache_bytes)}`);
    parts.push(`CUDA graphs' private pools ${fmtBytes(s.graph_pool_bytes)}`);
    if (s.capture_model) parts.push(`capturing the graphs reserved ${fmtBytes(s.capture_model.reserved_bytes)} more`);
    if (s.profile_run) parts.push(`the profile run's peak activation ${fmtBytes(s.profile_run.peak_activation_bytes)}`);
    if (s.outside_allocator_bytes != null) parts.push(`outside torch's allocator ${fmtBytes(s.outside_allocator_bytes)}`);
    p.id = "serving";
    p.textContent = `${s.engine === "vllm" ? "vLLM" : s.engine}, measured: ${parts.join(", ")}`;
    sites.parentNode.insertBefore(p, sites);
  }
}

function toolbar() {
  for (const b of document.querySelectorAll("#timeline-toolbar button[data-mode]")) {
    b.addEventListener("click", () => {
      TL.mode = b.dataset.mode;
      for (const o of document.querySelectorAll("#timeline-toolbar button[data-mode]")) o.classList.toggle("on", o === b);
      drawTimeline();
    });
  }
  document.getElementById("zoom-reset").addEventListener("click", () => { TL.range = null; drawTimeline(); });
  for (const b of document.querySelectorAll("#timeline-toolbar button[data-axis]")) {
    b.classList.toggle("on", b.dataset.axis === TL.axis);
    b.addEventListener("click", () => {
      TL.axis = b.dataset.axis;
      TL.range = null;  // a range in one unit means nothing in the other
      for (const o of document.querySelectorAll("#timeline-toolbar button[data-axis]")) o.classList.toggle("on", o === b);
      drawTimeline();
    });
  }
  for (const b of document.querySelectorAll("#flame-toolbar button[data-view]")) {
    b.addEventListener("click", () => { FG.view = b.dataset.view; FG.zoom = null; drawFlame(); });
  }
  const lib = document.getElementById("flame-library");
  if (lib) {
    lib.addEventListener("click", () => { FG.library = !FG.library; FG.zoom = null; drawFlame(); });
  }
}

header();
drawFit();
drawRanks();
toolbar();
drawTimeline();
drawWaterfall();
drawFlame();
allocatorFigures();
drawSegments();
tables();
document.body.dataset.ready = "1";
