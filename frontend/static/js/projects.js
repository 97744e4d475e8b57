// The /projects/ page: the user's projects (GET /api/projects/), a new one (POST), and one project's members
// (GET /api/projects/<id>/members/; PUT and DELETE /api/projects/<id>/members/<username>/ for its managers).
import { $, api, el, pageData } from "./api.js";

const page = pageData("page-data");
const MANAGERS = new Set(["owner", "maintainer"]);
let selected = null;

function showError(error) {
  $("projects-error").textContent = error ? error.message : "";
  $("projects-error").hidden = !error;
}

const manages = (project) => page.admin || MANAGERS.has(project.role);

async function loadProjects() {
  const projects = await api("/api/projects/");
  $("projects-table").querySelector("tbody").replaceChildren(...projects.map((project) => el("tr",
    { "data-project": project.name, class: selected && selected.id === project.id ? "selected" : "" },
    el("td", {}, el("strong", {}, project.name), project.description ? el("div", { class: "muted small" }, project.description) : null),
    el("td", {}, project.role || (page.admin ? "admin" : "—")),
    el("td", { class: "num" }, project.member_count),
    el("td", {}, project.created_by || "—"),
    el("td", {}, el("button", { type: "button", class: "link", onclick: () => selectProject(project) }, "Members")))));
  $("projects-empty").hidden = projects.length > 0;
  return projects;
}

function roleSelect(current, disabled, onchange) {
  const select = el("select", { disabled, "aria-label": "role" },
    page.roles.map((role) => el("option", { value: role, selected: role === current }, role)));
  select.addEventListener("change", () => onchange(select.value));
  return select;
}

async function setRole(username, role) {
  showError(null);
  try {
    await api(`/api/projects/${selected.id}/members/${encodeURIComponent(username)}/`, { method: "PUT", body: { role } });
  } catch (error) {
    showError(error);
  }
  await refresh();
}

async function removeMember(username) {
  showError(null);
  try {
    await api(`/api/projects/${selected.id}/members/${encodeURIComponent(username)}/`, { method: "DELETE" });
  } catch (error) {
    showError(error);
  }
  await refresh();
}

async function loadMembers() {
  const members = await api(`/api/projects/${selected.id}/members/`);
  const canManage = manages(selected);
  $("members-project").textContent = selected.name;
  $("members-table").querySelector("tbody").replaceChildren(...members.map((member) => {
    const self = member.username === page.username;
    return el("tr", { "data-member": member.username },
      el("td", {}, member.username),
      el("td", {}, roleSelect(member.role, !canManage, (role) => setRole(member.username, role))),
      el("td", {}, new Date(member.added_at).toLocaleDateString()),
      el("td", {}, canManage || self
        ? el("button", { type: "button", class: "link", onclick: () => removeMember(member.username) }, self ? "Leave" : "Remove")
        : null));
  }));
  $("member-form").hidden = !canManage;
  $("members-section").hidden = false;
}

async function selectProject(project) {
  selected = project;
  await refresh();
}

async function refresh() {
  try {
    const projects = await loadProjects();
    if (selected) {
      selected = projects.find((p) => p.id === selected.id) || null;
      if (selected) await loadMembers();
      else $("members-section").hidden = true;
    }
  } catch (error) {
    showError(error);
  }
}

$("member-form").querySelector("select[name=role]").replaceChildren(
  ...page.roles.map((role) => el("option", { value: role, selected: role === "member" }, role)));

$("project-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  $("project-form-status").textContent = "";
  try {
    const project = await api("/api/projects/", {
      method: "POST", body: { name: form.name.value.trim(), description: form.description.value },
    });
    form.reset();
    $("project-form-status").textContent = `Made ${project.name}: you own it.`;
    selected = project;
    await refresh();
  } catch (error) {
    $("project-form-status").textContent = error.message;
  }
});

$("member-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.target;
  $("member-form-status").textContent = "";
  try {
    await api(`/api/projects/${selected.id}/members/${encodeURIComponent(form.username.value.trim())}/`, {
      method: "PUT", body: { role: form.role.value },
    });
    form.username.value = "";
    await refresh();
  } catch (error) {
    $("member-form-status").textContent = error.message;
  }
});

refresh();
