// Pages that show catalog state redraw themselves when a commit touches it.

import { follow, get } from "./api.js";

// Draws with `draw()` now, then again (at most every 250 ms) after each commit that one of the
// streams selects (`options`: one set of stream options, or a list). Returns the function that
// stops following.
export async function redrawOnCommit(shell, options, draw) {
  await draw();
  let timer = null;
  const redraw = () => {
    if (timer !== null) return;
    timer = setTimeout(async () => {
      timer = null;
      try {
        await draw();
      } catch (error) {
        shell.failed(error);
      }
    }, 250);
  };
  const streams = [];
  for (const each of Array.isArray(options) ? options : [options]) {
    const { commit_seq } = await get(`/v1/${encodeURIComponent(each.warehouse)}/events/cursor`);
    streams.push(follow({ ...each, after: commit_seq, onRecords: redraw, onState: (state, detail) => shell.connection(state, detail) }));
  }
  return () => {
    clearTimeout(timer);
    for (const stream of streams) stream.close();
  };
}
