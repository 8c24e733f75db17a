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
