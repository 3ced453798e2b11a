// A table's lineage: the datasets its writers declared as inputs (snapshot properties
// isbre.lineage.*), the tables of this catalog that declare it as theirs, and the outbox.

import { catalogPath, get, listAll } from "./api.js";
import { clear, h, report, route, section, svg } from "./dom.js";
import { allNamespaces, splitNamespace, unlessForbidden } from "./catalog.js";
import { redrawOnCommit } from "./live.js";

const SCANNED_TABLES = 200; // most tables read to find downstream ones
const RESCAN_MS = 30_000; // the scan is repeated on a redraw only when older than this

function parsed(summary, key) {
  try {
    return summary && key in summary ? JSON.parse(summary[key]) : null;
  } catch {
    return null; // the lineage outbox reports malformed declarations (mapping_errors)
  }
}

// A declared input: "ns.table" is a table of this catalog; {namespace, name} any dataset.
function dataset(declared, warehouse) {
  if (typeof declared === "string") {
    const parts = declared.split(".");
    return { key: `table:${declared}`, label: declared, href: route("table", warehouse, parts.slice(0, -1).join("\x1f"), parts[parts.length - 1]) };
  }
  if (declared && typeof declared.namespace === "string" && typeof declared.name === "string") {
    return { key: `dataset:${declared.namespace}/${declared.name}`, label: declared.name, note: declared.namespace };
  }
  return null;
}

export function declaredLineage(metadata, warehouse) {
  const inputs = new Map();
  const jobs = new Set();
  let columns = null;
  const snapshots = [...(metadata.snapshots || [])].sort((a, b) => a["timestamp-ms"] - b["timestamp-ms"]);
  for (const snapshot of snapshots) {
    const summary = snapshot.summary || {};
    const declared = parsed(summary, "isbre.lineage.inputs");
    if (Array.isArray(declared)) {
      for (const item of declared) {
        const found = dataset(item, warehouse);
        if (found) inputs.set(found.key, { ...found, last: snapshot["timestamp-ms"] });
      }
    }
    if (summary["isbre.lineage.job"]) jobs.add(summary["isbre.lineage.job"]);
    columns = parsed(summary, "isbre.lineage.column-lineage") || columns;
  }
  return { inputs: [...inputs.values()], jobs: [...jobs], columns };
}

// Tables of this warehouse (those the caller may read) that declare `name` as an input.
async function downstream(warehouse, name) {
  const tables = [];
  for (const namespace of (await allNamespaces(warehouse)).found) {
    tables.push(...(await unlessForbidden(listAll(catalogPath(warehouse, namespace, "tables"), "identifiers"), [])));
  }
  const scanned = tables.slice(0, SCANNED_TABLES);
  const found = [];
  for (const ident of scanned) {
    const loaded = await unlessForbidden(get(catalogPath(warehouse, ident.namespace, "tables", ident.name)), null);
    if (!loaded) continue;
    const { inputs } = declaredLineage(loaded.metadata, warehouse);
    if (inputs.some((input) => input.key === `table:${name}`)) {
      const label = [...ident.namespace, ident.name].join(".");
      found.push({ key: `table:${label}`, label, href: route("table", warehouse, ident.namespace.join("\x1f"), ident.name) });
    }
  }
  return { found, scanned: scanned.length, total: tables.length };
}

function node(item, x, y, kind) {
  const box = svg(
    "g",
    { class: "node node-" + kind, "data-dataset": item.label },
    svg("rect", { x, y, width: 220, height: 40, rx: 6 }),
    svg("text", { x: x + 10, y: y + 17 }, item.label),
    item.note ? svg("text", { x: x + 10, y: y + 32, class: "note" }, item.note) : null,
  );
  return item.href ? svg("a", { href: item.href }, box) : box;
}

export function graph(inputs, center, outputs) {
  const rows = Math.max(inputs.length, outputs.length, 1);
  const height = rows * 56 + 16;
  const middle = height / 2 - 20;
  const place = (i, count) => height / 2 - (count * 56 - 16) / 2 + i * 56;
  const edges = [];
  const nodes = [node(center, 300, middle, "self")];
  inputs.forEach((item, i) => {
    const y = place(i, inputs.length);
    nodes.push(node(item, 10, y, "input"));
    edges.push(svg("path", { d: `M230 ${y + 20} C265 ${y + 20} 265 ${middle + 20} 300 ${middle + 20}` }));
  });
  outputs.forEach((item, i) => {
    const y = place(i, outputs.length);
    nodes.push(node(item, 590, y, "output"));
    edges.push(svg("path", { d: `M520 ${middle + 20} C555 ${middle + 20} 555 ${y + 20} 590 ${y + 20}` }));
  });
  return svg("svg", { class: "graph", width: 820, height, viewBox: `0 0 820 ${height}`, role: "img", "aria-label": "lineage graph" }, svg("g", { class: "edges" }, edges), nodes);
}

// A declared source column: {table, field} is a column of a table of this catalog (linked to it);
// {namespace, name, field} a column of any dataset. Anything else is left out (the lineage
// outbox reports it).
function columnSource(source, warehouse) {
  if (!source || typeof source.field !== "string") return null;
  if (typeof source.table === "string") {
    const table = dataset(source.table, warehouse);
    return h("a", { href: table.href }, `${source.table}.${source.field}`);
  }
  if (typeof source.namespace === "string" && typeof source.name === "string") {
    return `${source.namespace}/${source.name}.${source.field}`;
  }
  return null;
}

function columnLineage(columns, warehouse) {
  if (!columns) return h("p", { class: "muted" }, "none declared");
  const sources = (declared) =>
    (Array.isArray(declared) ? declared : [])
      .map((source) => columnSource(source, warehouse))
      .filter((source) => source !== null)
      .flatMap((source, i) => (i ? [", ", source] : [source]));
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, h("th", {}, "column"), h("th", {}, "from"))),
    h("tbody", {}, Object.entries(columns).map(([column, declared]) => h("tr", {}, h("td", {}, column), h("td", {}, sources(declared))))),
  );
}

async function outbox() {
  const status = await get("/v1/lineage/status");
  if (!status.enabled) return h("p", { class: "muted" }, "Lineage is off on this server: no OpenLineage transport is configured.");
  const { enabled, ...shown } = status;
  return report(shown);
}

export async function lineagePage(main, [warehouse, joined, name], shell) {
  const namespace = splitNamespace(joined);
  const full = [...namespace, name].join(".");
  const content = h("div", {});
  const delivery = h("div", {});
  main.append(h("nav", { class: "crumbs" }, h("a", { href: route("table", warehouse, joined, name) }, full), " . lineage"), h("h1", {}, `Lineage of ${full}`), content, section("Lineage outbox", delivery));
  const drawStatus = async () => clear(delivery).append(...[await outbox()].flat().filter(Boolean));
  let below = null;
  let scannedAt = 0; // the downstream scan reads every table: not on every commit
  const draw = async () => {
    const { metadata } = await get(catalogPath(warehouse, namespace, "tables", name));
    const declared = declaredLineage(metadata, warehouse);
    if (below === null || performance.now() - scannedAt > RESCAN_MS) {
      below = await downstream(warehouse, full);
      scannedAt = performance.now();
    }
    const scanned = below.total > below.scanned ? `downstream found among the first ${below.scanned} of ${below.total} tables` : `downstream found among all ${below.total} tables you may read`;
    clear(content).append(
      section(
        "Graph",
        graph(declared.inputs, { label: full }, below.found),
        h("p", { class: "muted" }, `${declared.inputs.length} declared inputs · ${scanned}`),
        declared.jobs.length ? h("p", {}, "Jobs: ", declared.jobs.join(", ")) : null,
      ),
      section("Column lineage (latest declared)", columnLineage(declared.columns, warehouse)),
    );
    await drawStatus();
  };
  const stop = await redrawOnCommit(shell, { warehouse, tables: [full] }, draw);
  const ticker = setInterval(() => drawStatus().catch(shell.failed), 3000);
  return () => {
    clearInterval(ticker);
    stop();
  };
}
