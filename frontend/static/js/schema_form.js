// A form generated from a JSON schema as pydantic writes it (model_json_schema): a section per
// object, an input per field by type, defaults filled in, each `description` as help text.
//
//   const form = new SchemaForm(schema, {skip: ["model.path"], open: ["rollout"], onChange});
//   parent.append(form.node);
//   form.values()           -> only what differs from the defaults, e.g. {rollout: {samples_per_prompt: 4}}
//   form.setValues(config)  -> fills every field (defaults where the config is silent)
//   form.showErrors(errors) -> puts each {loc, msg} next to its field; returns the ones with no field
//   form.errorTarget(loc)   -> where an error about loc goes, for a page's own placeFieldErrors (form_errors.js)
//
// Inputs never reject what they cannot parse: "4.5" for an integer or "[1," for a list is sent as
// typed, so the engine's own validation names the problem next to the field. Keys of a loaded
// config that the form has no field for (skipped fields, typos) are kept and sent back unchanged,
// so validation reports them instead of the form silently dropping them.

import { el } from "./api.js";
import { clearFieldErrors, placeFieldErrors } from "./form_errors.js";

const MISSING = Symbol("missing");
const NUMBER_TEXT = /^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i;

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

function setAt(target, path, value) {
  let node = target;
  for (const key of path.slice(0, -1)) {
    if (!isObject(node[key])) node[key] = {};
    node = node[key];
  }
  node[path[path.length - 1]] = value;
}

// Removes the value at `path` from `source` and returns [found, value].
function takeAt(source, path) {
  let node = source;
  for (const key of path.slice(0, -1)) {
    if (!isObject(node[key])) return [false, undefined];
    node = node[key];
  }
  const last = path[path.length - 1];
  if (!Object.prototype.hasOwnProperty.call(node, last)) return [false, undefined];
  const value = node[last];
  delete node[last];
  return [true, value];
}

function withoutEmptyObjects(value) {
  if (!isObject(value)) return value;
  const out = {};
  for (const [key, item] of Object.entries(value)) {
    const kept = withoutEmptyObjects(item);
    if (isObject(kept) && !Object.keys(kept).length && isObject(item)) continue;
    out[key] = kept;
  }
  return out;
}

export function mergeDeep(base, extra) {
  const out = { ...base };
  for (const [key, value] of Object.entries(extra || {})) {
    out[key] = isObject(value) && isObject(out[key]) ? mergeDeep(out[key], value) : value;
  }
  return out;
}

function constraintText(spec) {
  const parts = [];
  if (spec.minimum !== undefined) parts.push(`≥ ${spec.minimum}`);
  if (spec.exclusiveMinimum !== undefined) parts.push(`> ${spec.exclusiveMinimum}`);
  if (spec.maximum !== undefined) parts.push(`≤ ${spec.maximum}`);
  if (spec.exclusiveMaximum !== undefined) parts.push(`< ${spec.exclusiveMaximum}`);
  return parts.join(", ");
}

function defaultText(field) {
  if (field.default === MISSING) return field.required ? "required" : "optional";
  if (field.default === null) return "default: empty";
  if (field.default === "") return "default: empty text";
  return `default: ${typeof field.default === "object" ? JSON.stringify(field.default) : field.default}`;
}

export class SchemaForm {
  // root: the whole schema ($ref resolves in its $defs); node: the object schema to render (default root).
  // skip: dotted paths (relative to node) left out; open: sections expanded at first;
  // sectioned: top-level objects become collapsible sections (else one flat group);
  // locPrefix: put before every loc, so API errors like "spec.pattern" match a form rendered for `spec`.
  constructor(root, { node = root, skip = [], open = [], sectioned = true, locPrefix = "", onChange = () => {} } = {}) {
    this.root = root;
    this.skip = new Set(skip);
    this.open = new Set(open);
    this.locPrefix = locPrefix;
    this.onChange = onChange;
    this.fields = [];
    this.groups = new Map(); // loc -> {errorNode, section}
    this.sections = []; // {details, badge, fields}
    this.extra = {};
    this.node = sectioned ? this.renderSections(this.resolve(node)) : this.renderFlat(this.resolve(node));
    for (const field of this.fields) field.write(field.default);
    this.refreshChanged();
  }

  resolve(schema) {
    let spec = schema || {};
    while (spec.$ref) {
      const { $ref, ...rest } = spec;
      const target = $ref.replace(/^#\//, "").split("/").reduce((node, key) => node?.[key], this.root);
      spec = { ...target, ...rest }; // the property's own description wins over the class docstring
    }
    if (Array.isArray(spec.allOf) && spec.allOf.length === 1) {
      const { allOf, ...rest } = spec;
      spec = { ...this.resolve(allOf[0]), ...rest };
    }
    return spec;
  }

  loc(path) {
    return [this.locPrefix, ...path].filter((part) => part !== "").join(".");
  }

  // Top-level scalars first, in a "general" section; then one section per top-level object.
  renderSections(spec) {
    const entries = Object.entries(spec.properties || {})
      .filter(([key]) => !this.skip.has(key))
      .map(([key, propSchema]) => [key, this.resolve(propSchema)]);
    const isSection = ([, prop]) => prop.type === "object" && prop.properties;
    const out = el("div", { class: "sf-form" });
    const scalars = entries.filter((entry) => !isSection(entry) && !("const" in entry[1]));
    if (scalars.length) {
      const { details, body } = this.sectionShell("general", "Run-wide settings.", true);
      const required = new Set(spec.required || []);
      for (const [key, prop] of scalars) body.append(this.renderField([key], prop, required.has(key)));
      out.append(details);
    }
    for (const [key, prop] of entries.filter(isSection)) out.append(this.renderSection(key, prop));
    return out;
  }

  sectionShell(key, description, open) {
    const badge = el("span", { class: "sf-badge" });
    const errorNode = el("div", { class: "field-error", hidden: true });
    const body = el("div", { class: "sf-fields" });
    const details = el(
      "details",
      { class: "sf-section", "data-loc": this.loc([key]), open: open || this.open.has(key) },
      el("summary", {}, el("strong", {}, key), " ", el("span", { class: "muted" }, description || ""), " ", badge),
      errorNode,
      body,
    );
    const section = { details, badge, fields: [] };
    this.sections.push(section);
    if (key !== "general") this.groups.set(this.loc([key]), { errorNode, section });
    this.currentSection = section;
    return { details, body };
  }

  renderSection(key, spec) {
    const { details, body } = this.sectionShell(key, spec.description, this.open.has(key));
    body.append(...this.renderProperties([key], spec));
    return details;
  }

  renderFlat(spec) {
    this.currentSection = null;
    return el("div", { class: "sf-fields" }, ...this.renderProperties([], spec));
  }

  renderProperties(path, spec) {
    const nodes = [];
    const required = new Set(spec.required || []);
    for (const [key, propSchema] of Object.entries(spec.properties || {})) {
      const childPath = [...path, key];
      if (this.skip.has(childPath.join("."))) continue;
      const prop = this.resolve(propSchema);
      if (prop.type === "object" && prop.properties) {
        const errorNode = el("div", { class: "field-error", hidden: true });
        this.groups.set(this.loc(childPath), { errorNode, section: this.currentSection });
        nodes.push(el(
          "fieldset",
          { class: "sf-group", "data-loc": this.loc(childPath) },
          el("legend", {}, key),
          prop.description ? el("div", { class: "sf-help muted" }, prop.description) : null,
          errorNode,
          el("div", { class: "sf-fields" }, ...this.renderProperties(childPath, prop)),
        ));
      } else {
        const node = this.renderField(childPath, prop, required.has(key));
        if (node) nodes.push(node);
      }
    }
    return nodes;
  }

  // One input for a leaf; null for a constant (nothing to choose).
  renderField(path, spec, required = false) {
    let inner = spec;
    let nullable = false;
    if (Array.isArray(spec.anyOf)) {
      const members = spec.anyOf.map((member) => this.resolve(member));
      const nonNull = members.filter((member) => member.type !== "null");
      nullable = nonNull.length < members.length;
      inner = nonNull.length === 1 ? { ...nonNull[0], ...spec, anyOf: undefined } : { ...spec, type: "json" };
    }
    if ("const" in inner) return null;
    const loc = this.loc(path);
    const id = `sf-${loc.replace(/[^A-Za-z0-9_-]/g, "-")}`;
    // No default and not required: the engine makes the default (e.g. an empty list).
    const field = { path, loc, nullable, required, default: "default" in spec ? spec.default : MISSING, section: this.currentSection };
    let input;
    if (Array.isArray(inner.enum) || (inner.type === "boolean" && nullable)) {
      input = this.enumInput(field, inner.enum || [true, false]);
    } else if (inner.type === "boolean") {
      input = el("input", { type: "checkbox" });
      field.read = () => input.checked;
      field.write = (value) => { input.checked = value === MISSING ? false : Boolean(value); };
    } else if (inner.type === "integer" || inner.type === "number") {
      input = el("input", { type: "text", inputmode: inner.type === "integer" ? "numeric" : "decimal", spellcheck: "false" });
      field.read = () => {
        const text = input.value.trim();
        if (text === "") return nullable ? null : MISSING;
        return NUMBER_TEXT.test(text) ? Number(text) : text;
      };
      field.write = (value) => { input.value = value === MISSING || value === null || value === undefined ? "" : String(value); };
    } else if (inner.type === "string") {
      input = el("input", { type: "text", spellcheck: "false" });
      field.read = () => {
        if (input.value !== "") return input.value;
        if (nullable) return null;
        return field.default === "" ? "" : MISSING;
      };
      field.write = (value) => { input.value = value === MISSING || value === null || value === undefined ? "" : String(value); };
    } else {
      // Lists, tuples, free-form mappings: JSON text.
      input = el("input", { type: "text", class: "code", spellcheck: "false" });
      field.read = () => {
        const text = input.value.trim();
        if (text === "") return nullable ? null : MISSING;
        try { return JSON.parse(text); } catch { return text; }
      };
      field.write = (value) => {
        input.value = value === MISSING || value === undefined || (value === null && nullable) ? "" : JSON.stringify(value);
      };
    }
    input.id = id;
    input.name = loc;
    if (input.tagName === "INPUT" && input.type === "text") {
      input.placeholder = nullable ? "empty" : field.required ? "required" : "";
    }
    const listen = () => { this.refreshChanged(); this.onChange(field); };
    input.addEventListener("input", listen);
    input.addEventListener("change", listen);
    field.input = input;
    field.errorNode = el("div", { class: "field-error", hidden: true });
    const kind = inner.type === "json" || (!inner.type && !inner.enum) || ["array", "object"].includes(inner.type) ? " (JSON)" : "";
    const help = [spec.description, constraintText(inner), defaultText(field) + kind].filter(Boolean).join(" · ");
    const checkbox = input.type === "checkbox";
    field.node = el(
      "div",
      { class: `sf-field${checkbox ? " sf-check" : ""}`, "data-loc": loc },
      checkbox ? el("label", { for: id }, input, " ", path[path.length - 1]) : el("label", { for: id }, path[path.length - 1]),
      checkbox ? null : input,
      el("div", { class: "sf-help muted" }, help),
      field.errorNode,
    );
    this.fields.push(field);
    if (this.currentSection) this.currentSection.fields.push(field);
    return field.node;
  }

  enumInput(field, values) {
    const select = el("select");
    let options = [];
    const fill = (extraValue) => {
      options = [...values];
      if (extraValue !== undefined) options.push(extraValue);
      select.replaceChildren(
        field.nullable ? el("option", { value: "" }, "(empty)") : null,
        ...options.map((value, i) => el(
          "option", { value: String(i) },
          i >= values.length ? `${JSON.stringify(value)} (not allowed)` : typeof value === "string" ? value : JSON.stringify(value),
        )),
      );
    };
    fill();
    field.read = () => {
      if (select.value === "") return field.nullable ? null : MISSING;
      return options[Number(select.value)];
    };
    field.write = (value) => {
      if (value === MISSING || value === null || value === undefined) {
        fill();
        select.value = field.nullable ? "" : "0";
        return;
      }
      const index = values.findIndex((option) => same(option, value));
      // A value the schema does not allow (from YAML) stays visible, so its error has a place.
      fill(index < 0 ? value : undefined);
      select.value = String(index < 0 ? values.length : index);
    };
    return select;
  }

  values() {
    const out = {};
    for (const field of this.fields) {
      const value = field.read();
      if (value === MISSING) continue;
      if (field.default !== MISSING && same(value, field.default)) continue;
      setAt(out, field.path, value);
    }
    return mergeDeep(out, this.extra);
  }

  setValues(config) {
    const rest = structuredClone(isObject(config) ? config : {});
    for (const field of this.fields) {
      const [found, value] = takeAt(rest, field.path);
      field.write(found ? value : field.default);
    }
    this.extra = withoutEmptyObjects(rest);
    this.refreshChanged();
  }

  // Keys of the last loaded config that no field shows (sent back as they are).
  extraKeys() {
    const keys = [];
    const walk = (value, prefix) => {
      for (const [key, item] of Object.entries(value)) {
        const loc = prefix ? `${prefix}.${key}` : key;
        if (isObject(item) && this.groups.has(this.loc(loc.split(".")))) walk(item, loc);
        else keys.push(loc);
      }
    };
    walk(this.extra, "");
    return keys;
  }

  refreshChanged() {
    for (const field of this.fields) {
      const value = field.read();
      const changed = value !== MISSING && !(field.default !== MISSING && same(value, field.default));
      field.node.classList.toggle("sf-changed", changed);
    }
    for (const section of this.sections) {
      const count = section.fields.filter((field) => field.node.classList.contains("sf-changed")).length;
      section.badge.textContent = count ? `${count} changed` : "";
    }
  }

  clearErrors() {
    clearFieldErrors(this.node);
  }

  // Where an error about `loc` goes: its field, or the group or section of that loc; null when neither.
  errorTarget(loc) {
    const field = this.fields.find((candidate) => candidate.loc === loc);
    const group = field ? null : this.groups.get(loc);
    if (!field && !group) return null;
    const section = field ? field.section : group.section;
    return {
      node: field ? field.errorNode : group.errorNode,
      owner: field ? field.node : null,
      reveal: () => { if (section) section.details.open = true; },
    };
  }

  // Each error goes to the field its loc names, or to the closest enclosing field or section
  // (a list item's error to the list, an unknown key's to its section); the rest is returned.
  showErrors(errors) {
    this.clearErrors();
    return placeFieldErrors(errors, (prefix) => this.errorTarget(prefix));
  }
}
