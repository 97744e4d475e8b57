// The annotator's queue: their active campaigns with their progress. Keyboard first: the first
// campaign with work left has focus, J/K move between campaigns, Enter opens the work page.
import { $, api, el, queueKeys } from "./api.js";

function progressText(progress) {
  const total = progress.judged + progress.remaining;
  if (progress.done) return `All ${progress.judged} judged: done`;
  const waiting = progress.remaining - progress.available;
  return `${progress.judged} of ${total} judged`
    + (progress.skipped ? ` · ${progress.skipped} skipped` : "")
    + (waiting > 0 ? ` · ${waiting} being judged by others` : "");
}

function entry(campaign, number) {
  const progress = campaign.progress;
  const label = progress.done ? "Open" : progress.judged || progress.skipped || progress.held_item ? "Continue" : "Start";
  return el("li", { class: `card queue-entry${progress.done ? " done" : ""}`, "data-campaign-id": campaign.id },
    el("div", { class: "row spread" },
      el("div", {},
        el("h2", { class: "first" }, campaign.name),
        campaign.description ? el("p", { class: "muted" }, campaign.description) : null,
        el("div", { class: "small muted" }, campaign.kind === "pair" ? "Compare two responses" : "Judge one response",
          ` · ${campaign.questions.length} question${campaign.questions.length === 1 ? "" : "s"}`)),
      el("a", { class: "button start", href: `/annotate/${campaign.id}/`, "data-number": number }, label)),
    el("div", { class: "row" },
      el("progress", { max: progress.judged + progress.remaining || 1, value: progress.judged }),
      el("span", { class: "queue-progress" }, progressText(progress))));
}

queueKeys("#queue-box a.start");

try {
  const campaigns = await api("/api/review/queue/");
  $("queue-box").replaceChildren(campaigns.length
    ? el("ul", { class: "queue-list" }, campaigns.map((campaign, i) => entry(campaign, i + 1)))
    : el("div", { class: "card empty-state" }, "Nothing to review: no active campaign has you as an annotator."));
  const firstOpen = document.querySelector("#queue-box .queue-entry:not(.done) a.start")
    || document.querySelector("#queue-box a.start");
  if (firstOpen) firstOpen.focus();
} catch (error) {
  $("queue-error").hidden = false;
  $("queue-error").textContent = `Could not load your queue: ${error.message}`;
}
document.body.dataset.ready = "true"; // tests wait for this
