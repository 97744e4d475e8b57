// Shared helpers of every page: JSON calls to our REST API (session + CSRF) and small DOM builders.
// Plain ES module, no build step: pages load it with <script type="module">.

export class ApiError extends Error {
  // `errors`: the API's [{loc, msg}] list. Every API error body has one (docs/ARCHITECTURE.md, "The error
  // contract"), with the conflict's context beside it in `body` (`state`, `expected_seq`).
  constructor(status, message, errors = [], body = null) {
    super(message);
    this.status = status;
    this.errors = errors;
    this.body = body;
  }
}

export function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  if (match) return decodeURIComponent(match[1]);
  const input = document.querySelector("input[name=csrfmiddlewaretoken]");
  return input ? input.value : "";
}

// One error as a line: "loc: msg", or "msg" when it is about the request as a whole.
export function errorText(error) {
  return error.loc ? `${error.loc}: ${error.msg}` : error.msg;
}

// api("/api/runs/", {method: "POST", body: {...}}) -> parsed JSON; throws ApiError on a non-2xx answer.
// A FormData body is sent as multipart (file uploads); anything else as JSON.
export async function api(path, { method = "GET", body = undefined, params = undefined, signal = undefined } = {}) {
  const url = new URL(path, window.location.origin);
  if (params) {
    for (const [key, value] of Object.entries(params)) {
      if (value === undefined || value === null || value === "") continue;
      if (Array.isArray(value)) value.forEach((v) => url.searchParams.append(key, v));
      else url.searchParams.set(key, value);
    }
  }
  const headers = { Accept: "application/json" };
  let payload;
  if (body instanceof FormData) payload = body;
  else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  if (method !== "GET" && method !== "HEAD") headers["X-CSRFToken"] = csrfToken();
  const response = await fetch(url, { method, headers, body: payload, credentials: "same-origin", signal });
  const text = await response.text();
  let parsed = null;
  let notJson = ""; // a proxy's error page, say: its text is the message
  if (text) {
    try { parsed = JSON.parse(text); } catch { notJson = text.slice(0, 500); }
  }
  if (!response.ok) {
    const errors = Array.isArray(parsed?.errors) ? parsed.errors : [];
    const message = errors.map(errorText).join("\n") || notJson || `HTTP ${response.status}`;
    throw new ApiError(response.status, message, errors, parsed);
  }
  return parsed;
}

// el("a", {href: "/x", class: "btn", onclick: fn}, "text", otherNode) -> HTMLElement.
// Strings become text nodes (never HTML), so user data cannot inject markup.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A metric value for a table cell: 4 significant digits, "—" for missing, NaN/Inf shown as such.
export function formatNumber(value) {
  if (value === undefined || value === null) return "—";
  if (typeof value === "string") return value;
  if (!Number.isFinite(value)) return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e6) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(3);
  return String(Number(value.toPrecision(4)));
}

export function formatDuration(seconds) {
  if (seconds === undefined || seconds === null || !Number.isFinite(seconds)) return "—";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
}

// A run state as a badge; CSS colours it by state (.badge.state-running, …).
export function stateBadge(state) {
  return el("span", { class: `badge state-${state}`, "data-state": state }, state);
}

// Reads JSON a template embedded with Django's json_script filter.
export function pageData(id) {
  const node = document.getElementById(id);
  return node ? JSON.parse(node.textContent) : null;
}

// --- small page helpers every page would otherwise write again ---------------------------------------

export const $ = (id) => document.getElementById(id);

// A run in one of these states never changes again (runs/models.py TERMINAL_STATES).
export const TERMINAL_STATES = new Set(["succeeded", "failed", "cancelled"]);

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

// "a, b,,c" -> ["a", "b", "c"]: a comma-separated field as a list.
export function splitList(text) {
  return (text || "").split(",").map((part) => part.trim()).filter(Boolean);
}

// A <dialog> opened modal, or closed when open (the work pages' keys and guidelines).
export function toggleDialog(dialog) {
  if (dialog.open) dialog.close();
  else dialog.showModal();
}

// A queue page's keys: J/K move the focus between the entries' `linkSelector` links (Enter follows one).
export function queueKeys(linkSelector) {
  const moveFocus = (by) => {
    const links = [...document.querySelectorAll(linkSelector)];
    if (!links.length) return;
    const at = links.indexOf(document.activeElement);
    links[at === -1 ? 0 : Math.min(links.length - 1, Math.max(0, at + by))].focus();
  };
  document.addEventListener("keydown", (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey || event.target.matches("input, textarea, select")) return;
    const key = event.key.toLowerCase();
    if (key === "j") moveFocus(1);
    else if (key === "k") moveFocus(-1);
  });
}
