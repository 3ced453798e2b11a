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

// A two-column table of a plain object's entries (properties, summaries).
export function keyValues(object, empty = "none") {
  const entries = Object.entries(object || {}).sort(([a], [b]) => a.localeCompare(b));
  if (!entries.length) return h("p", { class: "muted" }, empty);
  return h(
    "table",
    { class: "kv" },
    h("tbody", {}, entries.map(([key, value]) => h("tr", {}, h("th", {}, key), h("td", {}, typeof value === "object" ? JSON.stringify(value) : value)))),
  );
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
