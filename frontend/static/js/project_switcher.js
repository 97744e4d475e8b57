// The header's project switcher: the session's project (PUT /api/projects/current/), which lists show and new
// objects go into; the page reloads to show the chosen project's objects.
import { api } from "./api.js";

const select = document.getElementById("project-switcher");
if (select) {
  select.addEventListener("change", async () => {
    select.disabled = true;
    try {
      await api("/api/projects/current/", { method: "PUT", body: { project: select.value || null } });
      window.location.reload();
    } catch (error) {
      select.disabled = false;
      window.alert(`Could not switch project: ${error.message}`);
    }
  });
}
