// Warehouses and namespaces: what each holds, with its properties.

import { ApiError, catalogPath, get, listAll, warehouseNames } from "./api.js";
import { clear, h, keyValues, link, section } from "./dom.js";
import { redrawOnCommit } from "./live.js";

const SHOWN_NAMESPACES = 500; // on the catalog page, per warehouse

export function splitNamespace(joined) {
  return joined ? joined.split("\x1f") : [];
}

function namespaceLink(warehouse, namespace) {
  return link(namespace.join("."), "namespace", warehouse, namespace.join("\x1f"));
}

function breadcrumbs(warehouse, namespace) {
  const parts = [link(warehouse, "catalog", warehouse)];
  namespace.forEach((level, i) => parts.push(" . ", link(level, "namespace", warehouse, namespace.slice(0, i + 1).join("\x1f"))));
  return h("nav", { class: "crumbs" }, parts);
}

function list(items, empty) {
  return items.length ? h("ul", { class: "list" }, items.map((item) => h("li", {}, item))) : h("p", { class: "muted" }, empty);
}

// A namespace on the way to a scoped reader's own is listed, but not readable: say so, draw the rest.
export async function unlessForbidden(promise, fallback) {
  try {
    return await promise;
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) return fallback;
    throw error;
  }
}

async function children(warehouse, namespace) {
  const parent = namespace.length ? `?parent=${encodeURIComponent(namespace.join("\x1f"))}` : "";
  return listAll(catalogPath(warehouse) + parent, "namespaces");
}

// Every namespace of a warehouse the caller may list, level by level, up to `most`;
// `complete` says whether all were read.
export async function allNamespaces(warehouse, most = Infinity) {
  const found = [];
  const queue = [[]];
  while (queue.length && found.length < most) {
    const nested = await children(warehouse, queue.shift());
    found.push(...nested);
    queue.push(...nested);
  }
  return { found: found.slice(0, most), complete: !queue.length && found.length <= most };
}

// Nested lists: each namespace under its parent.
function namespaceTree(warehouse, namespaces) {
  const below = new Map();
  for (const ns of namespaces) {
    const parent = ns.slice(0, -1).join("\x1f");
    if (!below.has(parent)) below.set(parent, []);
    below.get(parent).push(ns);
  }
  const level = (parent) => {
    const here = below.get(parent.join("\x1f")) || [];
    if (!here.length) return null;
    return h("ul", { class: "tree" }, here.map((ns) => h("li", {}, link(ns[ns.length - 1], "namespace", warehouse, ns.join("\x1f")), level(ns))));
  };
  return level([]) || h("p", { class: "muted" }, "no namespaces");
}

export async function catalogPage(main, params, shell) {
  const names = params[0] ? [params[0]] : await warehouseNames();
  const content = h("div", {});
  main.append(h("h1", {}, "Catalog"), content);
  const draw = async () => {
    const cards = [];
    for (const warehouse of names) {
      const { found, complete } = await allNamespaces(warehouse, SHOWN_NAMESPACES);
      const note = complete ? null : h("p", { class: "muted" }, `the first ${SHOWN_NAMESPACES} namespaces, level by level; open one to see what is under it`);
      cards.push(section(h("span", {}, "Warehouse ", link(warehouse, "catalog", warehouse)), namespaceTree(warehouse, found), note));
    }
    clear(content).append(...cards);
  };
  const kinds = ["namespace.create", "namespace.drop"];
  return redrawOnCommit(shell, names.map((warehouse) => ({ warehouse, kinds })), draw);
}

export async function namespacePage(main, [warehouse, joined], shell) {
  const namespace = splitNamespace(joined);
  const content = h("div", {});
  main.append(breadcrumbs(warehouse, namespace), h("h1", {}, namespace.join(".")), content);
  const draw = async () => {
    const [loaded, nested, tables, views] = await Promise.all([
      unlessForbidden(get(catalogPath(warehouse, namespace)), null),
      children(warehouse, namespace),
      unlessForbidden(listAll(catalogPath(warehouse, namespace, "tables"), "identifiers"), []),
      unlessForbidden(listAll(catalogPath(warehouse, namespace, "views"), "identifiers"), []),
    ]);
    const object = (page) => (ident) => link(ident.name, page, warehouse, ident.namespace.join("\x1f"), ident.name);
    clear(content).append(
      section("Properties", loaded ? keyValues(loaded.properties) : h("p", { class: "muted" }, "outside your scopes")),
      section("Namespaces", list(nested.map((ns) => namespaceLink(warehouse, ns)), "none")),
      section("Tables", list(tables.map(object("table")), "none")),
      section("Views", list(views.map(object("view")), "none")),
    );
  };
  return redrawOnCommit(shell, { warehouse, namespace: namespace.join("\x1f") }, draw);
}
