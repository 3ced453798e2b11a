// Sink coverage of a table: per source, topic and partition, the offsets its commits hold
// (half-open ranges) and the gaps between them, drawn to one scale per topic.

import { catalogPath, get } from "./api.js";
import { clear, h, route, section, svg } from "./dom.js";
import { splitNamespace } from "./catalog.js";
import { redrawOnCommit } from "./live.js";

const WIDTH = 560;

// Offsets are 64-bit: arithmetic on them is BigInt (api.js reads those beyond 2^53 as BigInt), and
// only a position on the bar is a plain number.
const big = (offset) => BigInt(offset);
const lowest = (values) => values.reduce((a, b) => (b < a ? b : a));
const highest = (values) => values.reduce((a, b) => (b > a ? b : a));

function bar(entry, low, high) {
  const span = Number(high - low) || 1;
  const scale = (offset) => (Number(big(offset) - low) / span) * WIDTH;
  const piece = (kind) => ([start, end]) => svg("rect", { class: kind, x: scale(start).toFixed(1), y: 2, width: Math.max(1, scale(end) - scale(start)).toFixed(1), height: 16 }, svg("title", {}, `${kind} [${start}, ${end})`));
  return svg(
    "svg",
    { class: "coverage", width: WIDTH, height: 20, viewBox: `0 0 ${WIDTH} 20`, role: "img", "aria-label": `partition ${entry.partition}` },
    svg("rect", { class: "track", x: 0, y: 2, width: WIDTH, height: 16 }),
    entry.ranges.map(piece("covered")),
    entry.gaps.map(piece("gap")),
  );
}

export function topics(coverage) {
  const grouped = new Map();
  for (const entry of coverage) {
    const key = `${entry["source-id"]}\x00${entry.topic}`;
    if (!grouped.has(key)) grouped.set(key, { source: entry["source-id"], topic: entry.topic, partitions: [] });
    grouped.get(key).partitions.push(entry);
  }
  return [...grouped.values()];
}

function topicCard({ source, topic, partitions }) {
  const ends = partitions.map((p) => big(p.ranges[p.ranges.length - 1][1]));
  const low = lowest(partitions.map((p) => big(p.ranges[0][0])));
  const high = highest(ends);
  return section(
    h("span", {}, `${source} · ${topic}`),
    h(
      "table",
      { class: "coverage-table" },
      h("thead", {}, h("tr", {}, ["partition", `offsets ${low} to ${high}`, "covered", "gaps", "behind"].map((c) => h("th", {}, c)))),
      h(
        "tbody",
        {},
        partitions.map((p, i) => {
          const covered = p.ranges.reduce((sum, [start, end]) => sum + (big(end) - big(start)), 0n);
          const behind = high - ends[i];
          return h(
            "tr",
            { "data-partition": p.partition, class: behind > 0n || p.gaps.length ? "lagging" : "" },
            h("td", { class: "num" }, p.partition),
            h("td", {}, bar(p, low, high)),
            h("td", { class: "num" }, covered),
            h("td", {}, p.gaps.length ? p.gaps.map(([s, e]) => `[${s}, ${e})`).join(" ") : "none"),
            h("td", { class: "num" }, behind > 0n ? behind : ""),
          );
        }),
      ),
    ),
  );
}

// What the table's sinks did with the rows they were given: `quarantined.dq` is a disposition and a reason.
function rowsCard(rows) {
  const names = Object.keys(rows).sort();
  if (!names.length) return h("p", { class: "muted" }, "No sink has counted rows into this table.");
  return section(
    h("span", {}, "Rows by disposition"),
    h(
      "table",
      { class: "sink-rows" },
      h("thead", {}, h("tr", {}, ["disposition", "reason", "rows"].map((c) => h("th", {}, c)))),
      h(
        "tbody",
        {},
        names.map((name) => {
          const [disposition, reason = ""] = name.split(".");
          return h("tr", { class: disposition === "shed" ? "lagging" : "" }, h("td", {}, disposition), h("td", {}, reason), h("td", { class: "num" }, rows[name]));
        }),
      ),
    ),
  );
}

export async function coveragePage(main, [warehouse, joined, name], shell) {
  const namespace = splitNamespace(joined);
  const full = [...namespace, name].join(".");
  const content = h("div", {});
  main.append(
    h("nav", { class: "crumbs" }, h("a", { href: route("table", warehouse, joined, name) }, full), " . coverage"),
    h("h1", {}, `Sink coverage of ${full}`),
    h("p", { class: "muted" }, "Offsets held by the table, as its sinks declared them. Gaps are offsets no commit holds; 'behind' is how far a partition's last offset trails the topic's furthest partition."),
    content,
  );
  const draw = async () => {
    const { coverage, rows } = await get(catalogPath(warehouse, namespace, "tables", name, "coverage"));
    clear(content).append(
      ...(coverage.length ? topics(coverage).map(topicCard) : [h("p", { class: "muted" }, "No sink has committed offsets to this table.")]),
      rowsCard(rows),
    );
  };
  return redrawOnCommit(shell, { warehouse, tables: [full] }, draw);
}
