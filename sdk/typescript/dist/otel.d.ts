/**
 * Optional OpenTelemetry: when `@opentelemetry/api` can be imported and a
 * tracer provider is set, each handler runs in a span whose parent is the
 * child's `traceparent`; the outcome carries that span's traceparent.
 * Nothing here requires the package.
 */
/** Runs a handler in a span; resolves the handler's value (or rejects) and reports the span's traceparent. */
export type Traced = (name: string, traceparent: string | null | undefined, attributes: Record<string, string | number>, run: () => unknown) => {
    value: unknown;
    traceparent: string;
};
export declare function loadTracing(): Promise<Traced | undefined>;
