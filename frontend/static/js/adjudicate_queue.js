// The reviewer's queue: the campaigns they adjudicate, with the items waiting for a decision in each.
// Keyboard first, like the annotators' queue: the first campaign with items waiting has focus, J/K move,
// Enter opens the adjudication page.
import { $, api, el, queueKeys } from "./api.js";

function entry(campaign) {
  const waiting = campaign.pending > 0;
  return el("li", { class: `card queue-entry${waiting ? "" : " done"}`, "data-campaign-id": campaign.id },
    el("div", { class: "row spread" },
      el("div", {},
        el("h2", { class: "first" }, campaign.name),
        el("div", { class: "small muted" }, `${campaign.kind === "pair" ? "Pairs" : "Single responses"} · ${campaign.state}`)),
      el("a", { class: "button start", href: `/adjudicate/${campaign.id}/` }, waiting ? "Adjudicate" : "Open")),
    el("div", { class: "queue-progress" },
      `${campaign.pending} waiting`
      + (campaign.held_by_others ? ` (${campaign.held_by_others} with other reviewers)` : "")
      + ` · ${campaign.decided} decided, ${campaign.decided_by_me} by you`));
}

queueKeys("#queue-box a.start");

try {
  const campaigns = await api("/api/review/adjudication/");
  $("queue-box").replaceChildren(campaigns.length
    ? el("ul", { class: "queue-list" }, campaigns.map(entry))
    : el("div", { class: "card empty-state" }, "Nothing to adjudicate: no active or closed campaign has you as a reviewer."));
  const first = document.querySelector("#queue-box .queue-entry:not(.done) a.start")
    || document.querySelector("#queue-box a.start");
  if (first) first.focus();
} catch (error) {
  $("queue-error").hidden = false;
  $("queue-error").textContent = `Could not load your campaigns: ${error.message}`;
}
document.body.dataset.ready = "true"; // tests wait for this
