// Building the page without HTML strings: every name from the catalog becomes a text node,
// so a table called "<img src=x onerror=alert(1)>" shows as those characters.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(element, attributes, children) {
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      element.addEventListener(key.slice(2), value);
    } else {
      element.setAttribute(key, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

export function h(tag, attributes, ...children) {
  return fill(document.createElement(tag), attributes, children);
}

export function svg(tag, attributes, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attributes, children);
}

export function clear(element) {
  element.replaceChildren();
  return element;
}

// A link inside the console: hash routes, their parts percent-encoded.
export function route(...parts) {
  return "#/" + parts.map((part) => encodeURIComponent(part)).join("/");
}

export function link(text, ...parts) {
  return h("a", { href: route(...parts) }, text);
}

export function timeOf(microseconds) {
  const date = new Date(microseconds / 1000);
  return date.toLocaleTimeString(undefined, { hour12: false }) + "." + String(date.getMilliseconds()).padStart(3, "0");
}

export function dateTimeOf(milliseconds) {
  return new Date(milliseconds).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function status(text) {
  return h("span", { class: "status status-" + String(text).toLowerCase() }, text);
}

// JSON as text, with the BigInt ids that api.js reads kept exact.
export function jsonText(value) {
  return JSON.stringify(value, (key, inner) => (typeof inner === "bigint" ? inner.toString() : inner));
}

// A two-column table of a plain object's entries (properties, summaries).
export function keyValues(object, empty = "none") {
  const entries = Object.entries(object || {}).sort(([a], [b]) => a.localeCompare(b));
  if (!entries.length) return h("p", { class: "muted" }, empty);
  return h(
    "table",
    { class: "kv" },
    h("tbody", {}, entries.map(([key, value]) => h("tr", {}, h("th", {}, key), h("td", {}, typeof value === "object" ? jsonText(value) : value)))),
  );
}

const absent = (value) => value === null || value === undefined || (Array.isArray(value) && !value.length) || value === "";

// Values in a report that say something is wrong, whatever the component.
function wrong(key, value) {
  if (["last_error", "recent_failures", "error", "errors"].includes(key)) return true;
  return ["failures", "mapping_errors", "failed"].includes(key) && Number(value) > 0;
}

function reported(key, value) {
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (key.endsWith("_at") && typeof value === "number") return dateTimeOf(value * 1000); // Unix seconds
  if (Array.isArray(value)) return h("ol", { class: "mono" }, value.map((item) => h("li", {}, typeof item === "object" ? jsonText(item) : item)));
  return String(value);
}

// A status report (/health, the lineage outbox): each component under its name with its status
// as a badge, what is wrong in red, and nothing shown for what is not there (null, empty lists).
export function report(object) {
  const items = [];
  for (const [key, value] of Object.entries(object || {})) {
    if (key === "status" || absent(value)) continue;
    if (typeof value === "object" && !Array.isArray(value)) {
      const problem = value.status && value.status !== "ok";
      items.push(h("li", { "data-component": key, class: problem ? "component problem" : "component" }, h("span", { class: "key" }, key), " ", value.status ? status(value.status) : null, report(value)));
    } else {
      items.push(h("li", { "data-field": key, class: wrong(key, value) ? "wrong" : "" }, h("span", { class: "key" }, key.replaceAll("_", " ")), " ", reported(key, value)));
    }
  }
  return h("ul", { class: "report" }, items);
}

// The first `limit.count` of `items` and a button for `step` more; `limit` is the page's, so a
// redraw keeps what the reader opened.
export function bounded(tag, attributes, items, render, limit, step = 20) {
  const list = h(tag, attributes, items.slice(0, limit.count).map(render));
  const left = items.length - limit.count;
  if (left <= 0) return list;
  const more = h("button", { type: "button", class: "more" }, `show ${Math.min(step, left)} more`);
  const box = h("div", {}, list, h("p", { class: "muted" }, `${left} older not shown `, more));
  more.addEventListener("click", () => {
    limit.count += step;
    box.replaceWith(bounded(tag, attributes, items, render, limit, step));
  });
  return box;
}

// A file of a table as the part below the table's location; the whole URI on hover.
export function pathBelow(location, path) {
  const base = location.endsWith("/") ? location : location + "/";
  const shown = path.startsWith(base) ? path.slice(base.length) : path;
  return h("code", { class: "path", title: path, "data-path": path }, shown);
}

export function section(title, ...content) {
  return h("section", { class: "card" }, h("h2", {}, title), ...content);
}

// A line of values over time as a small SVG (rate sparklines).
export function sparkline(values, width = 240, height = 36) {
  if (values.length < 2) values = [values[0] ?? 0, values[0] ?? 0]; // a line needs two points
  const top = Math.max(1, ...values);
  const step = values.length > 1 ? width / (values.length - 1) : width;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(height - 2 - (v / top) * (height - 4)).toFixed(1)}`);
  return svg(
    "svg",
    { class: "sparkline", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `peak ${top}` },
    svg("polyline", { points: points.join(" "), fill: "none" }),
  );
}
