// The selected parent, live: its event stream (GET /v1/parents/{id}/events),
// read with the dashboard's token through dashboard-api.js's `readEvents`.
// While the stream is open, the parent's counts and state come from it and
// the poll leaves the parent out; when it fails (an error answer, a lost
// connection, a stream that ends), polling carries on as before and the
// stream is tried again a little later, resuming from the last event id.

import { Unauthorized, parentPath, readEvents } from "./dashboard-api.js";

const RETRY_MS = [1000, 2000, 5000, 10000, 30000];

let watched = null; // {id, abort, lastEventId, failures, timer}

/** Whether the parent `id`'s stream is open now. */
export function isLive(id) {
  return watched !== null && watched.id === id && watched.open;
}

/** Watches parent `id` (null: none), calling `draw(parent)` for each event
 * that carries it, and `changed(live)` whenever the stream opens or fails. */
export function watch(id, { draw, changed }) {
  if (watched && watched.id === id && !watched.stopped) return;
  stop();
  if (!id) return;
  const w = { id, lastEventId: null, failures: 0, open: false, stopped: false, abort: null, timer: null, draw, changed };
  watched = w;
  connect(w);
}

/** Ends the stream, e.g. while the page is hidden or the token changes. */
export function stop() {
  if (!watched) return;
  const w = watched;
  watched = null;
  w.stopped = true;
  clearTimeout(w.timer);
  if (w.abort) w.abort.abort();
  if (w.open) w.changed(false);
}

async function connect(w) {
  w.abort = new AbortController();
  try {
    await readEvents(`${parentPath(w.id)}/events`, {
      signal: w.abort.signal,
      lastEventId: w.lastEventId,
      onOpen() {
        w.open = true;
        w.changed(true);
      },
      onEvent({ event, id, data }) {
        if (id) w.lastEventId = id;
        if (event !== "snapshot" && event !== "progress" && event !== "completed") return;
        w.failures = 0;
        try {
          w.draw(JSON.parse(data));
        } catch {
          // a malformed event is skipped; the poll still shows the parent
        }
      },
    });
  } catch (err) {
    if (w.stopped) return;
    // A 401 is the poll's to ask about; the stream waits for the next token.
    if (err instanceof Unauthorized) w.failures = RETRY_MS.length - 1;
  }
  if (w.stopped) return;
  if (w.open) {
    w.open = false;
    w.changed(false);
  }
  const wait = RETRY_MS[Math.min(w.failures, RETRY_MS.length - 1)];
  w.failures += 1;
  w.timer = setTimeout(() => !w.stopped && connect(w), wait);
}
