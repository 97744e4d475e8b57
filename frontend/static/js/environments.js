// The registry page's environments: the list (state polled while a worker generates), the registration form,
// and "Try it", which plays one episode with typed moves on a worker and shows it turn by turn.

import { $, api, el, formatNumber } from "./api.js";
import { listAll } from "./assets.js";
import { clearFieldErrors, errorsOf, placeFieldErrors, showErrorSummary } from "./form_errors.js";
import { trajectoryList } from "./trajectory.js";

const POLL_MS = 1500;
const state = { environments: [], trying: null };

function showErrors(form, errors) {
  clearFieldErrors(form);
  const rest = placeFieldErrors(errors, (loc) => {
    const box = form.querySelector(`.rf-field[data-field="${CSS.escape(loc)}"]`);
    return box ? { node: box.querySelector(".field-error") } : null;
  });
  showErrorSummary(form.querySelector(".form-errors"), rest);
}

function status(form, text) {
  form.querySelector(".form-status").textContent = text;
}

function argumentsText(environment) {
  const args = Object.keys(environment.arguments || {}).length ? ` ${JSON.stringify(environment.arguments)}` : "";
  return `${environment.env_id}${args}`;
}

function renderEnvironments() {
  const rows = state.environments.map((environment) => el("tr", { "data-environment": environment.name },
    el("td", {}, environment.name, environment.version ? el("div", { class: "muted" }, `v${environment.version}`) : null),
    el("td", {}, environment.package),
    el("td", { class: "code" }, argumentsText(environment)),
    el("td", {}, el("span", { class: `badge state-${environment.state}`, title: environment.error || "" }, environment.state),
      environment.error ? el("div", { class: "field-error" }, environment.error) : null),
    el("td", {}, environment.state === "ready"
      ? el("button", { type: "button", class: "environment-try", onclick: () => openTry(environment) }, "Try it")
      : null),
  ));
  $("environment-rows").replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 5, class: "muted" }, "None yet."))]));
  if (state.environments.some((environment) => environment.state === "generating")) setTimeout(refresh, POLL_MS);
}

async function refresh() {
  state.environments = await listAll("/api/environments/");
  renderEnvironments();
}

async function register(event) {
  event.preventDefault();
  const form = event.target;
  clearFieldErrors(form);
  let args;
  try {
    args = JSON.parse($("environment-arguments").value || "{}");
  } catch (error) {
    showErrors(form, [{ loc: "arguments", msg: `not JSON: ${error.message}` }]);
    return;
  }
  status(form, "Sending…");
  try {
    const environment = await api("/api/environments/", {
      method: "POST",
      body: {
        name: $("environment-name").value.trim(), package: $("environment-package").value,
        env_id: $("environment-env-id").value.trim(), arguments: args,
        size: Number($("environment-size").value), seed: Number($("environment-seed").value),
      },
    });
    status(form, `Registered “${environment.name}”: a worker generates its rows.`);
    await refresh();
  } catch (error) {
    status(form, "");
    showErrors(form, errorsOf(error));
  }
}

function openTry(environment) {
  state.trying = environment;
  $("environment-try-name").textContent = environment.name;
  $("environment-try-episode").replaceChildren();
  $("environment-try").showModal();
}

// An episode turn by turn: the prompt, the model's turns and the environment's answers with their rewards.
function episodeView(result) {
  const turns = result.turns || [];
  return el("div", {},
    el("h3", {}, "Prompt"), el("pre", { class: "code" }, result.prompt || ""),
    trajectoryList(turns, (text) => el("pre", { class: "code" }, text)),
    el("p", {}, "reward ", el("strong", { class: "episode-reward" }, formatNumber(result.reward)),
      result.done ? " · the episode ended" : " · the moves ran out before the episode ended"),
    (result.errors || []).length ? el("pre", { class: "code error" }, result.errors.join("\n")) : null,
  );
}

async function play(event) {
  event.preventDefault();
  const form = event.target;
  clearFieldErrors(form);
  const moves = $("environment-try-moves").value.split("\n").filter((line) => line.trim());
  status(form, "Playing on a worker…");
  try {
    let result = await api(`/api/environments/${state.trying.id}/try/`, {
      method: "POST", body: { moves, row: Number($("environment-try-row").value) },
    });
    while (result.state === "queued" || result.state === "running") {
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
      const trial = await api(result.url);
      result = trial.state === "done" ? trial.result : trial;
      if (trial.state === "failed") throw new Error(trial.error);
    }
    status(form, "");
    $("environment-try-episode").replaceChildren(episodeView(result));
  } catch (error) {
    status(form, "");
    showErrors(form, errorsOf(error));
  }
}

async function init() {
  $("environment-form").addEventListener("submit", register);
  $("environment-try-form").addEventListener("submit", play);
  $("environment-try-close").addEventListener("click", () => $("environment-try").close());
  await refresh();
  document.getElementById("environments").dataset.ready = "true";
}

init().catch((error) => {
  $("environment-rows").replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "field-error" }, `Environments could not load: ${error.message}`)));
});
