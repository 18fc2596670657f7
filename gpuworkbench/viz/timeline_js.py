"""The timeline's browser code (BokehJS ``CustomJS`` bodies), kept apart from the Python that builds the figure.

``VIEW`` runs whenever the visible time range or the plot's width changes. For a large trace it fills the drawn
sources from the compact arrays of every span (``raw``, sorted by start): the spans themselves when few enough are in
view, else cells per (row, pixel column) computed like ``aggregate.aggregate``. In every trace it then writes the
names of bars wide enough to hold them. ``LINKS`` draws the arrow from a hovered or selected device span's launching
call (or its enqueue) to the span. ``BYTE_TICKS`` is the memory plot's tick formatter (``memory.byte_tick_labels``).
"""

from __future__ import annotations

#: args: fig, spans, states, agg, waits, labels, raw (None for a small trace), row_names, names, styles, copies, inks,
#: n_styles, wait_style, kind_of_wait, limit, max_dur, char_px, busy_steps, cell_px, heights, alphas,
#: range_style, nest_shrink, nest_min.
#: Writes ``spans``, ``states``, ``agg`` and ``waits`` (large traces only) and ``labels``.
VIEW = r"""
const xr = fig.x_range
const lo = xr.start, hi = xr.end
const px = Math.max(fig.inner_width || 0, 50)
if (!(hi > lo)) return
const memo = labels.__gw || (labels.__gw = {})
const key = lo + ':' + hi + ':' + px
if (memo.key === key) return
memo.key = key
const began = performance.now()
const per_px = (hi - lo) / px

if (raw != null) {
  const r = raw.data
  const start = r.start, dur = r.dur, row = r.row, style = r.style
  const n = start.length
  const first_at = (x) => {
    let a = 0, b = n
    while (a < b) { const m = (a + b) >>> 1; if (start[m] < x) a = m + 1; else b = m }
    return a
  }
  const i0 = first_at(lo - max_dur)
  let i1 = first_at(hi); while (i1 < n && start[i1] <= hi) i1++
  let seen = 0
  for (let i = i0; i < i1 && seen <= limit; i++) if (start[i] + dur[i] >= lo) seen++
  if (seen <= limit) {
    const s = {left: [], right: [], row: [], kind: [], style: [], name: [], bytes: [], gbps: [], duration_us: [],
               launch_us: [], queue_us: [], call: [], call_left: [], call_row: [], height: [], alpha: []}
    const t = {left: [], right: [], row: [], state: [], duration_us: []}
    // Two passes: host ranges first, so that the calls inside them are drawn on top.
    for (const ranges of [true, false]) {
      for (let i = i0; i < i1; i++) {
        const e = start[i] + dur[i]
        if (e < lo) continue
        const st = style[i]
        if ((st == range_style) != ranges) continue
        if (st >= n_styles) {
          t.left.push(start[i]); t.right.push(e); t.row.push(row_names[row[i]]); t.state.push(styles[st])
          t.duration_us.push(dur[i] * 1e3)
          continue
        }
        const d_ms = dur[i], nb = r.bytes[i], lat = r.lat[i], kind_code = st == wait_style ? kind_of_wait : st
        s.left.push(start[i]); s.right.push(e); s.row.push(row_names[row[i]])
        s.kind.push(styles[kind_code]); s.style.push(styles[st]); s.name.push(names[r.name[i]])
        s.bytes.push(nb); s.duration_us.push(d_ms * 1e3)
        s.gbps.push(nb > 0 && d_ms > 0 && copies.includes(styles[st]) ? nb / (d_ms * 1e6) : NaN)
        const linked = !isNaN(lat)
        s.launch_us.push(linked ? lat * 1e3 : NaN); s.queue_us.push(linked ? r.queue[i] * 1e3 : NaN)
        s.call.push(linked ? names[r.oname[i]] : ''); s.call_left.push(linked ? start[i] - lat : NaN)
        const depth = r.depth[i]
        s.call_row.push(linked ? row_names[r.orow[i]] : '')
        s.height.push(depth > 0 ? Math.max(heights[kind_code] * nest_shrink ** depth, nest_min) : heights[kind_code])
        s.alpha.push(alphas[kind_code])
      }
    }
    const wt = {left: [], right: [], row: [], height: []}
    for (let j = 0; j < s.left.length; j++) {
      if (s.style[j] != styles[wait_style]) continue
      wt.left.push(s.left[j]); wt.right.push(s.right[j]); wt.row.push(s.row[j]); wt.height.push(s.height[j])
    }
    spans.selected.indices = []
    spans.data = s; states.data = t; waits.data = wt
    agg.data = {left: [], right: [], row: [], style: [], count: [], busy: [], alpha: []}
  } else {
    // Cells per (row, pixel column): the same arithmetic as aggregate.aggregate, in start order.
    const bins = Math.max(Math.floor(px / cell_px), 1), w = (hi - lo) / bins
    const n_rows = row_names.length, k = styles.length
    const cells = n_rows * bins
    const count = new Int32Array(cells * k), busy = new Float64Array(cells * k)
    const reach = new Float64Array(n_rows).fill(-Infinity)
    for (let i = i0; i < i1; i++) {
      const s0 = start[i], e = s0 + dur[i], rw = row[i], st = style[i]
      const prev = reach[rw]
      if (e > prev) reach[rw] = e
      if (e < lo) continue
      const b_first = Math.min(Math.max(Math.floor((Math.max(s0, lo) - lo) / w), 0), bins - 1)
      count[(rw * bins + b_first) * k + st]++
      const a = Math.min(Math.max(Math.max(s0, prev), lo), hi), b = Math.min(e, hi)
      if (!(b > a)) continue
      const b0 = Math.min(Math.max(Math.floor((a - lo) / w), 0), bins - 1)
      const b1 = Math.max(Math.min(Math.max(Math.ceil((b - lo) / w) - 1, 0), bins - 1), b0)
      for (let bb = b0; bb <= b1; bb++) {
        const l = lo + bb * w
        busy[(rw * bins + bb) * k + st] += Math.min(b, l + w) - Math.max(a, l)
      }
    }
    // Neighbouring cells of a row in the same style and busy step merge into one bar (as timeline.cell_columns).
    const c = {left: [], right: [], row: [], style: [], count: [], busy: [], alpha: []}
    let run = null
    const flush = () => {
      if (run == null) return
      c.left.push(lo + run.b0 * w); c.right.push(lo + (run.b1 + 1) * w); c.row.push(row_names[run.row])
      c.style.push(styles[run.style]); c.count.push(run.count); c.busy.push(run.busy / (run.b1 - run.b0 + 1))
      c.alpha.push(0.25 + 0.75 * run.step / busy_steps)
      run = null
    }
    for (let cell = 0; cell < cells; cell++) {
      let total = 0, spans_in = 0, best = -1, best_score = -1
      for (let j = 0; j < k; j++) {
        const q = cell * k + j
        total += busy[q]; spans_in += count[q]
        const score = busy[q] + 1e-9 * w * count[q]
        if (score > best_score) { best_score = score; best = j }
      }
      if (spans_in == 0 && !(total > 0)) continue
      const bb = cell % bins, rw = Math.floor(cell / bins), frac = Math.min(total / w, 1)
      const step = Math.round(frac * busy_steps)
      if (run != null && run.row == rw && run.style == best && run.step == step && run.b1 == bb - 1) {
        run.b1 = bb; run.count += spans_in; run.busy += frac
      } else {
        flush()
        run = {row: rw, style: best, step: step, b0: bb, b1: bb, count: spans_in, busy: frac}
      }
    }
    flush()
    spans.selected.indices = []
    spans.data = {left: [], right: [], row: [], kind: [], style: [], name: [], bytes: [], gbps: [], duration_us: [],
                  launch_us: [], queue_us: [], call: [], call_left: [], call_row: [], height: [], alpha: []}
    states.data = {left: [], right: [], row: [], state: [], duration_us: []}
    waits.data = {left: [], right: [], row: [], height: []}
    agg.data = c
  }
}

// Names on the bars wide enough to hold a few of their characters, cut with an ellipsis where they do not fit.
const d = spans.data
const out = {x: [], row: [], text: [], color: []}
const m = d.left.length
for (let i = 0; i < m && out.x.length < 600; i++) {
  const name = d.name[i]
  if (!name || d.kind[i] == 'range') continue  // a range's name would sit under the calls inside it
  const l = Math.max(d.left[i], lo), rr = Math.min(d.right[i], hi)
  const room = Math.floor(((rr - l) / per_px - 6) / char_px)
  if (room < 4) continue
  out.x.push(l + 3 * per_px); out.row.push(d.row[i])
  out.text.push(name.length <= room ? name : name.slice(0, room - 1) + '\u2026')
  out.color.push(inks[d.style[i]] || '#000000')
}
labels.data = out
memo.ms = performance.now() - began  // what the benchmark reads: this callback's time
"""

#: args: spans, links. A hover tool's callback (``cb_data.index``) and the selection's: arrows from launch to run.
LINKS = r"""
const d = spans.data
const chosen = new Set(spans.selected.indices)
if (cb_data != null && cb_data.index != null) for (const i of cb_data.index.indices) chosen.add(i)
const key = [...chosen].sort((a, b) => a - b).join(',')
if (links.__gw_key === key) return
links.__gw_key = key
const out = {x0: [], y0: [], x1: [], y1: [], call: [], launch_us: []}
for (const i of chosen) {
  if (out.x0.length >= 200) break
  const x0 = d.call_left[i]
  if (x0 == null || isNaN(x0)) continue
  out.x0.push(x0); out.y0.push(d.call_row[i]); out.x1.push(d.left[i]); out.y1.push(d.row[i])
  out.call.push(d.call[i]); out.launch_us.push(d.launch_us[i])
}
links.data = out
"""

#: A ``CustomJSTickFormatter`` body (``tick``, ``index``, ``ticks``): the browser's ``memory.byte_tick_labels``.
BYTE_TICKS = r"""
const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB']
const top = Math.max(...ticks.map(Math.abs))
let u = 0
while (u < units.length - 1 && top >= Math.pow(1024, u + 1)) u++
const scale = Math.pow(1024, u)
let step = Infinity
for (let i = 1; i < ticks.length; i++) step = Math.min(step, Math.abs(ticks[i] - ticks[i - 1]))
if (!isFinite(step) || step == 0) step = scale
let dec = 0
for (; dec < 5; dec++) {
  const labels = ticks.map((t) => (t / scale).toFixed(dec))
  const exact = ticks.every((t, i) => Math.abs(Number(labels[i]) * scale - t) <= 0.05 * step)
  if (exact && new Set(labels).size == ticks.length) break
}
return (tick / scale).toFixed(dec) + ' ' + units[u]
"""
