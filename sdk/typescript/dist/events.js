import { LedgerError, ProblemError, UnavailableError } from "./errors.js";
import { RETRY_STATUSES, anySignal, backoffMs, send, sleep } from "./http.js";
/** A stream that has sent nothing (not even the 15 s heartbeat) this long is dropped and reopened. */
const IDLE_MS = 45_000;
/** Lines of a byte stream (\n, \r\n or \r), decoded as UTF-8. */
async function* lines(body, onChunk) {
    const decoder = new TextDecoder();
    let buffer = "";
    for await (const chunk of body) {
        onChunk?.();
        buffer += decoder.decode(chunk, { stream: true });
        let start = 0;
        for (;;) {
            const nl = buffer.indexOf("\n", start);
            if (nl < 0)
                break;
            const end = nl > start && buffer.charCodeAt(nl - 1) === 13 ? nl - 1 : nl;
            yield buffer.slice(start, end);
            start = nl + 1;
        }
        buffer = buffer.slice(start);
    }
    buffer += decoder.decode();
    if (buffer)
        yield buffer;
}
/** Server-sent events from a body stream (fields `event`, `data`, `id`; comments skipped). */
export async function* parseSse(body, onChunk) {
    let event = "";
    let data = [];
    let id = null;
    for await (const line of lines(body, onChunk)) {
        if (line === "") {
            if (data.length) {
                const raw = data.join("\n");
                let parsed = raw;
                try {
                    parsed = JSON.parse(raw);
                }
                catch {
                    /* not JSON: the text itself */
                }
                yield { event: event || "message", id, data: parsed, raw };
            }
            event = "";
            data = [];
            continue;
        }
        if (line.startsWith(":"))
            continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" "))
            value = value.slice(1);
        if (field === "event")
            event = value;
        else if (field === "data")
            data.push(value);
        else if (field === "id" && !value.includes("\0"))
            id = value;
    }
}
function retryable(err) {
    return err instanceof UnavailableError || (err instanceof ProblemError && RETRY_STATUSES.has(err.status));
}
export async function* watchStream(ledger, path, endOnCompleted, options = {}) {
    const { signal } = options;
    const reconnectTimeoutMs = options.reconnectTimeoutMs ?? Infinity;
    let lastId = options.lastEventId ?? null;
    let failures = 0;
    let downSince = null;
    for (;;) {
        const connection = new AbortController();
        const both = anySignal([signal, connection.signal]);
        let response;
        try {
            response = await send(ledger.transport, "GET", path, {
                accept: "text/event-stream",
                headers: lastId ? { "last-event-id": lastId } : {},
                signal: both,
                retries: 0,
                stream: true,
            });
        }
        catch (err) {
            if (signal?.aborted)
                throw signal.reason;
            if (!retryable(err))
                throw err;
            downSince ??= Date.now();
            if (Date.now() - downSince > reconnectTimeoutMs) {
                throw new UnavailableError(`${path}: no connection for ${reconnectTimeoutMs} ms: ${err.message}`, { cause: err });
            }
            const retryAfter = err instanceof ProblemError ? err.retryAfterMs : undefined;
            await sleep(retryAfter ?? Math.min(backoffMs(failures++), 5000), signal);
            continue;
        }
        downSince = null;
        let idle;
        const touch = () => {
            clearTimeout(idle);
            idle = setTimeout(() => connection.abort(new DOMException("idle", "TimeoutError")), IDLE_MS);
        };
        touch();
        try {
            for await (const { raw: _raw, ...ev } of parseSse(response.body, touch)) {
                failures = 0;
                if (ev.id)
                    lastId = ev.id;
                yield ev;
                if (endOnCompleted && ev.event === "completed")
                    return;
            }
        }
        catch (err) {
            if (signal?.aborted)
                throw signal.reason;
            // The connection was lost: reopen it below.
        }
        finally {
            clearTimeout(idle);
            connection.abort();
        }
        await sleep(Math.min(backoffMs(failures++), 2000), signal);
    }
}
export async function wait(ledger, parentId, options = {}) {
    const timeout = options.timeoutMs !== undefined ? AbortSignal.timeout(options.timeoutMs) : undefined;
    const signal = anySignal([options.signal, timeout]);
    try {
        for await (const ev of ledger.watch(parentId, { signal })) {
            if (ev.event === "completed")
                return ev.data;
        }
    }
    catch (err) {
        if (timeout?.aborted && !options.signal?.aborted) {
            throw new LedgerError(`wait: parent ${parentId} did not complete within ${options.timeoutMs} ms`, { cause: err });
        }
        throw err;
    }
    throw new LedgerError(`wait: the event stream of parent ${parentId} ended before it completed`);
}
export async function* results(ledger, parentId, options = {}) {
    const response = await send(ledger.transport, "GET", `/v1/parents/${encodeURIComponent(parentId)}/results`, {
        query: { state: options.state },
        accept: "application/x-ndjson",
        signal: options.signal,
        stream: true,
    });
    const decoder = new TextDecoder();
    let rest = "";
    try {
        for await (const chunk of response.body) {
            const text = rest + decoder.decode(chunk, { stream: true });
            let start = 0;
            for (let nl = text.indexOf("\n"); nl >= 0; nl = text.indexOf("\n", start)) {
                if (nl > start + 1 || (nl === start + 1 && text.charCodeAt(start) !== 13))
                    yield JSON.parse(text.slice(start, nl));
                start = nl + 1;
            }
            rest = text.slice(start);
        }
        rest += decoder.decode();
        if (rest.trim())
            yield JSON.parse(rest);
    }
    finally {
        await response.body?.cancel().catch(() => { });
    }
}
