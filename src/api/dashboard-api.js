// The dashboard's calls to the /v1 API: the bearer token, and each URL's
// ETag sent back so that an unchanged answer is a bodiless 304.

const TOKEN_KEY = "child-ledger.token";

let token = sessionStorage.getItem(TOKEN_KEY) || "";
const seen = new Map(); // URL -> {etag, body} of its last 200

/** A 401: the service wants a token, or another one than `sentWith`. */
export class Unauthorized extends Error {
  constructor(sentWith, body) {
    super((body && body.detail) || "401 Unauthorized");
    this.sentWith = sentWith;
  }

  /** Whether it is about the token in use, not one replaced since it was sent. */
  get current() {
    return this.sentWith === token;
  }
}

export class Problem extends Error {
  constructor(status, body) {
    super((body && (body.detail || body.title)) || `HTTP ${status}`);
    this.status = status;
  }
}

function headers(extra) {
  const h = Object.assign({ Accept: "application/json" }, extra);
  if (token) h.Authorization = `Bearer ${token}`;
  return h;
}

async function bodyOf(response) {
  try {
    return await response.json();
  } catch {
    return null;
  }
}

// A GET that answers the last body again when the service says 304.
export async function getJson(url) {
  const last = seen.get(url);
  const extra = last ? { "If-None-Match": last.etag } : {};
  const sentWith = token;
  const response = await fetch(url, { headers: headers(extra), cache: "no-store" });
  if (response.status === 304 && last) return last.body;
  if (response.status === 401) throw new Unauthorized(sentWith, await bodyOf(response));
  if (!response.ok) throw new Problem(response.status, await bodyOf(response));
  const body = await response.json();
  const etag = response.headers.get("ETag");
  if (etag) {
    seen.delete(url);
    seen.set(url, { etag, body });
    if (seen.size > 200) seen.delete(seen.keys().next().value);
  }
  return body;
}

/** A streamed export (a parent's results) as a Blob, with the token. */
export async function getBlob(url, accept) {
  const sentWith = token;
  const response = await fetch(url, { headers: headers({ Accept: accept }), cache: "no-store" });
  if (response.status === 401) throw new Unauthorized(sentWith, await bodyOf(response));
  if (!response.ok) throw new Problem(response.status, await bodyOf(response));
  return await response.blob();
}

export async function postJson(url, body) {
  const sentWith = token;
  const response = await fetch(url, {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
    cache: "no-store",
  });
  if (response.status === 401) throw new Unauthorized(sentWith, await bodyOf(response));
  return { status: response.status, body: await bodyOf(response) };
}

export const parentPath = (id) => `v1/parents/${encodeURIComponent(id)}`;

/** The token in use ("" for none). */
export const currentToken = () => token;

/** Uses `value` ("" for none) from now on, for this tab only; the answers
 * seen with the previous token are forgotten. */
export function useToken(value) {
  token = value;
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  seen.clear();
}

/** Reads the server-sent events of `url` with the same bearer token as every
 * other call (`EventSource` cannot send one): fetch, then its body as a
 * stream. `onOpen()` once the service answered with a stream, then
 * `onEvent({event, id, data})` for each event (comments and heartbeats are
 * skipped), until the stream ends (it returns) or `signal` aborts (it throws).
 * An error answer throws `Unauthorized` or `Problem`, as `getJson` does. */
export async function readEvents(url, { signal, lastEventId, onOpen, onEvent }) {
  const sentWith = token;
  const extra = { Accept: "text/event-stream" };
  if (lastEventId) extra["Last-Event-ID"] = lastEventId;
  const response = await fetch(url, { headers: headers(extra), cache: "no-store", signal });
  if (response.status === 401) throw new Unauthorized(sentWith, await bodyOf(response));
  if (!response.ok) throw new Problem(response.status, await bodyOf(response));
  if (!response.body || !(response.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
    throw new Problem(response.status, { detail: "the answer is not an event stream" });
  }
  onOpen();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { event: "message", id: null, data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, end).replace(/\r$/, "");
      buffer = buffer.slice(end + 1);
      if (line === "") {
        if (event.data.length) onEvent({ event: event.event, id: event.id, data: event.data.join("\n") });
        event = { event: "message", id: null, data: [] };
        continue;
      }
      if (line.startsWith(":")) continue; // a comment: the heartbeat
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") event.event = text;
      else if (field === "data") event.data.push(text);
      else if (field === "id") event.id = text;
    }
  }
}
