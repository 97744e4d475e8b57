// The compare page: any number of runs overlaid per metric (EMA smoothing, x by step, samples,
// tokens or wall time, optional grouping by a config field with mean and spread bands), their
// summaries, the config fields that differ, and the same prompt's rollouts side by side.
// Every setting lives in the query string, so a view can be shared or reloaded as it is.
import { $, api, debounce, el, formatNumber, splitList, stateBadge, TERMINAL_STATES } from "./api.js";
import { HEADLINE_METRICS, metricInfo } from "./metric_catalogue.js";

// =============================================================================================
// Pure functions (exported so they can be checked without the page)
// =============================================================================================

function isFiniteNumber(v) {
  return typeof v === "number" && Number.isFinite(v);
}

// TensorBoard's debiased EMA: the running average starts at 0, so it is divided by (1 - w^n) to
// remove the pull towards 0 of the first points (the first smoothed point is the raw point).
// Missing values (null/NaN) stay missing and do not advance the average.
export function emaSmooth(values, weight) {
  if (!(weight > 0)) return values.map((v) => (isFiniteNumber(v) ? v : null));
  let average = 0;
  let count = 0;
  return values.map((v) => {
    if (!isFiniteNumber(v)) return null;
    average = average * weight + (1 - weight) * v;
    count += 1;
    return average / (1 - weight ** count);
  });
}

// The finite (x, y) points of a series, sorted by x.
export function finitePoints(xs, ys) {
  const points = [];
  for (let i = 0; i < xs.length; i += 1) {
    if (isFiniteNumber(xs[i]) && isFiniteNumber(ys[i])) points.push([xs[i], ys[i]]);
  }
  return points.sort((a, b) => a[0] - b[0]);
}

// y at x by linear interpolation between a series' neighbouring points; null outside its range
// (a run says nothing about steps it never reached, so it is not extrapolated).
export function interpolateAt(points, x) {
  if (!points.length || x < points[0][0] || x > points[points.length - 1][0]) return null;
  let lo = 0;
  let hi = points.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (points[mid][0] <= x) lo = mid;
    else hi = mid;
  }
  const [x0, y0] = points[lo];
  const [x1, y1] = points[hi];
  if (x === x0 || x1 === x0) return y0;
  if (x === x1) return y1;
  return y0 + ((y1 - y0) * (x - x0)) / (x1 - x0);
}

// Evenly spaced entries of a sorted array, first and last kept.
export function thin(sorted, maxLength) {
  if (sorted.length <= maxLength || maxLength < 2) return sorted;
  const step = (sorted.length - 1) / (maxLength - 1);
  return Array.from({ length: maxLength }, (_, i) => sorted[Math.round(i * step)]);
}

// Mean and spread of several runs' series ([{x, y}]) on one x grid.
// Runs are aligned on the union of their x values, each interpolated linearly inside its own range:
// common x values would work for steps but not for wall time, samples or tokens, where runs almost
// never log at the same x. At each x only the runs that cover it count (`count` says how many).
// spread "minmax": the band is min..max; "std": mean ± one sample standard deviation (0 for one run).
export function aggregateGroup(seriesList, spread = "minmax", maxPoints = 2000) {
  const runs = seriesList.map((s) => finitePoints(s.x, s.y)).filter((points) => points.length);
  const grid = thin([...new Set(runs.flatMap((points) => points.map((p) => p[0])))].sort((a, b) => a - b), maxPoints);
  const out = { x: [], mean: [], lower: [], upper: [], count: [] };
  for (const x of grid) {
    const values = runs.map((points) => interpolateAt(points, x)).filter((v) => v !== null);
    if (!values.length) continue;
    const mean = values.reduce((a, b) => a + b, 0) / values.length;
    let lower;
    let upper;
    if (spread === "std") {
      const sd = values.length > 1
        ? Math.sqrt(values.reduce((a, v) => a + (v - mean) ** 2, 0) / (values.length - 1)) : 0;
      lower = mean - sd;
      upper = mean + sd;
    } else {
      lower = Math.min(...values);
      upper = Math.max(...values);
    }
    out.x.push(x);
    out.mean.push(mean);
    out.lower.push(lower);
    out.upper.push(upper);
    out.count.push(values.length);
  }
  return out;
}

// Whether a lower or a higher value of the metric is the better one (the metric catalogue says; a metric
// it does not know counts as higher-is-better, like an accuracy); null when neither is (a counter).
export function metricGoal(name) {
  const info = metricInfo(name);
  if (!info) return "max";
  if (info.higher_is_better === null) return null;
  return info.higher_is_better ? "max" : "min";
}

export function bestValue(name, summary) {
  const goal = metricGoal(name);
  if (!summary || !goal) return null;
  return goal === "min" ? summary.min : summary.max;
}

// {"a.b": 1, "rewards.0.name": "x", "train.betas": [0.9, 0.999]}: objects and lists of objects
// become dotted paths; lists of plain values and empty containers stay one field.
export function flattenConfig(value, prefix = "", out = {}) {
  const isContainer = value !== null && typeof value === "object";
  const hasChildren = isContainer && Object.keys(value).length > 0;
  const plainList = Array.isArray(value) && value.every((v) => v === null || typeof v !== "object");
  if (!hasChildren || plainList) {
    if (prefix) out[prefix] = value;
    return out;
  }
  for (const [key, child] of Object.entries(value)) flattenConfig(child, prefix ? `${prefix}.${key}` : key, out);
  return out;
}

// A value as it reads in a table (and as values are compared): JSON, strings unquoted; undefined = missing.
export function configText(value) {
  if (value === undefined) return "—";
  return typeof value === "string" ? value : JSON.stringify(value);
}

// The flattened paths of all configs, and those whose value is not the same in every config
// (a path missing from some config differs).
export function configPaths(flatConfigs) {
  const all = [...new Set(flatConfigs.flatMap((c) => Object.keys(c)))].sort();
  const differing = new Set(all.filter((path) => {
    const first = JSON.stringify(flatConfigs[0]?.[path]);
    return flatConfigs.some((c) => !(path in c) || JSON.stringify(c[path]) !== first);
  }));
  return { all, differing };
}

// Runs grouped by the value of one config path, in order of first appearance.
export function groupRuns(runs, flatConfigs, path) {
  const groups = new Map();
  runs.forEach((run, i) => {
    const key = configText(flatConfigs[i][path]);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(run);
  });
  return [...groups].map(([value, members]) => ({ value, runs: members }));
}

export const PALETTE = ["#3559d6", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#0c8599", "#a61e4d", "#5c940d",
  "#d9480f", "#1864ab", "#862e9c", "#e67700"];

function hashString(text) {
  let hash = 2166136261;
  for (let i = 0; i < text.length; i += 1) hash = Math.imul(hash ^ text.charCodeAt(i), 16777619);
  return hash >>> 0;
}

// A colour per run that depends on the run, not on its place in the list, so adding or removing
// a run does not repaint the others; a taken colour moves on to the next free one.
export function assignColors(ids, palette = PALETTE) {
  const colors = new Map();
  const taken = new Set();
  for (const id of ids) {
    let index = hashString(String(id)) % palette.length;
    for (let tries = 0; tries < palette.length && taken.has(index); tries += 1) index = (index + 1) % palette.length;
    taken.add(index);
    if (taken.size >= palette.length) taken.clear(); // more runs than colours: start reusing
    colors.set(id, palette[index]);
  }
  return colors;
}

export const X_AXES = { step: "step", samples: "samples", tokens: "tokens", time: "wall time (s since start)" };
export const DEFAULT_METRICS = HEADLINE_METRICS;

// The page's settings from a query string, with defaults; `metrics` is null when not chosen yet.
export function readSettings(search) {
  const q = new URLSearchParams(search);
  const smooth = Number(q.get("smooth"));
  const step = q.get("step");
  return {
    runs: [...new Set(splitList(q.get("runs")))],
    metrics: q.has("metrics") ? splitList(q.get("metrics")) : null,
    x: Object.hasOwn(X_AXES, q.get("x")) ? q.get("x") : "step",
    smooth: Number.isFinite(smooth) ? Math.min(Math.max(smooth, 0), 0.99) : 0,
    group: q.get("group") || "",
    band: q.get("band") === "std" ? "std" : "minmax",
    allFields: q.get("fields") === "all",
    prompt: q.get("prompt") || "",
    step: step !== null && /^\d+$/.test(step) ? step : "",
  };
}

// The query string of the settings; defaults are left out to keep shared links short.
export function settingsQuery(s) {
  const q = new URLSearchParams();
  if (s.runs.length) q.set("runs", s.runs.join(","));
  if (s.metrics) q.set("metrics", s.metrics.join(","));
  if (s.x !== "step") q.set("x", s.x);
  if (s.smooth > 0) q.set("smooth", String(s.smooth));
  if (s.group) q.set("group", s.group);
  if (s.band !== "minmax") q.set("band", s.band);
  if (s.allFields) q.set("fields", "all");
  if (s.prompt) q.set("prompt", s.prompt);
  if (s.step !== "") q.set("step", s.step);
  // Commas and slashes are legal in a query string; left unescaped, a shared link stays readable.
  return q.toString().replace(/%2C/gi, ",").replace(/%2F/gi, "/");
}

// =============================================================================================
// The page
// =============================================================================================

const MAX_POINTS = 1500;
let settings; // readSettings(location.search) when the page starts
let compared = null; // the last /api/compare/ answer
let colors = new Map();
let compareRequest = 0; // only the newest answer is drawn when requests overlap

function saveSettings() {
  const query = settingsQuery(settings);
  window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
}

function showError(where, error) {
  const text = error?.message || String(error);
  $(where).replaceChildren(el("div", { class: "alert critical", role: "alert" }, text));
}

function clearError(where) {
  $(where).replaceChildren();
}

function swatch(color) {
  return el("span", { class: "swatch", style: `background:${color}` });
}

function runsById() {
  return new Map((compared?.runs || []).map((r) => [String(r.id), r]));
}

function flatConfigs() {
  return (compared?.runs || []).map((r) => flattenConfig(r.config || {}));
}

// --- runs: chips and the picker ------------------------------------------------------------

function renderChips() {
  const known = runsById();
  const groupOf = new Map();
  if (settings.group && compared) {
    const flats = flatConfigs();
    compared.runs.forEach((r, i) => groupOf.set(String(r.id), configText(flats[i][settings.group])));
  }
  $("run-chips").replaceChildren(...settings.runs.map((id) => {
    const run = known.get(id);
    return el("span", { class: "run-chip", "data-run": id },
      swatch(colors.get(id) || "#999"),
      el("a", { href: `/runs/${id}/` }, run ? run.name || id : `${id.slice(0, 8)}…`),
      run ? stateBadge(run.state) : null,
      groupOf.has(id) ? el("span", { class: "tag" }, groupOf.get(id)) : null,
      el("button", { type: "button", class: "chip-remove", title: "Remove from the comparison",
        "aria-label": `Remove ${run?.name || id}`, onclick: () => setRuns(settings.runs.filter((r) => r !== id)) }, "×"));
  }));
  const count = settings.runs.length;
  $("empty-state").replaceChildren(count >= 2 ? "" : el("div", { class: "alert" },
    count === 0 ? "Pick at least two runs to compare: search for them by name, note or experiment above."
      : "One run picked: its curves, summary and config are shown; pick at least one more run to compare."));
}

function setRuns(ids) {
  settings.runs = [...new Set(ids)];
  if (!settings.runs.length) settings.prompt = "";
  colors = assignColors(settings.runs);
  saveSettings();
  renderChips();
  loadCompare();
  loadPrompts();
}

let searchRequest = 0; // only the newest search answer is shown

function addRun(id) {
  searchRequest += 1; // drop any search still on its way
  $("run-search").value = "";
  $("run-results").hidden = true;
  setRuns([...settings.runs, id]);
}

async function searchRuns() {
  const q = $("run-search").value.trim();
  const request = ++searchRequest;
  try {
    const page = await api("/api/runs/", { params: { search: q, limit: 12, ordering: "-created_at" } });
    // A newer search is under way, or a run was just picked (a debounced search may still land).
    if (request !== searchRequest || document.activeElement !== $("run-search")) return;
    const results = (page.results || []).filter((r) => !settings.runs.includes(String(r.id)));
    clearError("run-search-error");
    $("run-results").replaceChildren(...(results.length ? results.map((r) => el("li", {},
      el("button", { type: "button", class: "run-result", "data-run": r.id,
        onclick: () => addRun(String(r.id)) },
        el("strong", {}, r.name || r.id), " ", el("span", { class: "muted" }, r.experiment_name), " ",
        stateBadge(r.state)))) : [el("li", { class: "muted" }, q ? `No other run matches “${q}”.` : "No other runs.")]));
    $("run-results").hidden = false;
  } catch (error) {
    showError("run-search-error", error);
  }
}

// --- metrics and controls ------------------------------------------------------------------

function availableMetrics() {
  return [...new Set((compared?.runs || []).flatMap((r) => Object.keys(r.summary || {})))].sort();
}

function chosenMetrics() {
  return settings.metrics ?? DEFAULT_METRICS;
}

function renderMetricPicker() {
  const chosen = chosenMetrics();
  $("metric-tags").replaceChildren(...chosen.map((name) => el("span", { class: "metric-tag", "data-metric": name },
    name, el("button", { type: "button", class: "chip-remove", "aria-label": `Hide ${name}`,
      onclick: () => setMetrics(chosen.filter((m) => m !== name)) }, "×"))));
  const byGroup = new Map();
  for (const name of availableMetrics().filter((m) => !chosen.includes(m))) {
    const group = name.includes("/") ? name.split("/")[0] : "other";
    if (!byGroup.has(group)) byGroup.set(group, []);
    byGroup.get(group).push(name);
  }
  $("metric-add").replaceChildren(el("option", { value: "" }, byGroup.size ? "Add a metric…" : "No other metrics"),
    ...[...byGroup].map(([group, names]) => el("optgroup", { label: group },
      ...names.map((n) => el("option", { value: n }, n)))));
}

function setMetrics(names) {
  settings.metrics = names;
  saveSettings();
  renderMetricPicker();
  loadCompare();
}

function renderGroupPicker() {
  const select = $("group-by");
  const flats = flatConfigs();
  const { all, differing } = flats.length ? configPaths(flats) : { all: [], differing: new Set() };
  const same = all.filter((p) => !differing.has(p));
  const options = [el("option", { value: "" }, "no grouping")];
  if (differing.size) {
    options.push(el("optgroup", { label: "differ between these runs" },
      ...[...differing].map((p) => el("option", { value: p }, p))));
  }
  if (same.length) {
    options.push(el("optgroup", { label: "same in every run" }, ...same.map((p) => el("option", { value: p }, p))));
  }
  if (settings.group && !all.includes(settings.group)) {
    options.push(el("option", { value: settings.group }, settings.group)); // from a shared link; no run has it
  }
  select.replaceChildren(...options);
  select.value = settings.group;
  $("band-label").hidden = !settings.group;
}

// --- charts --------------------------------------------------------------------------------

function withAlpha(hex, alpha) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

function seriesOf(run, metric) {
  const s = run.series?.[metric];
  return s && s.x?.length ? s : null;
}

function runTraces(run, metric) {
  const series = seriesOf(run, metric);
  if (!series) return [];
  const color = colors.get(String(run.id)) || "#999";
  const name = run.name || String(run.id);
  const common = { x: series.x, type: "scatter", mode: "lines", name, legendgroup: String(run.id) };
  if (!(settings.smooth > 0)) {
    return [{ ...common, y: series.y, line: { color, width: 2 }, meta: { role: "run", run: run.id },
      hovertemplate: `${name}: %{y:.4~g}<extra></extra>` }];
  }
  // The raw line stays faint behind the smoothed one, so smoothing never hides a spike.
  return [
    { ...common, y: series.y, line: { color, width: 1 }, opacity: 0.25, showlegend: false, hoverinfo: "skip",
      meta: { role: "raw", run: run.id } },
    { ...common, y: emaSmooth(series.y, settings.smooth), customdata: series.y, line: { color, width: 2 },
      meta: { role: "run", run: run.id }, hovertemplate: `${name}: %{y:.4~g} (raw %{customdata:.4~g})<extra></extra>` },
  ];
}

function groupTraces(metric) {
  const flats = flatConfigs();
  const groups = groupRuns(compared.runs, flats, settings.group);
  const bandName = settings.band === "std" ? "±1 std" : "min–max";
  const traces = [];
  const bands = [];
  groups.forEach((group, i) => {
    // The group wears its first run's colour, so the chips above still say which lines are whose.
    const color = colors.get(String(group.runs[0].id)) || PALETTE[i % PALETTE.length];
    const label = `${settings.group} = ${group.value}`;
    const smoothed = [];
    for (const run of group.runs) {
      const series = seriesOf(run, metric);
      if (!series) continue;
      const y = emaSmooth(series.y, settings.smooth);
      smoothed.push({ x: series.x, y });
      const name = run.name || String(run.id);
      // Each run stays visible, thin and faint, under its group's mean.
      traces.push({ x: series.x, y, type: "scatter", mode: "lines", name, legendgroup: label, showlegend: false,
        line: { color, width: 1 }, opacity: 0.35, meta: { role: "run", run: run.id },
        hovertemplate: `${name}: %{y:.4~g}<extra></extra>` });
    }
    if (!smoothed.length) return;
    const agg = aggregateGroup(smoothed, settings.band);
    bands.push(
      { x: agg.x, y: agg.upper, type: "scatter", mode: "lines", line: { width: 0, color }, showlegend: false,
        legendgroup: label, hoverinfo: "skip", meta: { role: "band-upper" } },
      { x: agg.x, y: agg.lower, type: "scatter", mode: "lines", line: { width: 0, color }, fill: "tonexty",
        fillcolor: withAlpha(color, 0.18), name: `${label} (${bandName})`, legendgroup: label, hoverinfo: "skip",
        meta: { role: "band-lower" } },
      { x: agg.x, y: agg.mean, customdata: agg.count, type: "scatter", mode: "lines", line: { color, width: 2.5 },
        name: `${label}: mean of ${group.runs.length}`, legendgroup: label, meta: { role: "mean" },
        hovertemplate: `${label} mean: %{y:.4~g} (%{customdata} runs)<extra></extra>` },
    );
  });
  return [...traces, ...bands];
}

function chartLayout(metric, empty) {
  return {
    title: { text: metric, font: { size: 14 } },
    margin: { l: 55, r: 15, t: 40, b: 100 },
    height: 350,
    xaxis: { title: { text: X_AXES[settings.x], standoff: 6 } },
    yaxis: { automargin: true },
    hovermode: "x unified",
    showlegend: true,
    legend: { orientation: "h", yanchor: "top", y: -0.3 }, // below the x axis title
    uirevision: `${metric}|${settings.x}`, // keep the user's zoom across smoothing/grouping redraws
    annotations: empty ? [{ text: "no points for these runs on this x axis", showarrow: false, xref: "paper",
      yref: "paper", x: 0.5, y: 0.5, font: { color: "#5b6676" } }] : [],
  };
}

function chartId(metric) {
  return `chart-${metric.replace(/[^A-Za-z0-9_-]/g, "-")}`;
}

function renderCharts() {
  const container = $("charts");
  const metrics = compared && compared.runs.length ? chosenMetrics() : [];
  for (const div of [...container.children]) {
    if (!metrics.includes(div.dataset.metric)) {
      if (window.Plotly) window.Plotly.purge(div);
      div.remove();
    }
  }
  metrics.forEach((metric, index) => {
    let div = container.querySelector(`[data-metric="${CSS.escape(metric)}"]`);
    if (!div) div = el("div", { class: "chart", id: chartId(metric), "data-metric": metric });
    if (container.children[index] !== div) container.insertBefore(div, container.children[index] || null);
    const traces = settings.group ? groupTraces(metric) : compared.runs.flatMap((run) => runTraces(run, metric));
    window.Plotly.react(div, traces, chartLayout(metric, traces.length === 0), { responsive: true, displaylogo: false });
  });
  const downsampled = (compared?.runs || []).some((r) => Object.values(r.series || {}).some((s) => s.downsampled));
  $("chart-note").textContent = downsampled
    ? `Long series are downsampled on the server to about ${MAX_POINTS} points; the summary table uses every point.` : "";
}

// --- summary and config tables -------------------------------------------------------------

function renderSummary() {
  const runs = compared?.runs || [];
  if (!runs.length) {
    $("summary").replaceChildren();
    return;
  }
  const rows = [];
  for (const metric of chosenMetrics()) {
    const goal = metricGoal(metric);
    runs.forEach((run, i) => {
      const s = run.summary?.[metric];
      rows.push(el("tr", { "data-metric": metric, "data-run": run.id },
        i === 0 ? el("th", { rowspan: runs.length, scope: "rowgroup" }, metric,
          el("div", { class: "muted" }, { max: "best = highest", min: "best = lowest" }[goal] ?? "no better side")) : null,
        el("td", {}, swatch(colors.get(String(run.id)) || "#999"), " ", run.name || String(run.id)),
        el("td", { class: "num", "data-col": "last" }, formatNumber(s?.last)),
        el("td", { class: "num", "data-col": "step" }, formatNumber(s?.step)),
        el("td", { class: "num best", "data-col": "best" }, formatNumber(bestValue(metric, s))),
        el("td", { class: "num", "data-col": "min" }, formatNumber(s?.min)),
        el("td", { class: "num", "data-col": "max" }, formatNumber(s?.max)),
        el("td", { class: "num", "data-col": "count" }, formatNumber(s?.count))));
    });
  }
  $("summary").replaceChildren(el("table", { class: "data summary-table" },
    el("thead", {}, el("tr", {}, ...["metric", "run"].map((h) => el("th", {}, h)),
      ...["last", "at step", "best", "min", "max", "points"].map((h) => el("th", { class: "num" }, h)))),
    el("tbody", {}, ...rows)));
}

function renderConfig() {
  const runs = compared?.runs || [];
  if (!runs.length) {
    $("config").replaceChildren();
    $("config-count").textContent = "";
    return;
  }
  const flats = flatConfigs();
  const { all, differing } = configPaths(flats);
  const paths = settings.allFields ? all : all.filter((p) => differing.has(p));
  $("config-count").textContent = `${differing.size} of ${all.length} fields differ`;
  const header = el("tr", {}, el("th", { class: "sticky-col" }, "field"), ...runs.map((run) => el("th", {},
    swatch(colors.get(String(run.id)) || "#999"), " ", run.name || String(run.id))));
  const body = paths.map((path) => el("tr", { class: differing.has(path) ? "differs" : "", "data-path": path },
    el("th", { class: "sticky-col", scope: "row" }, path),
    ...flats.map((flat) => el("td", {}, configText(flat[path])))));
  if (!body.length) {
    body.push(el("tr", {}, el("td", { colspan: runs.length + 1, class: "muted" },
      runs.length < 2 ? "One run: nothing to compare it with." : "Every field is the same in these runs.")));
  }
  $("config").replaceChildren(el("table", { class: "data config-table" },
    el("thead", {}, header), el("tbody", {}, ...body)));
}

function renderAll() {
  renderChips();
  renderMetricPicker();
  renderGroupPicker();
  renderCharts();
  renderSummary();
  renderConfig();
}

async function loadCompare() {
  const request = ++compareRequest;
  if (!settings.runs.length) {
    compared = null;
    renderAll();
    return;
  }
  $("loading").hidden = false;
  try {
    const answer = await api("/api/compare/", { params: {
      runs: settings.runs.join(","), names: chosenMetrics().join(","), x: settings.x, max_points: MAX_POINTS } });
    if (request !== compareRequest) return;
    compared = answer;
    // The server's spelling of each id (lower case, dashes), so lookups by id agree everywhere.
    const canonical = answer.runs.map((r) => String(r.id));
    if (canonical.length === settings.runs.length && canonical.some((id, i) => id !== settings.runs[i])) {
      settings.runs = canonical;
      colors = assignColors(settings.runs);
      saveSettings();
    }
    clearError("compare-error");
  } catch (error) {
    if (request !== compareRequest) return;
    compared = null;
    showError("compare-error", error);
  } finally {
    if (request === compareRequest) $("loading").hidden = true;
  }
  renderAll();
}

// --- the same prompt, side by side ---------------------------------------------------------

async function loadPrompts() {
  const list = $("prompt-list");
  if (!settings.runs.length) {
    list.replaceChildren();
    $("samples").replaceChildren();
    return;
  }
  try {
    const answer = await api("/api/compare/prompts/", {
      params: { runs: settings.runs.join(","), q: $("prompt-filter").value.trim() } });
    clearError("prompt-error");
    const prompts = answer.prompts || [];
    list.replaceChildren(...(prompts.length ? prompts.map((p) => el("li", {},
      el("button", { type: "button", class: `prompt-option${p.prompt === settings.prompt ? " selected" : ""}`,
        title: p.prompt, onclick: () => choosePrompt(p.prompt) },
        el("span", { class: "prompt-text" }, p.prompt),
        el("span", { class: "muted" }, settings.runs.map((id) => p.counts?.[id] ?? 0).join(" / "), " samples"))))
      : [el("li", { class: "muted" }, "No prompt was sampled in every one of these runs" +
        ($("prompt-filter").value.trim() ? " with this text." : "."))]));
  } catch (error) {
    showError("prompt-error", error);
  }
  if (settings.prompt) loadSamples();
}

function choosePrompt(prompt) {
  settings.prompt = prompt;
  saveSettings();
  for (const button of document.querySelectorAll(".prompt-option")) {
    button.classList.toggle("selected", button.title === prompt);
  }
  loadSamples();
}

// A multi-turn sample's number of model turns (0 for an ordinary one).
function modelTurns(sample) {
  return (sample.turns || []).filter((t) => t.role === "assistant").length;
}

function sampleCard(sample) {
  const components = Object.entries(sample.components || {});
  return el("div", { class: "sample", "data-index": sample.index },
    el("div", { class: "row sample-meta" },
      el("span", { class: "badge" }, "reward ", formatNumber(sample.reward)),
      el("span", {}, "step ", sample.step, " · #", sample.index),
      el("span", { class: "tag" }, sample.finish_reason),
      el("span", {}, formatNumber(sample.length), " tokens"),
      sample.advantage !== null && sample.advantage !== undefined
        ? el("span", {}, "adv ", formatNumber(sample.advantage)) : null,
      sample.kept === false ? el("span", { class: "tag" }, "not kept") : null,
      modelTurns(sample) ? el("span", { class: "tag", title: "model turns of a multi-turn episode" }, `${modelTurns(sample)} turns`) : null),
    el("pre", { class: "code response" }, sample.response),
    components.length ? el("div", { class: "components" },
      ...components.map(([name, value]) => el("span", { class: "tag" }, `${name} ${formatNumber(value)}`))) : null,
    (sample.errors || []).length ? el("div", { class: "error" }, sample.errors.join("; ")) : null);
}

async function loadSamples() {
  if (!settings.prompt || !settings.runs.length) {
    $("samples").replaceChildren();
    return;
  }
  const known = runsById();
  try {
    const answer = await api("/api/compare/samples/", {
      params: { runs: settings.runs.join(","), prompt: settings.prompt, step: settings.step } });
    clearError("prompt-error");
    const label = answer.runs.flatMap((r) => r.samples).find((s) => s.label !== null && s.label !== undefined)?.label;
    $("samples").replaceChildren(
      el("div", { class: "chosen-prompt" }, el("strong", {}, "Prompt"), el("pre", { class: "code" }, settings.prompt),
        label !== undefined ? el("div", { class: "muted" }, "label: ", String(label)) : null),
      el("div", { class: "side-by-side" }, ...answer.runs.map((r) => {
        const run = known.get(String(r.id));
        return el("div", { class: "sample-column", "data-run": r.id },
          el("h3", {}, swatch(colors.get(String(r.id)) || "#999"), " ", run?.name || String(r.id)),
          el("div", { class: "muted" }, r.step === null || r.step === undefined ? "no sample of this prompt"
            : `step ${r.step} · ${r.samples.length} sample${r.samples.length === 1 ? "" : "s"}`),
          ...r.samples.map(sampleCard));
      })));
  } catch (error) {
    showError("prompt-error", error);
  }
}

// --- wiring --------------------------------------------------------------------------------

function wire() {
  const search = $("run-search");
  search.addEventListener("input", debounce(searchRuns, 250));
  search.addEventListener("focus", searchRuns);
  document.addEventListener("click", (event) => {
    if (!event.target.closest(".run-picker")) $("run-results").hidden = true;
  });

  const xSelect = $("x-axis");
  xSelect.value = settings.x;
  xSelect.addEventListener("change", () => {
    settings.x = xSelect.value;
    saveSettings();
    loadCompare();
  });

  const smooth = $("smoothing");
  smooth.value = String(settings.smooth);
  $("smoothing-value").textContent = settings.smooth.toFixed(2);
  smooth.addEventListener("input", () => {
    settings.smooth = Number(smooth.value);
    $("smoothing-value").textContent = settings.smooth.toFixed(2);
    saveSettings();
    renderCharts();
  });

  $("group-by").addEventListener("change", (event) => {
    settings.group = event.target.value;
    saveSettings();
    renderChips();
    renderGroupPicker();
    renderCharts();
  });
  const band = $("band");
  band.value = settings.band;
  band.addEventListener("change", () => {
    settings.band = band.value;
    saveSettings();
    renderCharts();
  });

  $("metric-add").addEventListener("change", (event) => {
    if (event.target.value) setMetrics([...chosenMetrics(), event.target.value]);
  });

  const onlyDiffering = $("only-differing");
  onlyDiffering.checked = !settings.allFields;
  onlyDiffering.addEventListener("change", () => {
    settings.allFields = !onlyDiffering.checked;
    saveSettings();
    renderConfig();
  });

  $("prompt-filter").addEventListener("input", debounce(loadPrompts, 300));
  const step = $("sample-step");
  step.value = settings.step;
  step.addEventListener("change", () => {
    settings.step = /^\d+$/.test(step.value) ? step.value : "";
    saveSettings();
    loadSamples();
  });
}

// While any compared run is still going, its curves and summary are re-read every 10 s (the run page
// streams; here one request serves all runs). Not while a control has focus, so a redraw never
// steals a select or input from the user; the charts keep their zoom (uirevision).
const LIVE_REFRESH_MS = 10_000;

function refreshWhileLive() {
  setInterval(() => {
    if (document.hidden || !compared || !compared.runs.some((run) => !TERMINAL_STATES.has(run.state))) return;
    if (document.activeElement?.closest("#compare-app input, #compare-app select, #compare-app textarea")) return;
    loadCompare();
  }, LIVE_REFRESH_MS);
}

function main() {
  settings = readSettings(window.location.search);
  colors = assignColors(settings.runs);
  wire();
  renderChips();
  loadCompare();
  loadPrompts();
  refreshWhileLive();
}

// Importing the module elsewhere (to check the functions above) starts nothing.
if (typeof document !== "undefined" && document.getElementById("compare-app")) main();
