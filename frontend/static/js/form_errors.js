// The API's field errors shown in a form: every page's one way of doing it. Every API error body is
// {"errors": [{loc, msg}]} (docs/ARCHITECTURE.md, "The error contract"); `loc` is a dotted/bracketed
// path ("questions[1].max", "spec.pattern", "rollout.samples_per_prompt", "rewards.0.weight"), "" when
// the error is about the request as a whole.
//
//   clearFieldErrors(root)                    empties and hides every .field-error under root, drops .has-error
//   const rest = placeFieldErrors(errors, targetFor)
//       each error goes to targetFor(prefix, loc) for the longest prefix of its loc that has a target:
//       {node, owner?, reveal?}: the message is appended to `node` (with its loc unless the target is
//       the loc itself), `owner` gets .has-error, `reveal()` runs (opens a closed section); returns the
//       errors no target took
//   showErrorSummary(node, rest, {heading, note})   those errors as a list (node hidden when none)
//   errorsOf(error)                           the [{loc, msg}] of anything api() threw
import { ApiError, el, errorText } from "./api.js";

export function errorsOf(error) {
  return error instanceof ApiError && error.errors.length ? error.errors : [{ loc: "", msg: error.message }];
}

// "questions[1].labels[2]" -> ["questions[1].labels[2]", "questions[1].labels", "questions[1]", "questions"]
export function locPrefixes(loc) {
  const prefixes = [];
  let rest = loc;
  while (rest) {
    prefixes.push(rest);
    const cut = Math.max(rest.lastIndexOf("."), rest.lastIndexOf("["));
    rest = cut > 0 ? rest.slice(0, cut) : "";
  }
  return prefixes;
}

export function showIn(node, text) {
  node.append(el("div", {}, text));
  node.hidden = false;
}

export function clearFieldErrors(root) {
  for (const node of root.querySelectorAll(".field-error")) {
    node.hidden = true;
    node.replaceChildren();
  }
  root.querySelectorAll(".has-error").forEach((node) => node.classList.remove("has-error"));
}

export function placeFieldErrors(errors, targetFor) {
  const unplaced = [];
  for (const error of errors) {
    const loc = String(error.loc || "");
    let target = null;
    let prefix = "";
    for (prefix of locPrefixes(loc)) {
      target = targetFor(prefix, loc);
      if (target) break;
    }
    if (!target) {
      unplaced.push(error);
      continue;
    }
    showIn(target.node, prefix === loc ? error.msg : errorText({ loc, msg: error.msg }));
    if (target.owner) target.owner.classList.add("has-error");
    if (target.reveal) target.reveal();
  }
  return unplaced;
}

export function showErrorSummary(node, errors, { heading = "", note = "" } = {}) {
  node.replaceChildren();
  node.hidden = errors.length === 0;
  if (!errors.length) return;
  if (heading) node.append(el("strong", {}, heading));
  node.append(el("ul", {}, ...errors.map((error) => el("li", {}, errorText(error)))));
  if (note) node.append(el("div", { class: "muted" }, note));
}
