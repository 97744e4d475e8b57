// The registry page: lists of models, datasets and rewards, with a form for each (dataset upload,
// GGUF import and model folder registration, reward creation with its spec fields generated from the
// engine's schema) and a preview of a dataset's first rows.

import { $, api, el, formatNumber } from "./api.js";
import { formatBytes, formatParameters, formatWhen, listAll, rewardSummary } from "./assets.js";
import { clearFieldErrors, errorsOf, placeFieldErrors, showErrorSummary } from "./form_errors.js";
import { followImport, ggufSource } from "./model_imports.js";
import { followProbe, probeReport } from "./reward_probes.js";
import { SchemaForm } from "./schema_form.js";

const BUILTIN_TYPES = ["exact_match", "boxed_math", "regex", "length_penalty", "reasoning_gym", "verifiers"];
// The registry sets these itself: the component name (from the reward's name) and the weight (per experiment).
const SPEC_NOT_IN_FORM = ["type", "name", "weight"];
const PREVIEW_CELL_CHARS = 300;

const state = { models: [], datasets: [], rewards: [], schema: null, specForm: null, fresh: new Set() };

// --- errors --------------------------------------------------------------------------------

// Each error next to the field it names (the reward's spec fields: in the spec form); the rest under the form.
function showFormErrors(form, errors) {
  clearFieldErrors(form);
  let rest = placeFieldErrors(errors, (loc) => {
    const box = form.querySelector(`.rf-field[data-field="${CSS.escape(loc)}"]`);
    return box ? { node: box.querySelector(".field-error") } : null;
  });
  if (form.id === "reward-form" && state.specForm) {
    const spec = rest.filter((error) => error.loc.startsWith("spec."));
    rest = [...rest.filter((error) => !spec.includes(error)), ...state.specForm.showErrors(spec)];
  }
  showErrorSummary(form.querySelector(".form-errors"), rest);
}

function setFormStatus(form, text) {
  form.querySelector(".form-status").textContent = text;
}

// Submits with the button disabled; `send` returns the status line to show.
async function submitting(form, send) {
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  setFormStatus(form, "Sending…");
  try {
    clearFieldErrors(form);
    setFormStatus(form, await send());
  } catch (error) {
    setFormStatus(form, "");
    showFormErrors(form, errorsOf(error));
  } finally {
    button.disabled = false;
  }
}

// --- lists ---------------------------------------------------------------------------------

function emptyRow(columns, text) {
  return el("tr", {}, el("td", { colspan: columns, class: "muted" }, text));
}

function freshClass(kind, id) {
  return state.fresh.has(`${kind}:${id}`) ? "fresh" : undefined;
}

function modelSource(model) {
  if (model.source === "checkpoint" && model.source_run) {
    return el("a", { href: `/runs/${model.source_run}/` }, `run checkpoint, step ${model.source_step}`);
  }
  return model.source === "gguf" ? ggufSource(model.provenance) : "folder";
}

function renderModels() {
  const rows = state.models.map((model) => el(
    "tr", { "data-id": model.id, class: freshClass("model", model.id) },
    el("td", {}, el("strong", {}, model.name), model.description ? el("div", { class: "muted" }, model.description) : null),
    el("td", {}, model.architecture || "—"),
    el("td", { class: "num" }, formatParameters(model.parameter_count)),
    el("td", {}, modelSource(model)),
    el("td", { class: "path" }, model.path),
    el("td", {}, formatWhen(model.created_at)),
  ));
  $("model-rows").replaceChildren(...(rows.length ? rows : [emptyRow(6, "No models yet: register a folder.")]));
}

function renderDatasets() {
  const rows = state.datasets.map((dataset) => el(
    "tr", { "data-id": dataset.id, class: ["clickable", freshClass("dataset", dataset.id)].filter(Boolean).join(" "),
      onclick: () => showPreview(dataset), title: "Preview the first rows" },
    el("td", {}, el("strong", {}, dataset.name), dataset.description ? el("div", { class: "muted" }, dataset.description) : null),
    el("td", {}, dataset.format),
    el("td", { class: "num" }, formatNumber(dataset.row_count)),
    el("td", { class: "num" }, formatBytes(dataset.size_bytes)),
    el("td", {}, dataset.prompt_field, " → ", dataset.label_field || el("span", { class: "muted" }, "no label")),
    el("td", {}, formatWhen(dataset.created_at)),
  ));
  $("dataset-rows").replaceChildren(...(rows.length ? rows : [emptyRow(6, "No datasets yet: upload one.")]));
}

function renderRewards() {
  const rows = state.rewards.map((reward) => el(
    "tr", { "data-id": reward.id, class: ["clickable", freshClass("reward", reward.id)].filter(Boolean).join(" "),
      onclick: () => showProbes(reward), title: "Probe it for hackability" },
    el("td", {}, el("strong", {}, reward.name), reward.description ? el("div", { class: "muted" }, reward.description) : null),
    el("td", {}, reward.kind),
    el("td", { class: "code-cell" }, rewardSummary(reward)),
    el("td", {}, formatWhen(reward.created_at)),
  ));
  $("reward-rows").replaceChildren(...(rows.length ? rows : [emptyRow(4, "No rewards yet: create one.")]));
}

// A created (or already stored) asset goes to the top of its list, marked as new.
function putFirst(list, item, kind) {
  state.fresh.add(`${kind}:${item.id}`);
  return [item, ...list.filter((other) => other.id !== item.id)];
}

// --- dataset preview -----------------------------------------------------------------------

function cellText(value) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length > PREVIEW_CELL_CHARS ? `${text.slice(0, PREVIEW_CELL_CHARS)}…` : text;
}

async function showPreview(dataset) {
  const panel = $("dataset-preview");
  panel.hidden = false;
  panel.replaceChildren(el("p", { class: "muted" }, `Loading a preview of ${dataset.name}…`));
  try {
    const preview = await api(`/api/datasets/${dataset.id}/preview/`);
    const role = (column) => (column === preview.prompt_field ? "prompt" : column === preview.label_field ? "label" : "");
    panel.replaceChildren(
      el("div", { class: "row" },
        el("h3", {}, `Preview: ${dataset.name}`),
        el("span", { class: "muted" }, `first ${preview.rows.length} of ${formatNumber(preview.row_count)} rows`),
        el("button", { type: "button", class: "secondary small", onclick: () => { panel.hidden = true; } }, "Close")),
      el("div", { class: "preview-scroll" }, el("table", { class: "data" },
        el("thead", {}, el("tr", {}, ...preview.columns.map((column) => el(
          "th", {}, column, role(column) ? el("span", { class: "tag" }, role(column)) : null)))),
        el("tbody", {}, ...preview.rows.map((row) => el(
          "tr", {}, ...preview.columns.map((column) => el("td", {}, column in row ? cellText(row[column]) : "")))))),
    ));
  } catch (error) {
    panel.replaceChildren(el("p", { class: "error" }, `No preview: ${error.message}`));
  }
}

// --- reward probes -------------------------------------------------------------------------

async function showProbes(reward) {
  const panel = $("reward-probe");
  panel.hidden = false;
  const labelled = state.datasets.filter((dataset) => dataset.label_field);
  const select = el("select", { id: "probe-dataset" }, ...labelled.map((d) => el("option", { value: d.id }, d.name)));
  const report = el("div", { id: "probe-report" });
  const status = el("span", { class: "form-status muted", "aria-live": "polite" });
  const start = el("button", { type: "button", id: "probe-start", disabled: labelled.length ? undefined : "" }, "Probe");
  const latest = async () => {
    const probes = await api(`/api/rewards/${reward.id}/probes/`, { params: { dataset: select.value } });
    report.replaceChildren(probes.length ? probeReport(probes[0]) : el("p", { class: "muted" }, "Not probed on this dataset yet."));
    if (probes.length) followProbe(probes[0], report);
  };
  start.addEventListener("click", async () => {
    start.disabled = true;
    status.textContent = "";
    try {
      const probe = await api(`/api/rewards/${reward.id}/probes/`, { method: "POST", body: { dataset: Number(select.value) } });
      await followProbe(probe, report);
    } catch (error) {
      status.textContent = error.message;
    } finally {
      start.disabled = false;
    }
  });
  select.addEventListener("change", latest);
  panel.replaceChildren(
    el("div", { class: "row" },
      el("h3", {}, `Probe ${reward.name} for hackability`),
      el("button", { type: "button", class: "secondary small", onclick: () => { panel.hidden = true; } }, "Close")),
    el("p", { class: "muted small" }, "Scores adversarial answers built from a dataset (empty, the prompt echoed, every label "
      + "listed, the label buried in noise, the right format with a wrong answer, very long, one word repeated, another "
      + "row's label) against the honest answer, on the user-code worker."),
    labelled.length
      ? el("div", { class: "row" }, el("label", { for: "probe-dataset" }, "Dataset "), select, start, status)
      : el("p", { class: "muted" }, "No dataset with a label field: upload one to probe against."),
    report,
  );
  if (labelled.length) await latest();
}

// --- forms ---------------------------------------------------------------------------------

async function uploadDataset(event) {
  event.preventDefault();
  const form = event.target;
  await submitting(form, async () => {
    const data = new FormData();
    const file = $("dataset-file").files[0];
    if (file) data.append("file", file);
    data.append("name", $("dataset-name").value.trim());
    data.append("description", $("dataset-description").value);
    if ($("dataset-format").value) data.append("format", $("dataset-format").value);
    data.append("prompt_field", $("dataset-prompt-field").value.trim());
    data.append("label_field", $("dataset-label-field").value.trim());
    const before = new Set(state.datasets.map((dataset) => dataset.id));
    const dataset = await api("/api/datasets/", { method: "POST", body: data });
    state.datasets = putFirst(state.datasets, dataset, "dataset");
    renderDatasets();
    form.reset();
    return before.has(dataset.id)
      ? `This content is already stored as “${dataset.name}”.`
      : `Uploaded “${dataset.name}”: ${formatNumber(dataset.row_count)} rows.`;
  });
}

async function registerModel(event) {
  event.preventDefault();
  const form = event.target;
  await submitting(form, async () => {
    const model = await api("/api/models/", { method: "POST", body: {
      name: $("model-name").value.trim(), path: $("model-path").value.trim(), description: $("model-description").value,
    } });
    state.models = putFirst(state.models, model, "model");
    renderModels();
    form.reset();
    return `Registered “${model.name}”.`;
  });
}

// The upload answers at once with the import (202); the worker converts it, and the page follows it there.
async function importGguf(event) {
  event.preventDefault();
  const form = event.target;
  await submitting(form, async () => {
    const data = new FormData();
    const file = $("gguf-file").files[0];
    if (file) data.append("file", file);
    data.append("name", $("gguf-name").value.trim());
    data.append("description", $("gguf-description").value);
    setFormStatus(form, file ? `Uploading ${file.name}…` : "Sending…");
    const record = await api("/api/models/import-gguf/", { method: "POST", body: data });
    form.reset();
    followImport(record, $("gguf-import"), (model) => {
      state.models = putFirst(state.models, model, "model");
      renderModels();
    }).catch((error) => setFormStatus(form, `Lost track of the import: ${error.message}`));
    return "";
  });
}

function rewardType() {
  const kind = $("reward-kind").value;
  return kind === "builtin" ? $("reward-type").value : kind;
}

// The spec fields of the chosen reward type, from the engine's schema (its reward $defs).
function renderSpecForm() {
  const kind = $("reward-kind").value;
  $("reward-type-field").hidden = kind !== "builtin";
  $("reward-source-field").hidden = kind !== "python";
  const mapping = state.schema.properties.rewards.items.discriminator.mapping;
  // A python reward's code is sent as `source`; the registry stores it and sets spec.path.
  const skip = kind === "python" ? [...SPEC_NOT_IN_FORM, "path"] : SPEC_NOT_IN_FORM;
  state.specForm = new SchemaForm(state.schema, {
    node: { $ref: mapping[rewardType()] }, sectioned: false, skip, locPrefix: "spec",
  });
  $("reward-spec").replaceChildren(state.specForm.node);
}

async function createReward(event) {
  event.preventDefault();
  const form = event.target;
  await submitting(form, async () => {
    const kind = $("reward-kind").value;
    const body = {
      name: $("reward-name").value.trim(),
      description: $("reward-description").value,
      kind,
      spec: { type: rewardType(), ...state.specForm.values() },
    };
    if (kind === "python") body.source = $("reward-source").value;
    const reward = await api("/api/rewards/", { method: "POST", body });
    state.rewards = putFirst(state.rewards, reward, "reward");
    renderRewards();
    $("reward-name").value = "";
    $("reward-description").value = "";
    $("reward-source").value = "";
    renderSpecForm();
    return `Created “${reward.name}”.`;
  });
}

// --- set-up --------------------------------------------------------------------------------

async function init() {
  $("reward-type").replaceChildren(...BUILTIN_TYPES.map((type) => el("option", { value: type }, type)));
  $("dataset-form").addEventListener("submit", uploadDataset);
  $("model-form").addEventListener("submit", registerModel);
  $("gguf-form").addEventListener("submit", importGguf);
  $("reward-form").addEventListener("submit", createReward);
  $("reward-kind").addEventListener("change", renderSpecForm);
  $("reward-type").addEventListener("change", renderSpecForm);

  const [models, datasets, rewards, schemaInfo] = await Promise.all([
    listAll("/api/models/"), listAll("/api/datasets/"), listAll("/api/rewards/"), api("/api/config/schema/"),
  ]);
  Object.assign(state, { models, datasets, rewards, schema: schemaInfo.schema });
  renderModels();
  renderDatasets();
  renderRewards();
  renderSpecForm();
  document.body.dataset.ready = "true"; // the page is wired up (tests wait for this)
}

init().catch((error) => {
  $("registry-failure").textContent = `The registry could not load: ${error.message}`;
  $("registry-failure").hidden = false;
});
