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
export declare const PAGE_CHILDREN = 10000;
/** …and at most about this many bytes of JSON. */
export declare const PAGE_BYTES: number;
export declare function register(ledger: Ledger, parentId: string, queue: string, children: ChildInput, settings?: RegisterSettings): Promise<Parent>;
export {};
