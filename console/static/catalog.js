// Warehouses and namespaces: what each holds, with its properties.

import { ApiError, catalogPath, get, listAll } from "./api.js";
import { clear, h, keyValues, link, section } from "./dom.js";
import { warehouseNames } from "./feed.js";
import { redrawOnCommit } from "./live.js";

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

export async function catalogPage(main, params, shell) {
  const names = params[0] ? [params[0]] : await warehouseNames();
  const content = h("div", {});
  main.append(h("h1", {}, "Catalog"), content);
  const draw = async () => {
    const cards = [];
    for (const warehouse of names) {
      const namespaces = await children(warehouse, []);
      cards.push(section(h("span", {}, "Warehouse ", link(warehouse, "catalog", warehouse)), list(namespaces.map((ns) => namespaceLink(warehouse, ns)), "no namespaces")));
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
