// The live commit feed: the event stream rendered as it arrives, at most once per frame.

import { follow, get, warehouseNames } from "./api.js";
import { h, link, sparkline, timeOf } from "./dom.js";

const KINDS = [
  "table.commit",
  "table.create",
  "table.register",
  "table.drop",
  "table.rename",
  "table.purge-incomplete",
  "view.create",
  "view.replace",
  "view.register",
  "view.drop",
  "view.rename",
  "namespace.create",
  "namespace.update",
  "namespace.drop",
];
const COLUMNS = [
  ["seq", "seq"],
  ["time", "time"],
  ["kind", "kind"],
  ["object", "object"],
  ["operation", "operation"],
  ["rows", "rows added"],
  ["files", "files added"],
  ["actor", "actor"],
];
const KEPT_ROWS = 500; // rows kept on the page; older ones leave it (they stay in the log)
const OPENING_ROWS = 50; // the newest commits shown when the page opens or a filter changes
const RATE_SECONDS = 60;
const DRAW_EVERY_MS = 100;

function objectName(record) {
  return [...record.namespace, record.name].filter((part) => part !== null && part !== undefined).join(".");
}

function objectLink(record, warehouse) {
  const name = objectName(record);
  if (!record.name || record.kind.endsWith(".drop")) return name;
  const page = record.kind.startsWith("view.") ? "view" : "table";
  return link(name, page, warehouse, record.namespace.join("\x1f"), record.name);
}

function row(record, warehouse) {
  const summary = record.summary || {};
  return h(
    "tr",
    { "data-seq": record.commit_seq, class: "kind-" + record.kind.split(".")[0] },
    h("td", { class: "num c-seq" }, record.commit_seq),
    h("td", { class: "c-time" }, timeOf(record.ts)),
    h("td", { class: "c-kind" }, record.kind),
    h("td", { class: "c-object" }, objectLink(record, warehouse)),
    h("td", { class: "c-operation" }, record.operation || ""),
    h("td", { class: "num c-rows" }, summary.added_records ?? ""),
    h("td", { class: "num c-files" }, summary.added_data_files ?? ""),
    h("td", { class: "c-actor" }, record.actor || ""),
  );
}

// The newest commits the filters select, and the commit_seq to follow from: the page opens with
// history instead of an empty table, and the stream takes over where it ends.
function recentPath(warehouse, { namespace, tables, kinds }) {
  const query = new URLSearchParams({ limit: String(OPENING_ROWS) });
  if (namespace) query.set("namespace", namespace);
  for (const each of tables) query.append("table", each);
  for (const each of kinds) query.append("kind", each);
  return `/v1/${encodeURIComponent(warehouse)}/events/recent?${query}`;
}

export async function feedPage(main, params, shell) {
  const names = await warehouseNames();
  let warehouse = params[0] && names.includes(params[0]) ? params[0] : names[0];
  let stream = null;
  let paused = false;
  let pending = [];
  let scheduled = false;
  let shown = 0;
  const perSecond = new Map(); // commit second -> commits

  const body = h("tbody", {});
  const count = h("span", { class: "muted" }, "");
  const rate = h("span", { class: "rate" });
  // Each as wide as its hint (a browser's default input is 20 characters).
  const hinted = (name, placeholder) => h("input", { name, placeholder, size: placeholder.length + 2 });
  const namespace = hinted("namespace", "namespace (sales or sales.eu)");
  const table = hinted("table", "table (ns.table)");
  const kind = h("select", { name: "kind" }, h("option", { value: "" }, "every kind"), KINDS.map((k) => h("option", { value: k }, k)));
  const where = h("select", { name: "warehouse" }, names.map((n) => h("option", { value: n, selected: n === warehouse }, n)));
  const pause = h("button", { type: "button", class: "pause" }, "Pause");

  function draw(records) {
    const fragment = document.createDocumentFragment();
    for (let i = records.length - 1; i >= 0; i--) fragment.append(row(records[i], warehouse));
    body.prepend(fragment);
    while (body.childElementCount > KEPT_ROWS) body.lastElementChild.remove();
  }

  function counted(opening) {
    const parts = [];
    if (opening) parts.push(`${opening} recent commits from the log`);
    if (shown) parts.push(`${shown} new since the page opened`);
    const kept = shown + opening > KEPT_ROWS ? ` (the latest ${KEPT_ROWS} shown)` : "";
    count.textContent = (parts.join(", ") || "no commits yet: waiting for the first") + kept;
  }

  function flush() {
    scheduled = false;
    if (!pending.length) return;
    draw(pending);
    shown += pending.length;
    pending = [];
    counted(opened);
    drawRate();
  }

  function receive(records) {
    // Counted when they arrive, by this page's clock: the commits' own times are the server's,
    // whose clock may differ from the browser's by more than the rate's window.
    const second = Math.floor(Date.now() / 1000);
    perSecond.set(second, (perSecond.get(second) || 0) + records.length);
    pending.push(...records);
    if (!scheduled) {
      // Drawn at most ten times a second: each draw moves every row on the screen, and a
      // draw per frame at hundreds of commits a second would cost the page its frame rate.
      scheduled = true;
      setTimeout(() => requestAnimationFrame(flush), DRAW_EVERY_MS);
    }
  }

  function drawRate() {
    // Whole seconds only, the current one still filling: the figure is the line's last point.
    const now = Math.floor(Date.now() / 1000);
    const values = [];
    for (let s = now - RATE_SECONDS; s < now; s++) values.push(perSecond.get(s) || 0);
    for (const second of perSecond.keys()) if (second < now - RATE_SECONDS) perSecond.delete(second);
    rate.dataset.values = JSON.stringify(values);
    const peak = Math.max(...values);
    rate.replaceChildren(sparkline(values), ` ${values[values.length - 1]}/s`, h("span", { class: "muted" }, ` · peak ${peak}/s`));
  }

  function filters() {
    return {
      namespace: namespace.value.trim(),
      tables: table.value.trim() ? [table.value.trim()] : [],
      kinds: kind.value ? [kind.value] : [],
    };
  }

  function open(after) {
    stream = follow({
      warehouse,
      after,
      ...filters(),
      onRecords: receive,
      onState: (state, detail) => shell.connection(paused ? "paused" : state, detail),
    });
  }

  let restarts = 0;
  let opened = 0;
  async function restart() {
    const mine = ++restarts;
    stream?.close();
    const { records, commit_seq } = await get(recentPath(warehouse, filters()));
    if (mine !== restarts) return; // a later change of filters won the race: its stream is the one
    body.replaceChildren();
    pending = [];
    shown = 0;
    opened = records.length;
    draw(records);
    counted(opened);
    if (!paused) open(commit_seq);
    else stream = { close() {}, last: commit_seq };
  }

  pause.addEventListener("click", () => {
    paused = !paused;
    pause.textContent = paused ? "Resume" : "Pause";
    pause.setAttribute("aria-pressed", String(paused));
    if (paused) {
      const last = stream.last;
      stream.close();
      stream = { close() {}, last };
      shell.connection("paused", `paused after commit ${last}`);
    } else {
      open(stream.last);
    }
  });
  for (const input of [namespace, table, kind, where]) {
    input.addEventListener("change", () => {
      warehouse = where.value;
      restart();
    });
  }

  main.append(
    h("h1", {}, "Commits"),
    h("div", { class: "toolbar" }, where, namespace, table, kind, pause, rate),
    count,
    h(
      "table",
      { class: "feed" },
      h("thead", {}, h("tr", {}, COLUMNS.map(([name, label]) => h("th", { class: "c-" + name }, label)))),
      body,
    ),
  );
  drawRate();
  const ticker = setInterval(drawRate, 1000);
  await restart();
  return () => {
    clearInterval(ticker);
    stream?.close();
  };
}
