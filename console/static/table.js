// A table: schema, partitioning, sort order, properties, snapshots and refs, maintenance, metadata log.
// A view: its versions and their SQL.

import { catalogPath, get } from "./api.js";
import { bounded, clear, dateTimeOf, h, keyValues, link, pathBelow, section } from "./dom.js";
import { splitNamespace } from "./catalog.js";
import { redrawOnCommit } from "./live.js";

function typeName(type) {
  if (typeof type === "string") return type;
  if (type.type === "list") return `list<${typeName(type.element)}>`;
  if (type.type === "map") return `map<${typeName(type.key)}, ${typeName(type.value)}>`;
  return "struct";
}

// One row per field, nested fields indented under their parent (struct fields, list elements,
// map keys and values), each with its field id.
function fieldRows(fields, depth = 0) {
  return fields.flatMap((f) => fieldRow(f.id, f.name, f.type, f.required, f.doc, depth));
}

function fieldRow(id, name, type, required, doc, depth) {
  const rows = [
    h(
      "tr",
      { "data-field-id": id },
      h("td", { class: "num" }, id),
      h("td", { class: "depth-" + Math.min(depth, 6) }, name),
      h("td", { class: "type" }, typeName(type)),
      h("td", {}, required ? "required" : "optional"),
      h("td", { class: "doc" }, doc || ""),
    ),
  ];
  if (type.type === "struct") rows.push(...fieldRows(type.fields, depth + 1));
  if (type.type === "list") rows.push(...fieldRow(type["element-id"], "element", type.element, type["element-required"], "", depth + 1));
  if (type.type === "map") {
    rows.push(...fieldRow(type["key-id"], "key", type.key, true, "", depth + 1));
    rows.push(...fieldRow(type["value-id"], "value", type.value, type["value-required"], "", depth + 1));
  }
  return rows;
}

function schemaTable(schema) {
  const names = fieldNames(schema);
  const identifiers = (schema["identifier-field-ids"] || []).map((id) => names.get(id) ?? id);
  const table = h(
    "table",
    { class: "schema", "data-schema-id": schema["schema-id"] },
    h("thead", {}, h("tr", {}, ["id", "name", "type", "nullability", "doc"].map((c) => h("th", {}, c)))),
    h("tbody", {}, fieldRows(schema.fields)),
  );
  const note = identifiers.length ? h("p", { class: "muted" }, `identifier fields: ${identifiers.join(", ")}`) : null;
  return [table, note];
}

function fieldNames(schema) {
  const names = new Map();
  const walk = (fields, prefix) => {
    for (const field of fields) {
      names.set(field.id, prefix + field.name);
      if (typeof field.type === "object" && field.type.type === "struct") walk(field.type.fields, prefix + field.name + ".");
    }
  };
  walk(schema.fields, "");
  return names;
}

function partitioning(metadata, names) {
  const spec = (metadata["partition-specs"] || []).find((s) => s["spec-id"] === metadata["default-spec-id"]);
  if (!spec || !spec.fields.length) return h("p", { class: "muted" }, "unpartitioned");
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, ["field id", "name", "source", "transform"].map((c) => h("th", {}, c)))),
    h("tbody", {}, spec.fields.map((f) => h("tr", {}, h("td", { class: "num" }, f["field-id"]), h("td", {}, f.name), h("td", {}, names.get(f["source-id"]) ?? f["source-id"]), h("td", {}, f.transform)))),
  );
}

function sortOrder(metadata, names) {
  const order = (metadata["sort-orders"] || []).find((o) => o["order-id"] === metadata["default-sort-order-id"]);
  if (!order || !order.fields.length) return h("p", { class: "muted" }, "unsorted");
  return h(
    "ol",
    {},
    order.fields.map((f) => h("li", {}, `${names.get(f["source-id"]) ?? f["source-id"]} ${f.transform === "identity" ? "" : f.transform + " "}${f.direction} ${f["null-order"].replace("-", " ")}`)),
  );
}

const SHOWN = 10; // snapshots and metadata files shown at first, newest first; "show more" adds more
const SUMMARY_SHOWN = ["added-records", "deleted-records", "added-data-files", "deleted-data-files", "total-records", "total-data-files"];

function timeline(metadata, limit) {
  const refs = new Map();
  for (const [name, ref] of Object.entries(metadata.refs || {})) {
    if (!refs.has(ref["snapshot-id"])) refs.set(ref["snapshot-id"], []);
    refs.get(ref["snapshot-id"]).push(h("span", { class: "ref ref-" + ref.type }, name));
  }
  const snapshots = [...(metadata.snapshots || [])].sort((a, b) => b["timestamp-ms"] - a["timestamp-ms"]);
  if (!snapshots.length) return h("p", { class: "muted" }, "no snapshots");
  const entry = (s) => {
    const summary = s.summary || {};
    const shown = SUMMARY_SHOWN.filter((k) => k in summary).map((k) => `${k} ${summary[k]}`);
    const parent = s["parent-snapshot-id"];
    // A stale append the catalog made again on the branch's head (docs/commits.md).
    const rebased = summary["isbre.rebased-from-parent"];
    return h(
      "li",
      { "data-snapshot-id": s["snapshot-id"], class: s["snapshot-id"] === metadata["current-snapshot-id"] ? "current" : "" },
      h("div", { class: "when" }, dateTimeOf(s["timestamp-ms"]), s["sequence-number"] === undefined ? null : ` · sequence ${s["sequence-number"]}`),
      h("div", {}, h("strong", {}, summary.operation || "snapshot"), " ", h("code", { class: "snapshot-id" }, s["snapshot-id"]), " ", refs.get(s["snapshot-id"]) || []),
      parent === undefined || parent === null ? null : h("div", { class: "muted" }, "parent ", h("code", { class: "parent-id" }, parent)),
      rebased === undefined ? null : h("div", { class: "rebased" }, "rebased by the catalog: its writer made it on ", rebased === "null" ? "an empty table" : h("code", { class: "rebased-from" }, rebased)),
      h("div", { class: "muted" }, shown.join(" · ")),
    );
  };
  return bounded("ol", { class: "timeline" }, snapshots, entry, limit);
}

function metadataLog(metadata, limit) {
  const entries = [...(metadata["metadata-log"] || [])].reverse();
  if (!entries.length) return h("p", { class: "muted" }, "no earlier metadata files");
  return bounded("ol", { class: "mono files" }, entries, (e) => h("li", {}, `${dateTimeOf(e["timestamp-ms"])}  `, pathBelow(metadata.location, e["metadata-file"])), limit);
}

function facts(metadata, location) {
  const rows = [
    ["format-version", metadata["format-version"]],
    ["table-uuid", metadata["table-uuid"]],
    ["location", h("code", { class: "path" }, metadata.location)],
    ["metadata-location", pathBelow(metadata.location, location)],
    ["last-sequence-number", metadata["last-sequence-number"]],
  ].filter(([, value]) => value !== undefined && value !== null);
  return h("table", { class: "kv" }, h("tbody", {}, rows.map(([key, value]) => h("tr", {}, h("th", {}, key), h("td", {}, value)))));
}

// What the catalog's maintenance sees in the table (GET …/maintenance, docs/maintenance.md).
function maintenance(status) {
  const kib = (bytes) => `${(bytes / 1024).toFixed(1)} KiB`;
  const last = status["last-maintenance-at"];
  const rows = [
    ["maintained by the catalog", status.maintained ? "yes" : "no"],
    ["snapshots", status.snapshots],
    ["metadata file", kib(status["metadata-file-bytes"])],
    ["metadata log entries", status["metadata-log-entries"]],
    ["data files", status["data-files"]],
    ["average data file", kib(status["average-data-file-bytes"])],
    ["due now", status.due.length ? status.due.join(", ") : "nothing"],
    ["last maintenance here", last ? dateTimeOf(last * 1000) : "not yet"],
  ];
  return h("table", { class: "kv maintenance" }, h("tbody", {}, rows.map(([key, value]) => h("tr", {}, h("th", {}, key), h("td", {}, value)))));
}

// The table's named consumers and how far behind each is (GET …/consumers, docs/feeds.md).
function consumers(found) {
  if (!found.length) return h("p", { class: "muted" }, "no consumer keeps a cursor here");
  const row = (c) =>
    h(
      "tr",
      { "data-consumer": c.name },
      h("td", {}, c.name),
      h("td", { class: "num" }, c["commit-seq"]),
      h("td", { class: "num" }, c.behind.commits),
      h("td", { class: "num" }, c.behind.rows),
      h("td", {}, c.expired ? "expired: must resync" : "live"),
    );
  const heads = ["consumer", "at commit", "commits behind", "rows behind", "state"];
  return h("table", { class: "consumers" }, h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))), h("tbody", {}, found.map(row)));
}

function header(kind, warehouse, namespace, name, extra = []) {
  return [
    h("nav", { class: "crumbs" }, link(warehouse, "catalog", warehouse), " . ", link(namespace.join("."), "namespace", warehouse, namespace.join("\x1f")), " . ", kind),
    h("h1", {}, name),
    ...(extra.length ? [h("nav", { class: "tabs" }, extra)] : []),
  ];
}

export async function tablePage(main, [warehouse, joined, name], shell) {
  const namespace = splitNamespace(joined);
  const content = h("div", {});
  const nsKey = namespace.join("\x1f");
  const snapshotsShown = { count: SHOWN };
  const filesShown = { count: SHOWN };
  main.append(...header("table", warehouse, namespace, name, [link("Lineage", "lineage", warehouse, nsKey, name), link("Coverage", "coverage", warehouse, nsKey, name)]), content);
  const draw = async () => {
    const [{ metadata, "metadata-location": location }, status, { consumers: readers }] = await Promise.all([
      get(catalogPath(warehouse, namespace, "tables", name)),
      get(catalogPath(warehouse, namespace, "tables", name, "maintenance")),
      get(catalogPath(warehouse, namespace, "tables", name, "consumers")),
    ]);
    const schema = metadata.schemas.find((s) => s["schema-id"] === metadata["current-schema-id"]);
    const names = fieldNames(schema);
    clear(content).append(
      section("Schema", ...schemaTable(schema)),
      h("div", { class: "columns" }, section("Partition spec", partitioning(metadata, names)), section("Sort order", sortOrder(metadata, names))),
      section("Snapshots and refs", timeline(metadata, snapshotsShown)),
      section("Properties", keyValues(metadata.properties)),
      section("Maintenance", maintenance(status)),
      section("Consumers", consumers(readers)),
      section("Metadata", facts(metadata, location), h("h3", {}, "Metadata log"), metadataLog(metadata, filesShown)),
    );
  };
  return redrawOnCommit(shell, { warehouse, tables: [[...namespace, name].join(".")] }, draw);
}

export async function viewPage(main, [warehouse, joined, name], shell) {
  const namespace = splitNamespace(joined);
  const content = h("div", {});
  main.append(...header("view", warehouse, namespace, name), content);
  const draw = async () => {
    const { metadata } = await get(catalogPath(warehouse, namespace, "views", name));
    const versions = [...metadata.versions].sort((a, b) => b["version-id"] - a["version-id"]);
    const schemas = new Map(metadata.schemas.map((s) => [s["schema-id"], s]));
    const current = versions.find((v) => v["version-id"] === metadata["current-version-id"]);
    clear(content).append(
      section("Schema", ...schemaTable(schemas.get(current["schema-id"]))),
      section(
        "Versions",
        h(
          "ol",
          { class: "timeline" },
          versions.map((v) =>
            h(
              "li",
              { class: v === current ? "current" : "", "data-version-id": v["version-id"] },
              h("div", { class: "when" }, `version ${v["version-id"]} · ${dateTimeOf(v["timestamp-ms"])}`),
              v.representations.map((r) => h("div", {}, h("span", { class: "muted" }, r.dialect || r.type), h("pre", { class: "sql" }, r.sql))),
            ),
          ),
        ),
      ),
      section("Properties", keyValues(metadata.properties)),
    );
  };
  return redrawOnCommit(shell, { warehouse, tables: [[...namespace, name].join(".")] }, draw);
}
