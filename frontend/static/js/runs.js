// The runs list: filters kept in the URL (a filtered view can be shared or reloaded), key metrics
// from each run's summary, state badges that refresh while runs are live, and a selection to compare.
import { $, api, debounce, el, formatDuration, formatNumber, stateBadge, TERMINAL_STATES } from "./api.js";

const STATES = [
  "queued", "starting", "running", "cancelling", "preempting", "preempted", "succeeded", "failed", "cancelled", "draft",
];
const PAGE_SIZE = 25;
const REFRESH_MS = 3000;
const TYPING_DELAY_MS = 300;

let filters = readFilters();
const selected = new Set(); // run ids, kept across pages and filters (compare runs from anywhere)
let shown = { count: 0, results: [] };
let loadGeneration = 0; // answers of superseded requests are dropped
let refreshTimer = null;

// --- filters <-> URL ------------------------------------------------------------------------

function readFilters() {
  const q = new URLSearchParams(window.location.search);
  const offset = Number.parseInt(q.get("offset") || "0", 10);
  return {
    state: q.getAll("state").filter((s) => STATES.includes(s)),
    search: q.get("search") || "",
    tag: q.get("tag") || "",
    experiment: q.get("experiment") || "",
    ordering: q.get("ordering") || "-created_at",
    offset: Number.isFinite(offset) && offset > 0 ? offset : 0,
  };
}

function writeUrl() {
  const q = new URLSearchParams();
  filters.state.forEach((s) => q.append("state", s));
  for (const key of ["search", "tag", "experiment"]) if (filters[key]) q.set(key, filters[key]);
  if (filters.ordering !== "-created_at") q.set("ordering", filters.ordering);
  if (filters.offset) q.set("offset", String(filters.offset));
  const query = q.toString();
  window.history.replaceState(null, "", query ? `?${query}` : window.location.pathname);
}

function hasFilters() {
  return Boolean(filters.state.length || filters.search || filters.tag || filters.experiment);
}

function apiParams() {
  return {
    state: filters.state, search: filters.search.trim(), tag: filters.tag.trim(), experiment: filters.experiment,
    ordering: filters.ordering, limit: PAGE_SIZE, offset: filters.offset,
  };
}

function showFiltersInForm() {
  $("state-options").replaceChildren(...STATES.map((state) => el("label", { class: "state-option" },
    el("input", { type: "checkbox", name: "state", value: state, checked: filters.state.includes(state) }),
    stateBadge(state))));
  $("filter-search").value = filters.search;
  $("filter-tag").value = filters.tag;
  $("filter-experiment").value = filters.experiment;
  $("filter-ordering").value = filters.ordering;
}

function filtersChanged() {
  filters.offset = 0;
  writeUrl();
  load();
}

function wireFilters() {
  $("state-options").addEventListener("change", () => {
    filters.state = [...document.querySelectorAll("#state-options input:checked")].map((i) => i.value);
    filtersChanged();
  });
  const typed = debounce(filtersChanged, TYPING_DELAY_MS);
  $("filter-search").addEventListener("input", (e) => { filters.search = e.target.value; typed(); });
  $("filter-tag").addEventListener("input", (e) => { filters.tag = e.target.value; typed(); });
  $("filter-experiment").addEventListener("change", (e) => { filters.experiment = e.target.value; filtersChanged(); });
  $("filter-ordering").addEventListener("change", (e) => { filters.ordering = e.target.value; filtersChanged(); });
  $("run-filters").addEventListener("submit", (e) => { e.preventDefault(); filtersChanged(); });
  $("clear-filters").addEventListener("click", clearFilters);
  $("page-prev").addEventListener("click", () => goToOffset(Math.max(0, filters.offset - PAGE_SIZE)));
  $("page-next").addEventListener("click", () => goToOffset(filters.offset + PAGE_SIZE));
  $("compare-selected").addEventListener("click", () => {
    // Commas left unescaped: the compare page's URL stays readable and shareable.
    window.location.href = `/compare/?runs=${[...selected].join(",")}`;
  });
}

function clearFilters() {
  filters = { state: [], search: "", tag: "", experiment: "", ordering: filters.ordering, offset: 0 };
  showFiltersInForm();
  writeUrl();
  load();
}

function goToOffset(offset) {
  filters.offset = offset;
  writeUrl();
  load();
}

async function loadExperiments() {
  const select = $("filter-experiment");
  try {
    const page = await api("/api/experiments/", { params: { limit: 500, ordering: "name" } });
    select.append(...page.results.map((x) => el("option", { value: x.id }, x.name)));
  } catch {
    // The filter still works from the URL; the names are a convenience.
  }
  if (filters.experiment && ![...select.options].some((o) => o.value === filters.experiment)) {
    select.append(el("option", { value: filters.experiment }, `experiment #${filters.experiment}`));
  }
  select.value = filters.experiment;
}

// --- cells ----------------------------------------------------------------------------------

// The eval metric worth a column: the eval reward if logged, else an accuracy or reward one
// (all higher-is-better, so "best" is the max).
function evalMetricName(summary) {
  const names = Object.keys(summary || {});
  if (names.includes("eval/reward/mean")) return "eval/reward/mean";
  return names.filter((n) => n.startsWith("eval/") && /reward|acc/.test(n)).sort()[0] || null;
}

function metricCell(entry, which, title) {
  return el("td", { class: "num metric", title }, formatNumber(entry ? entry[which] : null));
}

function evalCell(summary) {
  const name = evalMetricName(summary);
  const entry = name ? summary[name] : null;
  if (!entry) return el("td", { class: "num metric" }, "—");
  return el("td", { class: "num metric", title: `${name}: last, best (max)` },
    formatNumber(entry.last), el("small", {}, `best ${formatNumber(entry.max)}`));
}

function durationSeconds(run) {
  if (!run.started_at) return null;
  const end = run.finished_at ? Date.parse(run.finished_at) : Date.now();
  return Math.max(0, (end - Date.parse(run.started_at)) / 1000);
}

function tagLink(tag) {
  const href = `?${new URLSearchParams({ tag })}`;
  return el("a", {
    class: "tag", href, title: "Show runs with this tag",
    onclick: (e) => { e.preventDefault(); filters.tag = tag; $("filter-tag").value = tag; filtersChanged(); },
  }, tag);
}

function runRow(run) {
  const id = String(run.id);
  const reward = (run.summary || {})["reward/mean"];
  const row = el("tr", { "data-run-id": id, class: selected.has(id) ? "selected" : null },
    el("td", {}, el("input", {
      type: "checkbox", class: "select-run", checked: selected.has(id), "aria-label": `Select ${run.name || id}`,
      onchange: (e) => toggleSelected(id, e.target.checked),
    })),
    el("td", {}, el("a", { href: `/runs/${id}/`, class: "run-name" }, run.name || id.slice(0, 8)),
      el("div", { class: "muted small" }, run.experiment_name)),
    el("td", { class: "state-cell" }, stateBadge(run.state),
      run.queue_position ? el("span", { class: "muted small queue-position", title: run.queue_reason }, ` #${run.queue_position}`) : ""),
    el("td", {}, run.kind === "external"
      ? el("span", { class: "badge engine", title: "External run, tracked through the SDK" }, run.engine)
      : run.algorithm || "—"),
    el("td", {}, run.model_name || "—"),
    el("td", {}, run.dataset_name || "—"),
    el("td", {}, (run.tags || []).map(tagLink)),
    metricCell(reward, "last", "reward/mean at the last step"),
    metricCell(reward, "max", "best reward/mean (max over the run)"),
    evalCell(run.summary),
    el("td", { class: "num" }, run.last_step ?? "—"),
    el("td", { class: "nowrap", title: run.created_at }, new Date(run.created_at).toLocaleString()),
    el("td", { class: "num duration" }, formatDuration(durationSeconds(run))),
  );
  row.dataset.signature = JSON.stringify(run);
  return row;
}

function runsTable(runs) {
  const pageIds = runs.map((r) => String(r.id));
  const allChecked = pageIds.length > 0 && pageIds.every((id) => selected.has(id));
  const head = el("tr", {},
    el("th", {}, el("input", {
      type: "checkbox", id: "select-page", checked: allChecked, "aria-label": "Select every run on this page",
      onchange: (e) => { pageIds.forEach((id) => toggleSelected(id, e.target.checked)); render(); },
    })),
    ...["Run", "State", "Algorithm", "Model", "Dataset", "Tags"].map((t) => el("th", {}, t)),
    el("th", { class: "num" }, "Reward (last)"),
    el("th", { class: "num" }, "Reward (best)"),
    el("th", { class: "num", title: "eval/reward/mean (else an eval accuracy or reward metric): last, and best" }, "Eval"),
    el("th", { class: "num" }, "Steps"),
    el("th", {}, "Created"),
    el("th", { class: "num" }, "Duration"),
  );
  return el("div", { class: "runs-scroll" },
    el("table", { class: "data runs", id: "runs-table" }, el("thead", {}, head), el("tbody", {}, runs.map(runRow))));
}

function emptyState() {
  if (hasFilters()) {
    return el("div", { class: "card runs-empty" }, "No runs match these filters. ",
      el("a", { href: "#", onclick: (e) => { e.preventDefault(); clearFilters(); } }, "Clear the filters"), ".");
  }
  return el("div", { class: "card runs-empty" }, "No runs yet. ",
    el("a", { href: "/launch/" }, "Launch one"), " from an experiment, and it shows up here.");
}

// --- selection ------------------------------------------------------------------------------

function toggleSelected(id, on) {
  if (on) selected.add(id);
  else selected.delete(id);
  const row = document.querySelector(`tr[data-run-id="${CSS.escape(id)}"]`);
  if (row) {
    row.classList.toggle("selected", on);
    row.querySelector(".select-run").checked = on;
  }
  showSelection();
}

function showSelection() {
  $("compare-selected").disabled = selected.size < 2;
  $("compare-selected").textContent = selected.size ? `Compare selected (${selected.size})` : "Compare selected";
  $("selection-info").textContent = selected.size ? `${selected.size} selected` : "";
}

// --- loading and live refresh ---------------------------------------------------------------

function render() {
  const box = $("runs-table-box");
  box.replaceChildren(shown.results.length ? runsTable(shown.results) : emptyState());
  const pager = $("runs-pager");
  pager.hidden = shown.count === 0;
  const first = shown.results.length ? filters.offset + 1 : 0;
  $("page-info").textContent = `${first}–${filters.offset + shown.results.length} of ${shown.count}`;
  $("page-prev").disabled = filters.offset === 0;
  $("page-next").disabled = filters.offset + PAGE_SIZE >= shown.count;
  showSelection();
}

// Patches rows in place when the page still holds the same runs in the same order (keeps focus and
// avoids flicker); anything else (a run left the filter, a new one arrived) re-renders the table.
function update(page) {
  const tbody = document.querySelector("#runs-table tbody");
  const rows = tbody ? [...tbody.rows] : [];
  const sameRuns = rows.length === page.results.length && rows.every((row, i) => row.dataset.runId === String(page.results[i].id));
  const countChanged = page.count !== shown.count;
  shown = page;
  if (!sameRuns || countChanged) {
    render();
    return;
  }
  page.results.forEach((run, i) => {
    if (rows[i].dataset.signature !== JSON.stringify(run)) rows[i].replaceWith(runRow(run));
    else rows[i].querySelector(".duration").textContent = formatDuration(durationSeconds(run));
  });
}

function scheduleRefresh() {
  clearTimeout(refreshTimer);
  refreshTimer = null;
  if (shown.results.some((run) => !TERMINAL_STATES.has(run.state))) {
    refreshTimer = setTimeout(() => load({ refresh: true }), REFRESH_MS);
  }
}

async function load({ refresh = false } = {}) {
  const generation = ++loadGeneration;
  clearTimeout(refreshTimer);
  if (refresh && document.hidden) {
    scheduleRefresh(); // no requests from a background tab; visibilitychange catches up
    return;
  }
  try {
    const page = await api("/api/runs/", { params: apiParams() });
    if (generation !== loadGeneration) return;
    $("runs-error").hidden = true;
    if (!page.results.length && page.count && filters.offset) {
      goToOffset(Math.max(0, Math.floor((page.count - 1) / PAGE_SIZE) * PAGE_SIZE)); // past the last page
      return;
    }
    if (refresh) update(page);
    else {
      shown = page;
      render();
    }
  } catch (error) {
    if (generation !== loadGeneration) return;
    $("runs-error").hidden = false;
    $("runs-error").textContent = `Could not load runs: ${error.message}`;
  }
  scheduleRefresh();
}

document.addEventListener("visibilitychange", () => {
  if (!document.hidden && refreshTimer) load({ refresh: true });
});

showFiltersInForm();
wireFilters();
loadExperiments();
load();
