// The run page: curves that grow as the engine's events arrive (SSE, traces extended in place),
// RL diagnostics, the rollout browser, checkpoints, logs and the run's actions.
import { api, el, formatNumber, pageData, TERMINAL_STATES } from "./api.js";
import { openRunStream } from "./browser_stream_client.js";
import { GROUPS, HEADLINE_METRICS, metricInfo, PANELS } from "./metric_catalogue.js";
import { tokenViewSection } from "./token_view.js";
import { trajectoryList } from "./trajectory.js";

const run = pageData("run-data");
const SAMPLES_PAGE = 25;

// --- charts ---------------------------------------------------------------------------------

// Panels and which metric goes on which come from the metric catalogue; a metric it puts on no panel
// is drawn only on demand ("Add a chart"), in a panel of its own.
const panels = new Map(PANELS.map((p) => [p.id, { id: p.id, title: p.title, bars: p.stacked_bars, group: p.group }]));
const extraPanels = new Map(); // metric name -> its own panel
const panelOrder = new Map(PANELS.map((p, i) => [p.id, i])); // panel id -> its place in the catalogue

const charts = new Map(); // panel id -> {panel, div, traces: [metric names], lastStep: Map(name -> step)}
const markerSteps = []; // steps highlighted by an alert link

function panelFor(name) {
  const info = metricInfo(name);
  return (info && info.panel ? panels.get(info.panel) : extraPanels.get(name)) || null;
}

// A bar is one part of the panel's total: named by what follows the family ("timing/train" -> "train").
function traceLabel(panel, name) {
  if (panel.bars) return name.slice(name.indexOf("/") + 1);
  return name;
}

function chartLayout(panel) {
  return {
    title: { text: panel.title, font: { size: 14 } },
    margin: { l: 50, r: 15, t: 40, b: 60 },
    height: 300,
    xaxis: { title: { text: "step" } },
    legend: { orientation: "h", y: -0.3 },
    barmode: panel.bars ? "stack" : undefined,
    hovermode: "x unified",
    shapes: markerShapes(),
    uirevision: panel.id, // keep the user's zoom when traces grow
  };
}

function markerShapes() {
  return markerSteps.map((step) => ({
    type: "line", xref: "x", yref: "paper", x0: step, x1: step, y0: 0, y1: 1,
    line: { color: "#b3261e", width: 1.5, dash: "dot" },
  }));
}

// A group's charts share their row (app.css), so one grows or shrinks when a chart joins or leaves its row, not
// only when the window does (all that plotly's `responsive` follows): redraw each at its new width.
const groupChartSizes = new ResizeObserver((entries) => {
  for (const entry of entries) {
    if (entry.target.offsetParent !== null) Plotly.Plots.resize(entry.target);
  }
});

function ensureChart(panel) {
  let chart = charts.get(panel.id);
  if (chart) return chart;
  const div = el("div", { class: "chart", id: `chart-${panel.id.replace(/[^\w-]/g, "_")}`, "data-panel": panel.id });
  if (panel.group) {
    // In the catalogue's order, whichever metric arrives first.
    const block = ensureGroup(panel.group);
    const after = [...block.children].find((c) => (panelOrder.get(c.dataset.panel) ?? 0) > (panelOrder.get(panel.id) ?? 0));
    block.insertBefore(div, after || null);
  } else {
    document.getElementById("charts").append(div);
  }
  chart = { panel, div, traces: [], lastStep: new Map() };
  charts.set(panel.id, chart);
  Plotly.newPlot(div, [], chartLayout(panel), { responsive: true, displaylogo: false });
  if (panel.group) groupChartSizes.observe(div);
  return chart;
}

// The panels of one catalogue group (the stability view) side by side under the group's title, in a
// block of their own at the top of the charts.
function ensureGroup(group) {
  const id = `panel-group-${group}`;
  let block = document.getElementById(id);
  if (block) return block.querySelector(".panel-group-charts");
  block = el(
    "section",
    { class: "panel-group", id, "data-group": group },
    el("h3", {}, GROUPS[group] || group),
    el("div", { class: "panel-group-charts" }),
  );
  document.getElementById("charts").before(block);
  return block.querySelector(".panel-group-charts");
}

function newTrace(panel, name, xs, ys) {
  const label = traceLabel(panel, name);
  if (panel.bars) return { type: "bar", name: label, x: xs, y: ys, hovertemplate: `${label}: %{y:.3g} s<extra></extra>` };
  return { type: "scatter", mode: "lines", name: label, x: xs, y: ys, connectgaps: false };
}

// Adds the metric's trace (with its initial points) to its panel; returns [chart, index] or null.
function ensureTrace(name, xs = [], ys = []) {
  const panel = panelFor(name);
  if (!panel) return null;
  const chart = ensureChart(panel);
  let index = chart.traces.indexOf(name);
  if (index === -1) {
    chart.traces.push(name);
    index = chart.traces.length - 1;
    Plotly.addTraces(chart.div, newTrace(panel, name, xs, ys));
    chart.lastStep.set(name, xs.length ? xs[xs.length - 1] : -Infinity);
  }
  return [chart, index];
}

function addExtraPanel(name) {
  if (panelFor(name)) return;
  extraPanels.set(name, { id: `extra:${name}`, title: name });
}

async function loadSeries() {
  const names = new Set([...HEADLINE_METRICS, ...Object.keys(run.summary || {})]);
  const wanted = [...names].filter((n) => panelFor(n));
  // Empty panels for the headline metrics, so a fresh run shows where its curves will appear.
  for (const name of HEADLINE_METRICS) ensureTrace(name);
  if (!wanted.length) return;
  const data = await api(`/api/runs/${run.id}/series/`, { params: { names: wanted.join(","), max_points: 2000 } });
  for (const [name, series] of Object.entries(data.series)) {
    const pair = ensureTrace(name);
    if (!pair || !series.x.length) continue;
    const [chart, index] = pair;
    Plotly.extendTraces(chart.div, { x: [series.x], y: [series.y] }, [index]);
    chart.lastStep.set(name, series.x[series.x.length - 1]);
  }
}

// Live points are queued and drawn once per animation frame: one extendTraces per chart however many
// events arrived, and a point at or before a trace's last step is never drawn twice.
let pendingMetrics = [];
let flushScheduled = false;

function queueMetrics(message) {
  pendingMetrics.push(message);
  if (!flushScheduled) {
    flushScheduled = true;
    requestAnimationFrame(flushMetrics);
  }
}

function flushMetrics() {
  flushScheduled = false;
  const messages = pendingMetrics;
  pendingMetrics = [];
  const updates = new Map(); // chart -> Map(index -> {x, y})
  for (const message of messages) {
    for (const [name, value] of Object.entries(message.values)) {
      const pair = ensureTrace(name);
      if (!pair) continue;
      const [chart, index] = pair;
      if (message.step <= chart.lastStep.get(name)) continue;
      chart.lastStep.set(name, message.step);
      if (!updates.has(chart)) updates.set(chart, new Map());
      const points = updates.get(chart);
      if (!points.has(index)) points.set(index, { x: [], y: [] });
      points.get(index).x.push(message.step);
      points.get(index).y.push(typeof value === "number" ? value : null);
    }
    updateSummary(message);
  }
  for (const [chart, points] of updates) {
    const indices = [...points.keys()];
    Plotly.extendTraces(chart.div, { x: indices.map((i) => points.get(i).x), y: indices.map((i) => points.get(i).y) }, indices);
  }
  for (const message of messages) {
    window.dispatchEvent(new CustomEvent("posttrain:rendered", { detail: { seq: message.seq, step: message.step } }));
  }
  if (messages.length) scheduleAlerts();
}

function updateSummary(message) {
  run.last_step = Math.max(run.last_step ?? -1, message.step);
  document.getElementById("run-step").textContent = String(run.last_step);
  for (const name of Object.keys(message.values)) {
    if (!(name in run.summary)) {
      run.summary[name] = {};
      addMetricOption(name);
    }
  }
}

function addMetricOption(name) {
  const select = document.getElementById("extra-metric");
  if ([...select.options].some((o) => o.value === name)) return;
  select.append(el("option", { value: name }, name));
}

function setupExtraMetrics() {
  Object.keys(run.summary || {}).sort().forEach(addMetricOption);
  document.getElementById("extra-metric").addEventListener("change", async (event) => {
    const name = event.target.value;
    event.target.value = "";
    if (!name) return;
    addExtraPanel(name);
    const data = await api(`/api/runs/${run.id}/series/`, { params: { names: name, max_points: 2000 } });
    const series = data.series[name] || { x: [], y: [] };
    const pair = ensureTrace(name);
    if (pair && series.x.length && pair[0].lastStep.get(name) === -Infinity) {
      Plotly.extendTraces(pair[0].div, { x: [series.x], y: [series.y] }, [pair[1]]);
      pair[0].lastStep.set(name, series.x[series.x.length - 1]);
    }
    pair?.[0].div.scrollIntoView({ behavior: "smooth", block: "center" });
  });
}

function highlightStep(step) {
  markStep(step);
  samples.offset = 0;
  loadSamples();
}

// The step marked on every chart and chosen in the rollouts' filters.
function markStep(step) {
  markerSteps.splice(0, markerSteps.length, step);
  for (const chart of charts.values()) Plotly.relayout(chart.div, { shapes: markerShapes() });
  const form = document.getElementById("sample-filters");
  form.elements.step.value = step;
  form.elements.follow.checked = false;
}

// --- diagnostics ----------------------------------------------------------------------------

let alertsTimer = null;

function scheduleAlerts() {
  // Alerts are recomputed on the server from the stored series; at most every 5 s while points arrive.
  if (alertsTimer) return;
  alertsTimer = setTimeout(() => { alertsTimer = null; loadAlerts(); }, 5000);
}

async function loadAlerts() {
  const box = document.getElementById("alerts");
  let data;
  try {
    data = await api(`/api/runs/${run.id}/alerts/`);
  } catch (error) {
    box.replaceChildren(el("div", { class: "alert" }, `Diagnostics unavailable: ${error.message}`));
    return;
  }
  box.replaceChildren(...data.alerts.map((alert) => el("div", { class: `alert ${alert.severity}`, "data-code": alert.code },
    el("strong", {}, alert.severity === "critical" ? "Critical: " : "Warning: "),
    alert.message, " ",
    el("a", { href: `#step-${alert.step}`, onclick: (e) => { e.preventDefault(); highlightStep(alert.step); } }, `step ${alert.step}`),
    ...exampleLinks(alert),
  )));
}

// A hacking signal names the rollouts of its step that show it: each link opens one of them.
function exampleLinks(alert) {
  if (!alert.examples?.length) return [];
  const links = alert.examples.map((index) => el("a", {
    href: `#sample-${alert.step}-${index}`, class: "example-link", "data-example": `${alert.step}:${index}`,
    onclick: (e) => { e.preventDefault(); openExample(alert.step, index, alert.examples); },
  }, `#${index}`));
  return [" · examples: ", ...links.flatMap((link, i) => (i ? [", ", link] : [link]))];
}

function openExample(step, index, examples) {
  samples.examples = { step, indices: new Set(examples) };
  samples.open = `${step}:${index}`;
  markStep(step);
  // The step's samples come in index order, SAMPLES_PAGE a page: go to the page that holds this one.
  samples.offset = Math.floor(index / SAMPLES_PAGE) * SAMPLES_PAGE;
  loadSamples();
}

// --- rollouts -------------------------------------------------------------------------------

// `examples`: the rollouts an alert named, marked in the table; `open`: "step:index" to open once shown.
const samples = { offset: 0, count: 0, latestStep: run.last_step, examples: null, open: null };

function sampleFilters() {
  const form = document.getElementById("sample-filters");
  const follow = form.elements.follow.checked;
  let step = form.elements.step.value;
  if (follow) {
    step = samples.latestStep ?? "";
    form.elements.step.value = step;
  }
  return {
    step, min_reward: form.elements.min_reward.value, max_reward: form.elements.max_reward.value,
    min_advantage: form.elements.min_advantage.value, max_advantage: form.elements.max_advantage.value,
    min_length: form.elements.min_length.value, max_length: form.elements.max_length.value,
    finish_reason: form.elements.finish_reason.value, q: form.elements.q.value.trim(),
    group: form.elements.group.value, prompt: form.elements.prompt.value,
  };
}

// A GRPO group together: the step's rollouts of one prompt, side by side (a group number in the table).
function showGroup(sample) {
  const form = document.getElementById("sample-filters");
  form.elements.follow.checked = false;
  form.elements.step.value = sample.step;
  form.elements.group.value = sample.group;
  samples.offset = 0;
  loadSamples();
}

// The same prompt across every step (a sample's dialog): how the policy's answers to it moved.
function showPromptAcrossSteps(sample) {
  const form = document.getElementById("sample-filters");
  form.elements.follow.checked = false;
  form.elements.step.value = "";
  form.elements.group.value = "";
  form.elements.prompt.value = sample.prompt;
  document.getElementById("prompt-filter-text").textContent = excerpt(sample.prompt, 120);
  document.getElementById("prompt-filter").hidden = false;
  document.getElementById("sample-dialog").close();
  samples.offset = 0;
  loadSamples();
}

function clearPromptFilter() {
  document.getElementById("sample-filters").elements.prompt.value = "";
  document.getElementById("prompt-filter").hidden = true;
  samples.offset = 0;
  loadSamples();
}

function excerpt(text, length = 90) {
  const flat = (text || "").replace(/\s+/g, " ").trim();
  return flat.length > length ? `${flat.slice(0, length)}…` : flat;
}

// One samples request at a time: a change while one is in flight (a new step, a filter) asks for one
// more read when it returns. Under a fast stream every answer is still drawn, none is dropped as stale.
let samplesInFlight = false;
let samplesAgain = false;

async function loadSamples() {
  if (samplesInFlight) {
    samplesAgain = true;
    return;
  }
  samplesInFlight = true;
  try {
    await readSamplesPage();
  } finally {
    samplesInFlight = false;
    if (samplesAgain) {
      samplesAgain = false;
      loadSamples();
    }
  }
}

async function readSamplesPage() {
  const params = { ...sampleFilters(), limit: SAMPLES_PAGE, offset: samples.offset };
  const notice = document.getElementById("samples-notice");
  let page;
  try {
    page = await api(`/api/runs/${run.id}/samples/`, { params });
  } catch (error) {
    notice.textContent = error.message;
    return;
  }
  // A step whose rollout file never arrived is named, never a silent hole in the table.
  notice.textContent = (page.gaps || []).length
    ? `Rollouts missing: ${page.gaps.slice(0, 5).map((g) => `step ${g.step} (${g.reason})`).join("; ")}` +
      (page.gaps.length > 5 ? ` and ${page.gaps.length - 5} more steps.` : ".")
    : "";
  samples.count = page.count;
  const body = document.querySelector("#samples-table tbody");
  const example = (s) => samples.examples?.step === s.step && samples.examples.indices.has(s.index);
  body.replaceChildren(...page.results.map((s) => el("tr", { class: example(s) ? "clickable example" : "clickable", "data-sample": `${s.step}:${s.index}`, onclick: () => openSample(s) },
    el("td", { class: "num" }, s.step), el("td", { class: "num" }, s.index),
    el("td", { class: "num" }, el("a", { href: "#", class: "group-link", title: "this prompt's group of the step, together", onclick: (event) => { event.preventDefault(); event.stopPropagation(); showGroup(s); } }, s.group)),
    el("td", { class: "num" }, formatNumber(s.reward)), el("td", { class: "num" }, formatNumber(s.advantage)),
    el("td", { class: "num" }, s.length),
    el("td", {}, s.finish_reason, turnsTag(s)),
    el("td", {}, excerpt(s.prompt)), el("td", {}, excerpt(s.response)),
  )));
  if (!page.results.length) body.append(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No samples match.")));
  // A text search is not counted (it would read every response): "1–50" and a next page while there is one.
  const end = samples.offset + page.results.length;
  const total = page.count === null || page.count === undefined ? "" : ` of ${page.count}`;
  document.getElementById("samples-range").textContent = page.results.length ? `${samples.offset + 1}–${end}${total}` : "";
  document.getElementById("samples-prev").disabled = samples.offset === 0;
  document.getElementById("samples-next").disabled = !page.next;
  const wanted = samples.open && page.results.find((s) => `${s.step}:${s.index}` === samples.open);
  samples.open = null;
  if (wanted) openSample(wanted);
}

function onSamples(message) {
  samples.latestStep = Math.max(samples.latestStep ?? -1, message.step);
  const form = document.getElementById("sample-filters");
  if (form.elements.follow.checked) {
    samples.offset = 0;
    loadSamples();
  } else {
    document.getElementById("samples-notice").textContent =
      `${message.count} new samples at step ${message.step} (tick "follow latest step" to see them).`;
  }
}

// Text as the engine stored it; on demand, whitespace and special tokens are made visible.
const SPECIAL_TOKEN = /(<\|[^|<>]{1,40}\|>|<\/?s>|<pad>|<unk>|\[(?:CLS|SEP|PAD|MASK|UNK)\])/g;

function visibleText(text, showSpecial) {
  const out = el("pre", { class: "code sample-text" });
  if (!showSpecial) {
    out.textContent = text ?? "";
    return out;
  }
  for (const part of (text ?? "").split(SPECIAL_TOKEN)) {
    if (!part) continue;
    if (SPECIAL_TOKEN.test(part)) {
      SPECIAL_TOKEN.lastIndex = 0;
      out.append(el("span", { class: "special", title: "special token" }, part));
      continue;
    }
    const shown = part
      .replace(/ /g, "·")
      .replace(/\t/g, "→\t")
      .replace(/\r/g, "␍")
      .replace(/\n/g, "↵\n")
      .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
    out.append(shown);
  }
  return out;
}

let openedSample = null;

function renderSample() {
  const s = openedSample;
  const showSpecial = document.getElementById("show-special").checked;
  document.getElementById("sample-title").textContent = `Step ${s.step} · sample ${s.index} (group ${s.group})`;
  const components = Object.entries(s.components || {});
  // One wrapper: `el` drops the nulls and flattens the optional sections (replaceChildren would print them).
  document.getElementById("sample-body").replaceChildren(el("div", {},
    el("div", { class: "row sample-facts" },
      el("span", {}, "reward ", el("strong", {}, formatNumber(s.reward))),
      el("span", {}, "advantage ", el("strong", {}, formatNumber(s.advantage))),
      el("span", {}, `length ${s.length}`), el("span", {}, `finish ${s.finish_reason}`),
      s.kept ? null : el("span", { class: "tag" }, "left out of the update"),
      el("button", { type: "button", class: "secondary small", id: "same-prompt", onclick: () => showPromptAcrossSteps(s) }, "This prompt across steps"),
    ),
    components.length ? el("table", { class: "data compact" },
      el("tbody", {}, components.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "num" }, formatNumber(v)))))) : null,
    el("h3", {}, "Prompt"), visibleText(s.prompt, showSpecial), cutNote(s, "prompt", (s.prompt || "").length, "characters"),
    (s.turns || []).length ? [...trajectory(s, showSpecial), cutNote(s, "turns", s.turns.length, "turns")]
      : [el("h3", {}, "Response"), visibleText(s.response, showSpecial), cutNote(s, "response", (s.response || "").length, "characters")],
    s.label !== null && s.label !== undefined ? [el("h3", {}, "Label"), visibleText(s.label, showSpecial), cutNote(s, "label", s.label.length, "characters")] : null,
    (s.errors || []).length ? [el("h3", {}, "Reward errors"), el("pre", { class: "code error" }, s.errors.join("\n")), cutNote(s, "errors", s.errors.length, "errors")] : null,
  ));
}

// The server cuts long texts and lists (`truncated`: the full length of each it cut): say what is shown.
function cutNote(sample, name, shown, unit) {
  const full = (sample.truncated || {})[name];
  return full ? el("p", { class: "muted cut-note" }, `Showing the first ${shown} of ${full} ${unit}.`) : null;
}

function assistantTurns(sample) {
  return (sample.turns || []).filter((t) => t.role === "assistant").length;
}

// The rollout table's mark of a multi-turn sample: its number of model turns.
function turnsTag(sample) {
  const n = assistantTurns(sample);
  return n ? el("span", { class: "tag turns-tag", title: "model turns of a multi-turn episode" }, `${n} turns`) : null;
}

// A multi-turn sample turn by turn (trajectory.js), then the environment's logs.
function trajectory(sample, showSpecial) {
  const env = Object.entries(sample.env || {});
  return [
    el("h3", {}, `Trajectory (${assistantTurns(sample)} model turns)`),
    trajectoryList(sample.turns, (text) => visibleText(text, showSpecial)),
    env.length ? el("h3", {}, "Environment logs") : null,
    env.length ? el("table", { class: "data compact env-logs" },
      el("tbody", {}, env.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "num" }, formatNumber(v)))))) : null,
  ];
}

function openSample(sample) {
  openedSample = sample;
  renderSample();
  tokenViewSection(document.getElementById("sample-tokens"), run.id, sample.step, sample.index);
  document.getElementById("sample-dialog").showModal();
}

function setupSamples() {
  const form = document.getElementById("sample-filters");
  form.addEventListener("submit", (event) => { event.preventDefault(); samples.offset = 0; loadSamples(); });
  form.elements.step.addEventListener("input", () => { form.elements.follow.checked = false; });
  form.elements.follow.addEventListener("change", () => { samples.offset = 0; loadSamples(); });
  document.getElementById("samples-prev").addEventListener("click", () => { samples.offset = Math.max(0, samples.offset - SAMPLES_PAGE); loadSamples(); });
  document.getElementById("samples-next").addEventListener("click", () => { samples.offset += SAMPLES_PAGE; loadSamples(); });
  document.getElementById("show-special").addEventListener("change", renderSample);
  document.getElementById("sample-close").addEventListener("click", () => document.getElementById("sample-dialog").close());
  document.getElementById("prompt-filter-clear").addEventListener("click", clearPromptFilter);
}

// --- checkpoints, logs, history, actions ----------------------------------------------------

async function loadCheckpoints() {
  const checkpoints = await api(`/api/runs/${run.id}/checkpoints/`);
  const body = document.querySelector("#checkpoints-table tbody");
  body.replaceChildren(...checkpoints.map((c) => el("tr", { "data-step": c.step, class: c.available ? null : "muted" },
    el("td", { class: "num" }, c.step), el("td", { class: "path" }, c.path),
    el("td", { class: "row" }, c.available
      ? [el("button", { type: "button", class: "secondary small", onclick: () => registerCheckpoint(c) }, "Register as model"),
        el("button", { type: "button", class: "secondary small", onclick: () => resumeFrom(c) }, "Resume from here")]
      : "pruned (checkpoint.keep_last)"),
  )));
  if (!checkpoints.length) body.append(el("tr", {}, el("td", { colspan: 3, class: "muted" }, "No checkpoints yet.")));
}

// --- the prompt ledger ----------------------------------------------------------------------

function reasons(counts) {
  const parts = Object.entries(counts).map(([reason, n]) => `${reason} ${n}`);
  return parts.length ? parts.join(", ") : "0";
}

async function loadLedger() {
  if (run.config?.logging?.run_dir === undefined) return; // an external run keeps none
  const message = document.getElementById("ledger-message");
  let ledger;
  try {
    ledger = await api(`/api/runs/${run.id}/ledger/`);
  } catch (error) {
    message.textContent = error.status === 404 ? "No ledger yet: the engine writes it after its first step." : error.message;
    return;
  }
  message.textContent = "";
  document.querySelector("#ledger-table tbody").replaceChildren(...ledger.epochs.map((e) => el("tr", { "data-epoch": e.epoch },
    el("td", { class: "num" }, e.epoch), el("td", { class: "num" }, e.rows), el("td", { class: "num" }, e.trained),
    el("td", {}, reasons(e.filtered)), el("td", {}, reasons(e.dropped)), el("td", { class: "num" }, e.in_flight),
    el("td", { class: "num" }, e.not_drawn),
    el("td", { class: e.skipped ? "num error" : "num" }, e.skipped), el("td", { class: e.duplicates ? "num error" : "num" }, e.duplicates))));
  const resumes = document.getElementById("ledger-resumes");
  resumes.hidden = !ledger.resumes.length;
  resumes.querySelector("tbody").replaceChildren(...ledger.resumes.map((r) => el("tr", {},
    el("td", { class: "num" }, r.checkpoint_step), el("td", { class: "num" }, r.restored_in_flight),
    el("td", { class: r.lost_in_flight ? "num error" : "num" }, r.lost_in_flight),
    el("td", {}, r.redone_steps.length ? `${r.redone_steps[0]}–${r.redone_steps[r.redone_steps.length - 1]}` : "none"),
    el("td", { class: "num" }, r.redone_rows), el("td", { class: "num" }, `${r.seconds.toFixed(1)} s`))));
}

async function registerCheckpoint(checkpoint) {
  const name = window.prompt("Name of the new model", `${run.name}-step-${checkpoint.step}`.slice(0, 200));
  if (name === null) return;
  const message = document.getElementById("checkpoint-message");
  try {
    const model = await api(`/api/runs/${run.id}/register-checkpoint/`, { method: "POST", body: { checkpoint: checkpoint.id, name } });
    message.replaceChildren("Registered as model ", el("a", { href: "/registry/" }, model.name), ".");
  } catch (error) {
    message.replaceChildren(el("span", { class: "error" }, error.message));
  }
}

async function resumeFrom(checkpoint) {
  try {
    const next = await api(`/api/runs/${run.id}/resume/`, { method: "POST", body: { checkpoint: checkpoint.id } });
    window.location.assign(`/runs/${next.id}/`);
  } catch (error) {
    document.getElementById("checkpoint-message").replaceChildren(el("span", { class: "error" }, error.message));
  }
}

const engineLog = document.getElementById("engine-log");

function appendLog(entry) {
  const step = entry.step === null || entry.step === undefined ? "" : `[step ${entry.step}] `;
  engineLog.append(`${new Date(entry.time * 1000).toISOString().slice(11, 19)} ${entry.level.toUpperCase()} ${step}${entry.message}\n`);
  const nearBottom = engineLog.scrollHeight - engineLog.scrollTop - engineLog.clientHeight < 60;
  if (nearBottom) engineLog.scrollTop = engineLog.scrollHeight;
}

async function showJobOutput() {
  const box = document.getElementById("job-log");
  box.hidden = false;
  box.textContent = "Reading the Ray job's output…";
  try {
    const data = await api(`/api/runs/${run.id}/logs/`, { params: { tail: 100000 } });
    box.textContent = data.job ? (data.truncated ? "… (earlier output cut)\n" : "") + data.logs : "Ray has no job for this run (yet).";
    box.scrollTop = box.scrollHeight;
  } catch (error) {
    box.textContent = error.message;
  }
}

async function loadTransitions() {
  const transitions = await api(`/api/runs/${run.id}/transitions/`);
  document.querySelector("#transitions-table tbody").replaceChildren(...transitions.map((t) => el("tr", {},
    el("td", {}, new Date(t.at).toLocaleString()), el("td", {}, t.from_state), el("td", {}, t.to_state), el("td", {}, t.reason))));
}

function showState(state, reason) {
  run.state = state;
  const badge = document.getElementById("run-state");
  badge.className = `badge state-${state}`;
  badge.dataset.state = state;
  badge.textContent = state;
  if (reason !== undefined) document.getElementById("run-reason").textContent = reason || "";
  document.getElementById("cancel-run").hidden = TERMINAL_STATES.has(state) || state === "cancelling";
}

async function cancelRun() {
  const button = document.getElementById("cancel-run");
  button.disabled = true;
  try {
    const updated = await api(`/api/runs/${run.id}/cancel/`, { method: "POST" });
    showState(updated.state, updated.state_reason);
  } catch (error) {
    document.getElementById("action-error").textContent = error.message;
  } finally {
    button.disabled = false;
  }
}

function showConnection(status) {
  const labels = { live: "● live", reconnecting: "○ reconnecting…", closed: "" };
  const node = document.getElementById("stream-status");
  node.textContent = labels[status] ?? status;
  node.dataset.status = status;
}

// --- start ----------------------------------------------------------------------------------

async function main() {
  showState(run.state);
  document.getElementById("resolved-config").textContent = JSON.stringify(run.config, null, 2);
  document.getElementById("cancel-run").addEventListener("click", cancelRun);
  document.getElementById("job-output").addEventListener("click", showJobOutput);
  (run.logs || []).forEach(appendLog);
  setupSamples();
  setupExtraMetrics();
  await loadSeries();
  await Promise.all([loadSamples(), loadCheckpoints(), loadTransitions(), loadAlerts(), loadLedger()]);
  openRunStream(run.id, {
    lastEventId: run.stream_from_seq,
    onMetrics: queueMetrics,
    onSamples,
    onLog: appendLog,
    onCheckpoint: () => { loadCheckpoints(); loadLedger(); },
    onState: (message) => { showState(message.state, message.reason); loadTransitions(); loadLedger(); },
    onEnd: () => { loadAlerts(); },
    onConnection: showConnection,
  });
  document.body.dataset.ready = "true"; // tests wait for this
}

main().catch((error) => {
  document.getElementById("action-error").textContent = `The page could not load: ${error.message}`;
  throw error;
});
