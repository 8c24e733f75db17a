/**
 * Optional OpenTelemetry: when `@opentelemetry/api` can be imported and a
 * tracer provider is set, each handler runs in a span whose parent is the
 * child's `traceparent`; the outcome carries that span's traceparent.
 * Nothing here requires the package.
 */

/** Runs a handler in a span; resolves the handler's value (or rejects) and reports the span's traceparent. */
export type Traced = (
  name: string, traceparent: string | null | undefined, attributes: Record<string, string | number>,
  run: () => unknown,
) => { value: unknown; traceparent: string };

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})/;

/* eslint-disable @typescript-eslint/no-explicit-any */
export async function loadTracing(): Promise<Traced | undefined> {
  let api: any;
  try {
    const name = "@opentelemetry/api";
    api = await import(name);
  } catch {
    return undefined;
  }
  api = api?.trace ? api : api?.default;
  if (!api?.trace || !api?.context) return undefined;
  const provider = api.trace.getTracerProvider?.();
  const delegate = provider?.getDelegate?.();
  if (delegate && delegate.constructor?.name === "NoopTracerProvider") return undefined;
  const tracer = api.trace.getTracer("child-ledger");
  const CONSUMER = api.SpanKind?.CONSUMER ?? 4;

  return (name, traceparent, attributes, run) => {
    let ctx = api.context.active();
    const m = traceparent ? TRACEPARENT.exec(traceparent) : null;
    if (m) {
      ctx = api.trace.setSpanContext(ctx, {
        traceId: m[2], spanId: m[3], traceFlags: parseInt(m[4]!, 16), isRemote: true,
      });
    }
    const span = tracer.startSpan(name, { kind: CONSUMER, attributes }, ctx);
    const sc = span.spanContext();
    const own = `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags ?? 0).toString(16).padStart(2, "0")}`;
    const end = (error?: unknown) => {
      if (error !== undefined) {
        span.recordException?.(error as Error);
        span.setStatus?.({ code: api.SpanStatusCode?.ERROR ?? 2, message: String((error as Error)?.message ?? error) });
      }
      span.end();
    };
    let value: unknown;
    try {
      value = api.context.with(api.trace.setSpan(ctx, span), run);
    } catch (err) {
      end(err);
      throw err;
    }
    if (value && typeof (value as Promise<unknown>).then === "function") {
      value = (value as Promise<unknown>).then(
        (v) => { end(); return v; },
        (e) => { end(e); throw e; },
      );
    } else {
      end();
    }
    return { value, traceparent: own };
  };
}
