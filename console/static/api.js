// isbre's own API, as the signed-in caller: fetch with its bearer token, and commit events
// read from a fetch stream (EventSource cannot send an Authorization header).

const TOKEN = "isbre.console.token";

export class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

export const session = {
  get token() {
    return sessionStorage.getItem(TOKEN);
  },
  set token(value) {
    if (value) sessionStorage.setItem(TOKEN, value);
    else sessionStorage.removeItem(TOKEN);
  },
  onSignedOut: () => {},
};

// Iceberg's ids are 64-bit: a snapshot id such as 5954038631294499925 would become the nearest
// double (5954038631294500000) as a JavaScript number, and an id copied from the page would name no
// snapshot. Integers beyond 2^53 are read from their source text as BigInt; the API stays as the
// spec has it, plain JSON numbers.
function exactIntegers(key, value, context) {
  if (typeof value === "number" && !Number.isSafeInteger(value) && context && /^-?\d+$/.test(context.source)) {
    return BigInt(context.source);
  }
  return value;
}

export function parseJson(text) {
  return JSON.parse(text, exactIntegers);
}

// Whether this browser hands a reviver the source text (Chromium 114 and Firefox 135 on).
export const exactIds = JSON.parse("1", (key, value, context) => context !== undefined);

function headers() {
  const token = session.token;
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function failure(response) {
  let type = "HTTPError";
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body.error) ({ type, message } = body.error);
  } catch {
    // not an ErrorModel: keep the status line
  }
  if (response.status === 401) session.onSignedOut(message);
  return new ApiError(response.status, type, message);
}

export async function get(path, { signal } = {}) {
  const response = await fetch(path, { headers: headers(), signal });
  if (!response.ok) throw await failure(response);
  const type = response.headers.get("content-type") || "";
  const text = await response.text();
  return type.includes("json") ? parseJson(text) : text;
}

// Client credentials for an access token (the OAuth2 endpoint PyIceberg uses).
export async function signIn(clientId, secret) {
  const body = new URLSearchParams({ grant_type: "client_credentials", client_id: clientId, client_secret: secret });
  const response = await fetch("/v1/oauth/tokens", { method: "POST", body });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(response.status, answer.error || "error", answer.error_description || response.statusText);
  session.token = answer.access_token;
}

export async function warehouseNames() {
  const { warehouses } = await get("/v1/warehouses");
  return warehouses.map((w) => w.name);
}

// A namespace in a path: its levels joined by the unit separator, as the REST spec says.
export function namespacePath(namespace) {
  return encodeURIComponent(namespace.join("\x1f"));
}

export function catalogPath(warehouse, namespace, ...rest) {
  const base = `/v1/${encodeURIComponent(warehouse)}/namespaces`;
  const tail = rest.map((part) => "/" + encodeURIComponent(part)).join("");
  return namespace ? `${base}/${namespacePath(namespace)}${tail}` : base;
}

// Every page of a list endpoint.
export async function listAll(path, key, { signal } = {}) {
  const found = [];
  let token = null;
  do {
    const separator = path.includes("?") ? "&" : "?";
    const page = await get(token ? `${path}${separator}pageToken=${encodeURIComponent(token)}` : path, { signal });
    found.push(...(page[key] || []));
    token = page["next-page-token"];
  } while (token);
  return found;
}

// Follows GET /v1/{warehouse}/events. `onRecords` gets each chunk's records in commit_seq order;
// `onState` the connection state. After a break it reconnects from the last id it handed on,
// so nothing is lost and nothing repeats. Returns a function that closes the stream.
export function follow({ warehouse, after = null, namespace = "", tables = [], kinds = [], onRecords, onState }) {
  const controller = new AbortController();
  let last = after;
  let retry = 1000;
  let closed = false;

  function url() {
    const query = new URLSearchParams();
    if (last !== null) query.set("after", String(last));
    if (namespace) query.set("namespace", namespace);
    for (const table of tables) query.append("table", table);
    for (const kind of kinds) query.append("kind", kind);
    return `/v1/${encodeURIComponent(warehouse)}/events?${query}`;
  }

  async function once() {
    onState("connecting");
    const response = await fetch(url(), { headers: { ...headers(), Accept: "text/event-stream" }, signal: controller.signal });
    if (!response.ok) throw await failure(response);
    onState("live");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      const messages = buffer.split("\n\n");
      buffer = messages.pop();
      const records = [];
      for (const message of messages) {
        let event = "message";
        let data = "";
        for (const line of message.split("\n")) {
          if (line.startsWith("data:")) data += line.slice(5).trimStart();
          else if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("retry:")) retry = Number(line.slice(6)) || retry;
        }
        if (!data) continue;
        const body = parseJson(data);
        if (event === "error") throw Object.assign(new ApiError(body.error.code, body.error.type, body.error.message), { inStream: true });
        records.push(body);
      }
      if (records.length) {
        last = records[records.length - 1].commit_seq;
        onRecords(records);
      }
    }
  }

  (async () => {
    while (!closed) {
      try {
        await once();
      } catch (error) {
        if (closed) return;
        if (error instanceof ApiError && [401, 403, 404, 410].includes(error.status)) {
          onState("failed", error.message);
          if (error.inStream && error.status === 401) session.onSignedOut(error.message); // the token expired
          return;
        }
      }
      if (closed) return;
      onState("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, retry));
    }
  })();

  return {
    close() {
      closed = true;
      controller.abort();
    },
    get last() {
      return last;
    },
  };
}
