// The researcher's list of review campaigns: state, items and how far the annotators got.
import { $, api, el, stateBadge } from "./api.js";

const PAGE_SIZE = 50;

let offset = 0;

function campaignRow(campaign) {
  const needed = campaign.item_count * campaign.overlap;
  return el("tr", { "data-campaign-id": campaign.id },
    el("td", {}, el("a", { href: `/review/campaigns/${campaign.id}/`, class: "campaign-name" }, campaign.name),
      campaign.description ? el("div", { class: "muted small clamp" }, campaign.description) : null),
    el("td", {}, campaign.kind === "pair" ? "pairs" : "single"),
    el("td", {}, stateBadge(campaign.state)),
    el("td", { class: "num" }, campaign.item_count),
    el("td", { class: "progress-cell" }, el("progress", { max: needed || 1, value: campaign.judgement_total }),
      el("div", { class: "small muted" },
        `${campaign.judgement_total} of ${needed} judgements · ${campaign.items_complete} of ${campaign.item_count} items done`)),
    el("td", {}, campaign.annotators.join(", ") || el("span", { class: "muted" }, "none yet")),
    el("td", { class: "small" }, campaign.blind ? "blind" : "shows rewards", el("div", { class: "muted" }, `overlap ${campaign.overlap}`)),
    el("td", { class: "small nowrap", title: campaign.created_at }, new Date(campaign.created_at).toLocaleString(),
      campaign.created_by ? el("div", { class: "muted" }, campaign.created_by) : null),
  );
}

function render(page) {
  const box = $("campaigns-box");
  if (!page.results.length) {
    box.replaceChildren(el("div", { class: "card empty-state" }, offset ? "No more campaigns." : "No campaigns yet. ",
      offset ? null : el("a", { href: "/review/new/" }, "Create the first one"), offset ? null : "."));
  } else {
    const head = el("tr", {}, ...["Campaign", "Kind", "State"].map((t) => el("th", {}, t)),
      el("th", { class: "num" }, "Items"), el("th", {}, "Progress"), el("th", {}, "Annotators"),
      el("th", {}, "Mode"), el("th", {}, "Created"));
    box.replaceChildren(el("table", { class: "data", id: "campaigns-table" },
      el("thead", {}, head), el("tbody", {}, page.results.map(campaignRow))));
  }
  $("campaigns-pager").hidden = page.count <= PAGE_SIZE;
  $("page-info").textContent = `${page.results.length ? offset + 1 : 0}–${offset + page.results.length} of ${page.count}`;
  $("page-prev").disabled = offset === 0;
  $("page-next").disabled = offset + PAGE_SIZE >= page.count;
}

async function load() {
  try {
    const page = await api("/api/review/campaigns/", {
      params: { state: $("state-filter").value, limit: PAGE_SIZE, offset },
    });
    $("campaigns-error").hidden = true;
    render(page);
  } catch (error) {
    $("campaigns-error").hidden = false;
    $("campaigns-error").textContent = `Could not load campaigns: ${error.message}`;
  }
}

$("state-filter").addEventListener("change", () => { offset = 0; load(); });
$("page-prev").addEventListener("click", () => { offset = Math.max(0, offset - PAGE_SIZE); load(); });
$("page-next").addEventListener("click", () => { offset += PAGE_SIZE; load(); });
await load();
document.body.dataset.ready = "true"; // tests wait for this
