// The launch page: an experiment (model, dataset, rewards) plus a run config form generated from the
// engine's schema, validated by the server as you type (the same checks as creating it), a YAML
// pane to copy or edit, and Launch. `?from_run=<id>` and `?experiment=<id>` pre-fill everything.

import { $, api, ApiError, el } from "./api.js";
import { datasetLabel, listAll, modelLabel, rewardSummary } from "./assets.js";
import { clearFieldErrors, errorsOf, placeFieldErrors, showErrorSummary, showIn } from "./form_errors.js";
import { SchemaForm } from "./schema_form.js";

const VALIDATE_DELAY_MS = 400;
// Config keys the experiment card already covers (its name and description) or nobody chooses.
const NOT_IN_FORM = ["schema_version", "name", "description"];
const OPEN_SECTIONS = ["general", "algorithm", "rollout", "train"];
const EXPERIMENT_FIELDS = ["name", "description", "model", "dataset", "webhook_url", "tags", "note"];

const state = {
  platformFields: [],
  defaultSeed: 0,
  models: new Map(), // id -> registry model
  datasets: new Map(),
  rewards: new Map(),
  environments: new Map(), // ready registry environments by id
  chosen: [], // [{reward: id, weightInput, errorNode}] in the experiment's order
  form: null,
  source: null, // {experiment, body, what}: launching it unchanged starts a new run of that experiment
  timer: null,
  sequence: 0,
  lastYaml: "",
  yamlDirty: false,
};

function fieldBox(loc) {
  return document.querySelector(`.lf-field[data-loc="${loc}"]`);
}

// --- the experiment body -------------------------------------------------------------------

function parseWeight(text) {
  const trimmed = text.trim();
  return trimmed !== "" && Number.isFinite(Number(trimmed)) ? Number(trimmed) : trimmed;
}

function experimentBody() {
  return {
    name: $("exp-name").value,
    description: $("exp-description").value,
    model: $("exp-model").value ? Number($("exp-model").value) : null,
    dataset: $("exp-dataset").value ? Number($("exp-dataset").value) : null,
    rewards: state.chosen.map((item) => ({ reward: item.reward, weight: parseWeight(item.weightInput.value) })),
    config: state.form.values(),
    webhook_url: $("exp-webhook").value.trim(),
  };
}

function runBody(config) {
  const tags = $("run-tags").value.split(",").map((tag) => tag.trim()).filter(Boolean);
  // Explicit even when it is the default: the experiment launched may carry another seed.
  return { seed: config.seed ?? state.defaultSeed, tags, note: $("run-note").value };
}

// The seed is a launch parameter as much as a config value: a clone with a new seed is still the
// same experiment.
function withoutSeed(body) {
  const { seed, ...config } = body.config;
  return JSON.stringify({ ...body, config });
}

function isUnchangedSource(body) {
  return state.source !== null && withoutSeed(body) === withoutSeed(state.source.body);
}

function refreshLaunchLabel() {
  const unchanged = isUnchangedSource(experimentBody());
  $("launch-button").textContent = unchanged ? `Launch a new run of “${state.source.name}”` : "Create experiment and launch";
}

// --- rewards -------------------------------------------------------------------------------

function renderRewardChoices() {
  const taken = new Set(state.chosen.map((item) => item.reward));
  const select = $("reward-add");
  select.replaceChildren(
    el("option", { value: "" }, "Add a reward…"),
    ...[...state.rewards.values()]
      .filter((reward) => !taken.has(reward.id))
      .map((reward) => el("option", { value: reward.id }, `${reward.name} — ${rewardSummary(reward)}`)),
  );
  $("reward-table").hidden = state.chosen.length === 0;
}

function addReward(rewardId, weight = 1) {
  const reward = state.rewards.get(rewardId);
  const weightInput = el("input", { type: "text", inputmode: "decimal", class: "weight", value: String(weight),
    "aria-label": `Weight of ${reward ? reward.name : rewardId}`, oninput: changed });
  const errorNode = el("div", { class: "field-error", hidden: true });
  const probeCell = el("td", { class: "probe-cell" });
  const item = { reward: rewardId, weightInput, errorNode, probeCell, probe: null };
  item.row = el(
    "tr", { "data-reward": rewardId },
    el("td", {}, reward ? reward.name : `#${rewardId}`, errorNode),
    el("td", { class: "muted" }, reward ? rewardSummary(reward) : ""),
    el("td", { class: "num" }, weightInput),
    probeCell,
    el("td", {}, el("button", { type: "button", class: "secondary small", onclick: () => removeReward(item) }, "Remove")),
  );
  state.chosen.push(item);
  $("reward-rows").append(item.row);
  renderRewardChoices();
  loadProbe(item);
}

function removeReward(item) {
  state.chosen = state.chosen.filter((other) => other !== item);
  item.row.remove();
  renderRewardChoices();
  renderProbeWarnings();
  changed();
}

// --- reward probes -------------------------------------------------------------------------
// Each chosen reward's newest probe on the chosen dataset; a warning for every one a probe games (>= 50% of
// the honest answer's reward) before anything is launched.

const PROBE_POLL_MS = 1000;

function chosenDataset() {
  return $("exp-dataset").value ? Number($("exp-dataset").value) : null;
}

async function loadProbe(item) {
  const dataset = chosenDataset();
  item.probe = null;
  if (dataset === null) {
    renderProbe(item);
    return;
  }
  try {
    const probes = await api(`/api/rewards/${item.reward}/probes/`, { params: { dataset } });
    if (chosenDataset() !== dataset) return; // the dataset changed meanwhile: its own load answers
    item.probe = probes[0] || null;
  } catch (error) {
    item.probeCell.replaceChildren(el("span", { class: "muted" }, error.message));
    return;
  }
  renderProbe(item);
  await followProbe(item, dataset);
}

async function followProbe(item, dataset) {
  while (item.probe && ["queued", "running"].includes(item.probe.state) && chosenDataset() === dataset) {
    await new Promise((resolve) => setTimeout(resolve, PROBE_POLL_MS));
    item.probe = await api(item.probe.url);
    renderProbe(item);
  }
}

async function startProbe(item) {
  const dataset = chosenDataset();
  try {
    item.probe = await api(`/api/rewards/${item.reward}/probes/`, { method: "POST", body: { dataset } });
  } catch (error) {
    item.probeCell.replaceChildren(el("span", { class: "field-error" }, error.message));
    return;
  }
  renderProbe(item);
  await followProbe(item, dataset);
}

function worstProbe(probe) {
  const report = probe.result || {};
  return (report.probes || []).find((p) => p.probe === report.worst) || null;
}

function renderProbe(item) {
  const probe = item.probe;
  const button = el("button", { type: "button", class: "secondary small", onclick: () => startProbe(item) }, probe ? "Probe again" : "Probe");
  let text;
  if (chosenDataset() === null) text = el("span", { class: "muted" }, "choose a dataset");
  else if (!probe) text = el("span", { class: "muted" }, "not probed ");
  else if (probe.state === "failed") text = el("span", { class: "muted", title: probe.error }, "probe failed ");
  else if (probe.state !== "done") text = el("span", { class: "muted" }, `probe ${probe.state}… `);
  else {
    const worst = worstProbe(probe);
    const share = worst && worst.fraction !== null ? `${Math.round(100 * worst.fraction)}%` : "—";
    text = probe.result.hackable
      ? el("span", { class: "probe-summary hackable" }, `⚠ ${worst.probe} ${share} `)
      : el("span", { class: "probe-summary" }, `✓ worst ${worst ? worst.probe : "—"} ${share} `);
  }
  const running = probe && ["queued", "running"].includes(probe.state);
  item.probeCell.replaceChildren(text, chosenDataset() === null || running ? null : button);
  renderProbeWarnings();
}

function renderProbeWarnings() {
  const hacked = state.chosen.filter((item) => item.probe?.state === "done" && item.probe.result.hackable);
  $("probe-warnings").replaceChildren(...hacked.map((item) => {
    const reward = state.rewards.get(item.reward);
    const flagged = item.probe.result.probes.filter((p) => p.flagged)
      .map((p) => `${p.probe} (${Math.round(100 * p.fraction)}%)`).join(", ");
    return el("div", { class: "alert critical", "data-reward": item.reward },
      el("strong", {}, "Gameable reward: "),
      `${reward ? reward.name : `#${item.reward}`} pays answers that do not solve the task on ${item.probe.dataset_name}: `,
      `${flagged} of the honest answer's reward. A run will likely learn to game it; fix the reward or weigh it down.`);
  }));
}

function refreshProbes() {
  for (const item of state.chosen) loadProbe(item);
}

// --- errors --------------------------------------------------------------------------------

// Where an error goes: a reward row, an experiment field ("model" alone is the experiment's model,
// "model.dtype" a config field), else the config form's field or section.
function errorTarget(prefix, loc) {
  const reward = prefix.match(/^rewards(?:\[(\d+)\]|\.(\d+))$/);
  if (reward) {
    const item = state.chosen[Number(reward[1] ?? reward[2])];
    return item ? { node: item.errorNode } : null;
  }
  const experimentField = prefix === "rewards" || (prefix === "tags" && loc.startsWith("tags["))
    || (prefix === loc && EXPERIMENT_FIELDS.includes(prefix));
  if (experimentField) return { node: fieldBox(prefix).querySelector(":scope > .field-error") };
  return state.form.errorTarget(prefix);
}

// Each error goes next to what it names; whatever names nothing is listed in the summary.
function showErrors(errors) {
  clearFieldErrors(document.querySelector(".launch-main"));
  showErrorSummary($("error-summary"), placeFieldErrors(errors, errorTarget), {
    heading: "The config has problems the form has no field for:",
    note: "Fix them in the YAML pane and apply it.",
  });
  return errors.length;
}

// --- validation ----------------------------------------------------------------------------

// Experiment fields not filled in yet: while typing, "required" is no news, so their errors wait
// for the launch. (The config itself is checked once these are set.)
function blankExperimentFields() {
  const blank = [];
  if (!$("exp-name").value.trim()) blank.push("name");
  if (!$("exp-model").value) blank.push("model");
  if (!$("exp-dataset").value) blank.push("dataset");
  if (!state.chosen.length && !state.form.values().environment) blank.push("rewards");
  return blank;
}

function changed() {
  refreshLaunchLabel();
  clearTimeout(state.timer);
  state.timer = setTimeout(validate, VALIDATE_DELAY_MS);
}

function setStatus(text, kind = "") {
  const node = $("validation-status");
  node.textContent = text;
  node.className = kind || "muted";
}

function setYaml(text) {
  state.lastYaml = text;
  if (!state.yamlDirty) $("yaml-text").value = text;
}

// {"driver", "bundles", "total"} in Ray's names -> "2 CPUs, 1 GPU (driver 0 CPUs; 2 bundles)".
function resourceText(resources) {
  const amount = (value, key) => `${value} ${key}${value === 1 ? "" : "s"}`;
  const text = (r) => [amount(r.CPU || 0, "CPU"), ...(r.GPU ? [amount(r.GPU, "GPU")] : [])].join(", ");
  const bundles = resources.bundles.length;
  return `${text(resources.total)}${bundles ? ` (driver ${text(resources.driver)}; ${bundles} bundle${bundles === 1 ? "" : "s"} for the actors)` : ""}`;
}

async function validate() {
  const sequence = ++state.sequence;
  const body = experimentBody();
  setStatus("Checking…");
  try {
    const result = await api("/api/experiments/validate/", { method: "POST", body });
    if (sequence !== state.sequence) return; // a newer check is on its way
    showErrors([]);
    setYaml(result.yaml);
    $("full-config").textContent = JSON.stringify(result.config, null, 2);
    $("resource-needs").textContent = `Needs: ${resourceText(result.resources)}`;
    setStatus("✓ Valid: ready to launch", "valid");
  } catch (error) {
    if (sequence !== state.sequence) return;
    if (!(error instanceof ApiError) || error.status !== 400) {
      setStatus(`Could not check the config: ${error.message}`, "error");
      return;
    }
    const blank = blankExperimentFields();
    const count = showErrors(error.errors.filter((item) => !blank.includes(item.loc)));
    if (count) setStatus(`${count} problem${count === 1 ? "" : "s"} to fix`, "error");
    else setStatus(`Still to choose: ${blank.join(", ")} (the config is checked once they are set)`);
    $("full-config").textContent = "Valid configs only.";
    $("resource-needs").textContent = "Needs: valid configs only.";
    // Keep the YAML in step with the form even while it is invalid.
    try {
      const converted = await api("/api/config/yaml/", { method: "POST", body: { config: body.config } });
      if (sequence === state.sequence) setYaml(converted.yaml);
    } catch { /* the errors above already say what is wrong */ }
  }
}

// --- YAML pane -----------------------------------------------------------------------------

function withoutPlatformFields(config) {
  const out = structuredClone(config);
  const dropped = [];
  for (const dotted of state.platformFields) {
    const [section, key] = dotted.split(".");
    if (!key && section in out) {
      delete out[section];
      dropped.push(dotted);
    } else if (key && out[section] && typeof out[section] === "object" && key in out[section]) {
      delete out[section][key];
      dropped.push(dotted);
    }
  }
  return { config: out, dropped };
}

function setYamlDirty(dirty) {
  state.yamlDirty = dirty;
  $("yaml-discard").hidden = !dirty;
  if (dirty) $("yaml-status").textContent = "Edited: apply it to update the form.";
}

async function applyYaml() {
  const yamlError = $("yaml-error");
  yamlError.hidden = true;
  yamlError.textContent = "";
  try {
    const result = await api("/api/config/yaml/", { method: "POST", body: { yaml: $("yaml-text").value } });
    const { config, dropped } = withoutPlatformFields(result.config);
    state.form.setValues(config);
    setYamlDirty(false);
    const notes = ["Applied."];
    if (dropped.length) notes.push(`Ignored ${dropped.join(", ")}: the platform fills them in.`);
    const unknown = state.form.extraKeys().filter((key) => !NOT_IN_FORM.includes(key));
    if (unknown.length) notes.push(`Not in the form: ${unknown.join(", ")}.`);
    $("yaml-status").textContent = notes.join(" ");
    clearTimeout(state.timer);
    refreshLaunchLabel();
    await validate();
  } catch (error) {
    for (const item of errorsOf(error)) showIn(yamlError, item.msg);
    $("yaml-status").textContent = "";
  }
}

async function copyYaml() {
  const text = $("yaml-text").value;
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    $("yaml-text").select(); // the clipboard API needs a secure context; the old way still works
    document.execCommand("copy");
  }
  $("yaml-status").textContent = "Copied.";
}

// --- launch --------------------------------------------------------------------------------

async function launch() {
  clearTimeout(state.timer);
  state.sequence += 1; // answers of checks still on their way are stale now
  const button = $("launch-button");
  button.disabled = true;
  $("launch-failure").hidden = true;
  setStatus("Launching…");
  const body = experimentBody();
  try {
    let experimentId;
    if (isUnchangedSource(body)) experimentId = state.source.experiment;
    else {
      const experiment = await api("/api/experiments/", { method: "POST", body });
      experimentId = experiment.id;
      // Should the launch itself be refused, trying again launches this experiment, not a copy.
      state.source = { experiment: experiment.id, name: experiment.name, body };
    }
    const run = await api(`/api/experiments/${experimentId}/launch/`, { method: "POST", body: runBody(body.config) });
    setStatus("Launched: opening the run…", "valid");
    window.location.assign(`/runs/${run.id}/`);
  } catch (error) {
    button.disabled = false;
    refreshLaunchLabel();
    if (error instanceof ApiError && error.status === 400) {
      const count = showErrors(error.errors);
      setStatus(`Not launched: ${count} problem${count === 1 ? "" : "s"} to fix`, "error");
    } else {
      setStatus("Not launched", "error");
      $("launch-failure").textContent = `The launch failed: ${error.message}`;
      $("launch-failure").hidden = false;
    }
  }
}

// --- environments ----------------------------------------------------------------------------

// An installed environment from the registry fills in what a run takes from it: its generated dataset, and its
// own scoring as a reward (single-turn) or the engine's environment section (multi-turn: TextArena, OpenEnv).
function chooseEnvironment() {
  const environment = state.environments.get(Number($("exp-environment").value));
  $("environment-facts").textContent = environment
    ? `${environment.package} ${environment.env_id}${environment.version ? ` (v${environment.version})` : ""}: ` +
      (environment.run_environment ? "played turn by turn (config: environment)" : `scored by reward “${environment.reward_name}”`)
    : "";
  if (!environment) return;
  $("exp-dataset").value = String(environment.dataset);
  if (environment.reward && !state.chosen.some((item) => item.reward === environment.reward)) addReward(environment.reward);
  if (environment.run_environment) state.form.setValues({ ...state.form.values(), environment: environment.run_environment });
  showAssetFacts();
  changed();
}

// --- set-up --------------------------------------------------------------------------------

function fillSelect(select, rows, label) {
  select.append(...rows.map((row) => el("option", { value: row.id }, label(row))));
}

function showAssetFacts() {
  const model = state.models.get(Number($("exp-model").value));
  $("model-facts").textContent = model ? `model.path: ${model.path}` : "";
  const dataset = state.datasets.get(Number($("exp-dataset").value));
  $("dataset-facts").textContent = dataset
    ? `data.prompt_field: ${dataset.prompt_field}, data.label_field: ${dataset.label_field || "(none)"}, columns: ${(dataset.columns || []).join(", ")}`
    : "";
}

async function prefill(params) {
  let run = null;
  let experimentId = params.get("experiment");
  if (params.get("from_run")) {
    run = await api(`/api/runs/${encodeURIComponent(params.get("from_run"))}/`);
    experimentId = run.experiment;
  }
  if (!experimentId) return false;
  const experiment = await api(`/api/experiments/${encodeURIComponent(experimentId)}/`);
  $("exp-name").value = experiment.name;
  $("exp-description").value = experiment.description || "";
  $("exp-webhook").value = experiment.webhook_url || "";
  $("exp-model").value = String(experiment.model);
  $("exp-dataset").value = String(experiment.dataset);
  for (const link of experiment.rewards) addReward(link.reward, link.weight);
  const config = withoutPlatformFields(experiment.config || {}).config;
  if (run) {
    config.seed = run.seed;
    $("run-tags").value = (run.tags || []).join(", ");
  }
  state.form.setValues(config);
  state.source = { experiment: experiment.id, name: experiment.name, body: experimentBody() };
  const source = $("launch-source");
  source.replaceChildren(
    run ? `Pre-filled from run “${run.name}” of experiment “${experiment.name}”. ` : `Pre-filled from experiment “${experiment.name}”. `,
    "Launched unchanged (seed, tags and note aside), it becomes a new run of that experiment; any other change creates a new experiment.",
  );
  source.hidden = false;
  return true;
}

async function init() {
  const [schemaInfo, models, datasets, rewards, environments] = await Promise.all([
    api("/api/config/schema/"), listAll("/api/models/"), listAll("/api/datasets/"), listAll("/api/rewards/"),
    listAll("/api/environments/"),
  ]);
  const ready = environments.filter((environment) => environment.state === "ready");
  state.environments = new Map(ready.map((row) => [row.id, row]));
  state.platformFields = schemaInfo.platform_fields;
  state.defaultSeed = schemaInfo.schema.properties?.seed?.default ?? 0;
  state.models = new Map(models.map((row) => [row.id, row]));
  state.datasets = new Map(datasets.map((row) => [row.id, row]));
  state.rewards = new Map(rewards.map((row) => [row.id, row]));
  $("platform-fields").textContent = state.platformFields.join(", ");
  $("registry-hint").hidden = models.length > 0 && datasets.length > 0 && rewards.length > 0;

  state.form = new SchemaForm(schemaInfo.schema, {
    skip: [...state.platformFields, ...NOT_IN_FORM], open: OPEN_SECTIONS, onChange: changed,
  });
  $("config-form").replaceChildren(state.form.node);

  fillSelect($("exp-model"), models, modelLabel);
  fillSelect($("exp-dataset"), datasets, datasetLabel);
  fillSelect($("exp-environment"), ready, (environment) => `${environment.name} — ${environment.package} ${environment.env_id}`);
  $("exp-environment").addEventListener("change", chooseEnvironment);
  renderRewardChoices();

  for (const id of ["exp-name", "exp-description", "exp-webhook"]) $(id).addEventListener("input", changed);
  for (const id of ["exp-model", "exp-dataset"]) {
    $(id).addEventListener("change", () => { showAssetFacts(); changed(); });
  }
  $("exp-dataset").addEventListener("change", refreshProbes);
  $("reward-add").addEventListener("change", (event) => {
    if (!event.target.value) return;
    addReward(Number(event.target.value));
    changed();
  });
  $("yaml-text").addEventListener("input", () => setYamlDirty($("yaml-text").value !== state.lastYaml));
  $("yaml-discard").addEventListener("click", () => {
    setYamlDirty(false);
    $("yaml-text").value = state.lastYaml;
    $("yaml-status").textContent = "";
  });
  $("yaml-apply").addEventListener("click", applyYaml);
  $("yaml-copy").addEventListener("click", copyYaml);
  $("launch-button").addEventListener("click", launch);

  const params = new URLSearchParams(window.location.search);
  const prefilled = await prefill(params).catch((error) => {
    $("launch-failure").textContent = `Could not pre-fill the form: ${error.message}`;
    $("launch-failure").hidden = false;
    return false;
  });
  showAssetFacts();
  refreshLaunchLabel();
  if (prefilled) await validate();
  else {
    const converted = await api("/api/config/yaml/", { method: "POST", body: { config: state.form.values() } });
    setYaml(converted.yaml);
  }
  document.body.dataset.ready = "true"; // the page is wired up (tests wait for this)
}

init().catch((error) => {
  $("launch-failure").textContent = `The launch page could not load: ${error.message}`;
  $("launch-failure").hidden = false;
});
