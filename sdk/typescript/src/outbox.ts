/**
 * The worker's outbox: outcomes waiting for the next claim to ride on (its
 * `outcomes` member), taken up to 1000 items and ~900 KB of JSON at a time;
 * those that would wait longer than the flush interval are posted alone.
 */
import type { BatchOutcome } from "./client.js";

export const MAX_ITEMS = 1000;
export const MAX_BYTES = 900_000;

export interface Taken {
  items: BatchOutcome[];
  /** The items as a JSON array. */
  json: string;
}

export class Outbox {
  private items: BatchOutcome[] = [];
  private timer: NodeJS.Timeout | undefined;

  /** `post` sends what `flush` takes (POST /v1/outcomes). */
  constructor(private readonly flushMs: number, private readonly post: (taken: Taken) => Promise<unknown>) {}

  get size(): number {
    return this.items.length;
  }

  push(item: BatchOutcome): void {
    this.items.push(item);
    if (this.items.length === 1) this.arm();
  }

  /** Items a failed request carried go first again (a repeat is answered "duplicate"). */
  putBack(items: BatchOutcome[]): void {
    this.items = items.concat(this.items);
    this.arm();
  }

  private arm(): void {
    if (this.timer || !this.items.length) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.flush();
    }, this.flushMs);
  }

  /** Up to 1000 outcomes and ~900 KB of their JSON, or undefined when empty. */
  take(): Taken | undefined {
    const all = this.items;
    if (!all.length) return undefined;
    let n = Math.min(MAX_ITEMS, all.length);
    let items = n === all.length ? all : all.slice(0, n);
    let json = JSON.stringify(items);
    while (n > 1 && (json.length > MAX_BYTES || (json.length > MAX_BYTES / 3 && Buffer.byteLength(json) > MAX_BYTES))) {
      n = Math.ceil(n / 2);
      items = all.slice(0, n);
      json = JSON.stringify(items);
    }
    this.items = n === all.length ? [] : all.slice(n);
    if (!this.items.length && this.timer) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    return { items, json };
  }

  /** Posts everything waiting, now. */
  flush(): Promise<unknown> {
    const all: Promise<unknown>[] = [];
    for (let taken = this.take(); taken; taken = this.take()) all.push(this.post(taken));
    return Promise.all(all);
  }

  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
