export const MAX_ITEMS = 1000;
export const MAX_BYTES = 900_000;
export class Outbox {
    flushMs;
    post;
    items = [];
    timer;
    /** `post` sends what `flush` takes (POST /v1/outcomes). */
    constructor(flushMs, post) {
        this.flushMs = flushMs;
        this.post = post;
    }
    get size() {
        return this.items.length;
    }
    push(item) {
        this.items.push(item);
        if (this.items.length === 1)
            this.arm();
    }
    /** Items a failed request carried go first again (a repeat is answered "duplicate"). */
    putBack(items) {
        this.items = items.concat(this.items);
        this.arm();
    }
    arm() {
        if (this.timer || !this.items.length)
            return;
        this.timer = setTimeout(() => {
            this.timer = undefined;
            void this.flush();
        }, this.flushMs);
    }
    /** Up to 1000 outcomes and ~900 KB of their JSON, or undefined when empty. */
    take() {
        const all = this.items;
        if (!all.length)
            return undefined;
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
    flush() {
        const all = [];
        for (let taken = this.take(); taken; taken = this.take())
            all.push(this.post(taken));
        return Promise.all(all);
    }
    close() {
        clearTimeout(this.timer);
        this.timer = undefined;
    }
}
