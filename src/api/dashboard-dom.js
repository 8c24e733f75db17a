// Building the dashboard's DOM. Every value goes in as a text node or a
// property (textContent, title, dataset), never as markup.

const numbers = new Intl.NumberFormat();
const rates = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

export const $ = (id) => document.getElementById(id);

// el("td", {className: "num"}, "text", childNode...): strings become text nodes.
export function el(tag, props, ...children) {
  const node = document.createElement(tag);
  if (props) {
    for (const [key, value] of Object.entries(props)) {
      if (key === "dataset") Object.assign(node.dataset, value);
      else if (key === "onclick") node.addEventListener("click", value);
      else node[key] = value;
    }
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

export function note(id, text) {
  const node = $(id);
  node.textContent = text || "";
  node.hidden = !text;
}

export const fmt = (n) => (typeof n === "number" ? numbers.format(n) : "–");
export const rate = (n) => (typeof n === "number" ? rates.format(n) : "–");

export function num(n, hot) {
  return el("td", { className: n > 0 && hot ? `num ${hot}` : "num" }, fmt(n));
}

export function ago(iso) {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (seconds < 5) return "just now";
  if (seconds < 90) return `${seconds} s ago`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 90) return `${minutes} min ago`;
  const hours = Math.round(minutes / 60);
  if (hours < 36) return `${hours} h ago`;
  return `${Math.round(hours / 24)} d ago`;
}

// A time shown as its age, kept current by tick(); the exact time on hover.
export function since(iso) {
  if (!iso) return el("span", { className: "muted" }, "–");
  return el("span", { className: "since", title: new Date(iso).toLocaleString(), dataset: { since: iso } }, ago(iso));
}

export function tick() {
  for (const node of document.querySelectorAll(".since")) node.textContent = ago(node.dataset.since);
}

// A stacked bar of a set of counts, and "done / total · percent".
export function progress(counts, total) {
  const done = (counts.processed || 0) + (counts.failed || 0) + (counts.skipped || 0);
  const bar = el("div", { className: "bar" });
  const parts = [
    ["processed", counts.processed],
    ["skipped", counts.skipped],
    ["failed", counts.failed],
    ["held", counts.held],
    ["in-flight", counts.in_flight],
  ];
  for (const [name, n] of parts) {
    if (!n || !total) continue;
    const segment = el("span", { className: `seg ${name}`, title: `${fmt(n)} ${name.replace("-", " ")}` });
    segment.style.width = `${(100 * n) / total}%`;
    bar.append(segment);
  }
  const percent = total ? Math.floor((100 * done) / total) : 0;
  const label = total ? `${fmt(done)} / ${fmt(total)} · ${percent}%` : "no children yet";
  return el("div", { className: "progress", title: `${fmt(done)} of ${fmt(total)} children terminal` }, bar, el("span", { className: "label" }, label));
}

export function badge(text, kind) {
  return el("span", { className: `badge ${kind || text}` }, text);
}

export function flash(text, kind) {
  const node = $("flash");
  node.textContent = text;
  node.className = `flash ${kind}`;
  node.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => (node.hidden = true), 20000);
}

export function setStatus(text, bad) {
  const node = $("status");
  node.textContent = text;
  node.classList.toggle("bad", Boolean(bad));
}

/** Where a paged table is: the cursor of the page shown, the ones before it, the next. */
export class Pager {
  constructor() {
    this.reset();
  }
  reset() {
    this.at = null; // the cursor of the page shown (null: the first)
    this.back = [];
    this.next = null;
  }
  forward() {
    if (this.next === null) return false;
    this.back.push(this.at);
    this.at = this.next;
    return true;
  }
  backward() {
    if (!this.back.length) return false;
    this.at = this.back.pop();
    return true;
  }
}
