/**
 * `register`: a parent and its children from a list, iterator or generator
 * (async ones too), in one request when they fit a page, else as
 * PUT (decomposing) + appended pages with explicit sequences + seal. Memory
 * is bounded by one page (children are kept as their JSON text only).
 */
import type { components } from "./schema.js";
import type { Ledger, Parent } from "./client.js";

type S = components["schemas"];

/** Children: an array, any iterable or generator, or an async iterable of child specs. */
export type ChildInput = Iterable<S["ChildSpec"]> | AsyncIterable<S["ChildSpec"]>;

/** A parent's settings, with their wire names, plus the W3C `traceparent` sent as a header. */
export type RegisterSettings = Omit<S["RegisterParent"], "queue" | "children" | "decomposed"> & {
  traceparent?: string;
};

/** At most this many children go in one request… */
export const PAGE_CHILDREN = 10_000;
/** …and at most about this many bytes of JSON. */
export const PAGE_BYTES = 4 * 1024 * 1024;

type Pull = () => IteratorResult<S["ChildSpec"]> | Promise<IteratorResult<S["ChildSpec"]>>;

function puller(children: ChildInput): Pull {
  if (children && typeof (children as Iterable<S["ChildSpec"]>)[Symbol.iterator] === "function") {
    const it = (children as Iterable<S["ChildSpec"]>)[Symbol.iterator]();
    return () => it.next();
  }
  if (children && typeof (children as AsyncIterable<S["ChildSpec"]>)[Symbol.asyncIterator] === "function") {
    const it = (children as AsyncIterable<S["ChildSpec"]>)[Symbol.asyncIterator]();
    return () => it.next();
  }
  throw new TypeError("register: children must be an array, an iterable or an async iterable of child specs");
}

/**
 * Reads children into one reusable byte buffer, a page at a time: each
 * child's JSON text is written there at once and dropped, so the page (not a
 * million short-lived strings) is what memory holds.
 */
class Reader {
  private pending: string | undefined;
  private ended = false;
  /** The page: children's JSON, back to back; `starts[i]` is where child i begins. */
  buf: Buffer = Buffer.allocUnsafe(64 * 1024);
  starts = new Int32Array(PAGE_CHILDREN + 1);
  count = 0;
  end = 0;
  /** Where request bodies are built (reused from page to page). */
  private out: Buffer = Buffer.allocUnsafe(64 * 1024);

  constructor(private readonly pull: Pull) {}

  private static encode(spec: S["ChildSpec"]): string {
    if (spec === null || typeof spec !== "object" || Array.isArray(spec)) {
      throw new TypeError(`register: each child must be a child spec object ({payload, key?, skip?, …}), got ${JSON.stringify(spec)}`);
    }
    return JSON.stringify(spec);
  }

  /** The next item's JSON text, undefined at the end, or a promise of either (async iterables only). */
  private next(): string | undefined | Promise<string | undefined> {
    if (this.pending !== undefined) {
      const s = this.pending;
      this.pending = undefined;
      return s;
    }
    if (this.ended) return undefined;
    const r = this.pull();
    if (r instanceof Promise) return r.then((v) => this.take(v));
    return this.take(r);
  }

  private take(r: IteratorResult<S["ChildSpec"]>): string | undefined {
    if (r.done) {
      this.ended = true;
      return undefined;
    }
    return Reader.encode(r.value);
  }

  /** Fills the page (PAGE_CHILDREN or PAGE_BYTES, whichever comes first). */
  async page(): Promise<number> {
    this.count = 0;
    this.end = 0;
    while (this.count < PAGE_CHILDREN) {
      let s = this.next();
      if (s instanceof Promise) s = await s;
      if (s === undefined) break;
      if (this.buf.length - this.end < s.length * 3) this.buf = grow(this.buf, this.end, this.end + s.length * 3);
      const written = this.buf.write(s, this.end);
      if (this.count > 0 && this.end + written + this.count * 24 > PAGE_BYTES) {
        this.pending = s;
        break;
      }
      this.starts[this.count++] = this.end;
      this.end += written;
    }
    this.starts[this.count] = this.end;
    return this.count;
  }

  /** Whether anything follows (looks one item ahead). */
  async more(): Promise<boolean> {
    if (this.pending !== undefined) return true;
    let s = this.next();
    if (s instanceof Promise) s = await s;
    if (s === undefined) return false;
    this.pending = s;
    return true;
  }

  /** `head` + the page's children (each `{"sequence": first + i, …}` when `first` is given) + `tail`. */
  body(head: string, tail: string, first?: number): Buffer {
    const need = Buffer.byteLength(head) + Buffer.byteLength(tail) + this.end + this.count * 32;
    if (this.out.length < need) this.out = Buffer.allocUnsafe(Math.max(need, this.out.length * 2));
    const out = this.out;
    let pos = out.write(head, 0);
    for (let i = 0; i < this.count; i++) {
      const from = this.starts[i]!;
      const to = this.starts[i + 1]!;
      if (i) out[pos++] = 44; // ,
      if (first === undefined) {
        pos += this.buf.copy(out, pos, from, to);
      } else {
        pos += SEQUENCE.copy(out, pos);
        pos = writeInt(out, pos, first + i);
        if (to - from > 2) out[pos++] = 44; // , then the spec's members
        pos += this.buf.copy(out, pos, from + 1, to);
      }
    }
    pos += out.write(tail, pos);
    return out.subarray(0, pos);
  }
}

const SEQUENCE = Buffer.from('{"sequence":');

/** Writes a non-negative integer's digits (no string made). */
function writeInt(out: Buffer, pos: number, n: number): number {
  if (n < 10) {
    out[pos] = 48 + n;
    return pos + 1;
  }
  let digits = 1;
  for (let m = n; m >= 10; m = Math.floor(m / 10)) digits++;
  for (let k = digits - 1; k >= 0; k--) {
    out[pos + k] = 48 + (n % 10);
    n = Math.floor(n / 10);
  }
  return pos + digits;
}

function grow(buf: Buffer, used: number, need: number): Buffer {
  const bigger = Buffer.allocUnsafe(Math.max(need, buf.length * 2));
  buf.copy(bigger, 0, 0, used);
  return bigger;
}

export async function register(
  ledger: Ledger, parentId: string, queue: string, children: ChildInput, settings: RegisterSettings = {},
): Promise<Parent> {
  const { traceparent, ...rest } = settings;
  const headers: Record<string, string> = traceparent ? { traceparent } : {};
  const path = `/v1/parents/${encodeURIComponent(parentId)}`;
  const reader = new Reader(puller(children));
  await reader.page();

  if (!(await reader.more())) {
    // Everything fits one request: the children and the decomposed mark in one transaction.
    const head = JSON.stringify({ ...rest, queue, decomposed: true });
    const rawBody = reader.body(`${head.slice(0, -1)},"children":[`, "]}");
    return ledger.request<Parent>("PUT", path, { rawBody, headers, node: true });
  }

  // Paged: a decomposing parent, its children appended page by page, then sealed.
  const parent = await ledger.request<Parent>("PUT", path, { body: { ...rest, queue, decomposed: false }, headers, node: true });
  if (parent.state !== "decomposing") return parent; // registered (and sealed) before: nothing to send again
  let sequence = 0;
  while (reader.count > 0) {
    const rawBody = reader.body('{"children":[', "]}", sequence);
    await ledger.request("POST", `${path}/children`, { rawBody, headers, node: true });
    sequence += reader.count;
    await reader.page();
  }
  return ledger.request<Parent>("POST", `${path}/seal`, { body: { total: sequence }, headers, node: true });
}
