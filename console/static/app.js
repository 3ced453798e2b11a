// The console's shell: sign-in when the server asks for it, the hash router, the connection state.

import { ApiError, exactIds, get, session, signIn } from "./api.js";
import { clear, h } from "./dom.js";
import { catalogPage, namespacePage } from "./catalog.js";
import { coveragePage } from "./coverage.js";
import { feedPage } from "./feed.js";
import { lineagePage } from "./lineage.js";
import { operationsPage } from "./operations.js";
import { tablePage, viewPage } from "./table.js";

const pages = {
  feed: feedPage,
  catalog: catalogPage,
  namespace: namespacePage,
  table: tablePage,
  view: viewPage,
  lineage: lineagePage,
  coverage: coveragePage,
  operations: operationsPage,
};

const main = document.getElementById("view");
const connection = document.getElementById("connection");
let dispose = () => {};

// What every page is given: where to draw, and how to report its event stream's state.
const shell = {
  connection(state, detail = "") {
    connection.textContent = state;
    connection.className = "connection connection-" + state;
    connection.title = detail || "event stream: " + state;
  },
  failed(error) {
    main.append(h("p", { class: "error", role: "alert" }, error instanceof ApiError ? `${error.type}: ${error.message}` : String(error)));
  },
};

function signInForm(reason) {
  dispose();
  dispose = () => {};
  shell.connection("idle");
  const id = h("input", { name: "client_id", autocomplete: "username", required: true });
  const secret = h("input", { name: "client_secret", type: "password", autocomplete: "current-password", required: true });
  const problem = h("p", { class: "error", role: "alert" }, reason || "");
  const form = h(
    "form",
    { class: "card signin" },
    h("h2", {}, "Sign in"),
    h("p", { class: "muted" }, "This catalog needs credentials: a principal's client id and secret, as PyIceberg's credential."),
    h("label", {}, "Client id", id),
    h("label", {}, "Secret", secret),
    h("button", { type: "submit" }, "Sign in"),
    problem,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await signIn(id.value, secret.value);
      await show();
    } catch (error) {
      problem.textContent = error.message;
    }
  });
  clear(main).append(form);
}

async function whoAmI() {
  const who = document.getElementById("who");
  clear(who);
  if (session.token) {
    who.append(h("button", { class: "link", onclick: () => { session.token = null; signInForm("Signed out."); } }, "Sign out"));
  }
}

export function parseRoute(hash) {
  const parts = hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  const [name = "feed", ...params] = parts;
  return { name: pages[name] ? name : "feed", params };
}

async function show() {
  dispose();
  dispose = () => {};
  try {
    // A cheap authenticated call: it says whether the caller must sign in first.
    await get("/v1/warehouses");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return signInForm(session.token ? error.message : "");
    clear(main);
    shell.failed(error);
    return;
  }
  await whoAmI();
  const { name, params } = parseRoute(location.hash);
  for (const anchor of document.querySelectorAll("nav a")) {
    anchor.classList.toggle("active", anchor.dataset.view === name || (anchor.dataset.view === "catalog" && !["feed", "operations"].includes(name)));
  }
  clear(main);
  shell.connection("idle");
  try {
    dispose = (await pages[name](main, params, shell)) || (() => {});
  } catch (error) {
    shell.failed(error);
  }
}

if (!exactIds) {
  const warning = "This browser rounds integers beyond 2^53, so snapshot ids on these pages may be wrong: use Chromium 114, Firefox 135 or later.";
  document.body.insertBefore(h("p", { class: "error banner", role: "alert" }, warning), main);
}
session.onSignedOut = (message) => signInForm(message);
window.addEventListener("hashchange", show);
show();
