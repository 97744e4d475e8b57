// The metric catalogue (rl_engine/metric_catalogue.py), embedded in the page by json_script as
// "metric-catalogue": the run page's panels, and for each metric (a name or a pattern like
// reward/<component>) its unit, panel, better side and whether it is a headline metric.
//
//   metricInfo("reward/exact_match") -> {name: "reward/<component>", unit, panel: "reward", higher_is_better, ...}
//                                       or null for a metric the catalogue does not know
//   PANELS: [{id, title, unit, stacked_bars}]     HEADLINE_METRICS: ["reward/mean", ...]
import { pageData } from "./api.js";

const CATALOGUE = pageData("metric-catalogue") || { panels: [], metrics: [] };
const EXACT = new Map(CATALOGUE.metrics.filter((m) => m.exact).map((m) => [m.name, m]));
const PATTERNS = CATALOGUE.metrics.filter((m) => !m.exact).map((m) => ({ ...m, regex: new RegExp(m.match) }));

export const PANELS = CATALOGUE.panels;
export const GROUPS = CATALOGUE.groups || {}; // group id -> title (panels of a group are drawn together)
export const HEADLINE_METRICS = CATALOGUE.metrics.filter((m) => m.headline).map((m) => m.name);

// An exact entry first, else the first pattern that matches, in catalogue order.
export function metricInfo(name) {
  return EXACT.get(name) || PATTERNS.find((m) => m.regex.test(name)) || null;
}
