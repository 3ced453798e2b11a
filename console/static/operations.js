// Operations: the health tree, the writer's queue, commit rate and latency read off /metrics,
// open event streams.

import { get } from "./api.js";
import { clear, h, report, section, sparkline, status } from "./dom.js";

const POLL_MS = 2000;
const HISTORY = 60; // samples kept for the sparklines

// Prometheus text: {"name{labels}": value}.
export function parseMetrics(text) {
  const samples = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const split = line.lastIndexOf(" ");
    samples[line.slice(0, split)] = Number(line.slice(split + 1));
  }
  return samples;
}

// The bound under which `q` of the observations between two histogram readings fell.
function quantile(before, after, name, q) {
  const buckets = Object.keys(after)
    .filter((key) => key.startsWith(`${name}_bucket{`))
    .map((key) => ({ le: Number(key.match(/le="([^"]+)"/)[1].replace("+Inf", "Infinity")), count: after[key] - (before[key] || 0) }))
    .sort((a, b) => a.le - b.le);
  const total = buckets.length ? buckets[buckets.length - 1].count : 0;
  if (!total) return null;
  return buckets.find((b) => b.count >= q * total).le;
}

function milliseconds(seconds) {
  return seconds === null ? "-" : seconds === Infinity ? "> largest bucket" : `≤ ${(seconds * 1000).toFixed(seconds < 0.001 ? 2 : 1)} ms`;
}

export async function operationsPage(main, params, shell) {
  const health = h("div", {});
  const figures = h("div", { class: "figures" });
  main.append(h("h1", {}, "Operations"), h("div", { class: "columns" }, section("Health", health), section("Commits and streams", figures)));
  const rates = [];
  let before = null;
  let at = 0;

  async function poll() {
    const [body, text] = await Promise.all([get("/health"), get("/metrics")]);
    clear(health).append(h("p", {}, "isbre ", status(body.status)), report(body));
    const now = performance.now();
    const after = parseMetrics(text);
    const commits = after["isbre_commit_seq"] ?? 0; // every commit to the store, whichever process made it
    if (before) {
      const seconds = (now - at) / 1000;
      rates.push(Math.max(0, (commits - (before["isbre_commit_seq"] ?? 0)) / seconds));
      if (rates.length > HISTORY) rates.shift();
    }
    const latency = before && quantile(before, after, "isbre_commit_latency_seconds", 0.5);
    const tail = before && quantile(before, after, "isbre_commit_latency_seconds", 0.99);
    const figure = (label, value, id) => h("div", { class: "figure", "data-figure": id }, h("span", { class: "muted" }, label), h("strong", {}, value));
    clear(figures).append(
      figure("commit rate", `${(rates[rates.length - 1] ?? 0).toFixed(1)}/s`, "rate"),
      sparkline(rates.length ? rates : [0]),
      figure("commit latency p50", milliseconds(latency ?? null), "p50"),
      figure("commit latency p99", milliseconds(tail ?? null), "p99"),
      figure("writer queue", String(after["isbre_writer_queue_depth"] ?? "-"), "queue"),
      figure("open event streams", String(after["isbre_event_streams"] ?? "-"), "streams"),
      figure("commit_seq", String(after["isbre_commit_seq"] ?? "-"), "seq"),
    );
    before = after;
    at = now;
    shell.connection("polling", `health and metrics every ${POLL_MS / 1000} s`);
  }

  await poll();
  const ticker = setInterval(() => poll().catch(shell.failed), POLL_MS);
  return () => clearInterval(ticker);
}
