// The child-ledger dashboard: queues, parents and one parent's failed and
// held children, polled from the /v1 API every few seconds (see
// dashboard-api.js for the ETags and the token, dashboard-dom.js for how
// values reach the page: as text only); the selected parent live through its
// event stream (dashboard-live.js), polled while that stream is down.

import { Problem, Unauthorized, currentToken, getBlob, getJson, parentPath, postJson, useToken } from "./dashboard-api.js";
import { isLive, stop as stopLive, watch } from "./dashboard-live.js";
import { reconcileDryRun } from "./dashboard-reconcile.js";
import { $, Pager, badge, el, flash, fmt, note, num, progress, rate, setStatus, since, tick } from "./dashboard-dom.js";

// Every 3 s, or `?poll=<seconds>` (1-3600).
const POLL_MS = 1000 * Math.min(3600, Math.max(1, Number(new URLSearchParams(location.search).get("poll")) || 3));
const PARENTS_PAGE = 50;
const CHILDREN_PAGE = 100;
const QUEUE_NAME = /^[a-z0-9._-]{1,64}$/;

let waitingForToken = false;

// ---------------------------------------------------------------- view state

// A link to the dashboard may name a parent: /dashboard#P-42.
function parentInHash() {
  try {
    return decodeURIComponent(location.hash.slice(1)) || null;
  } catch {
    return null;
  }
}

const view = {
  filters: { queue: "", state: "", has: "", order: "oldest" },
  parents: new Pager(),
  selected: parentInHash(),
  failed: new Pager(),
  held: new Pager(),
};

// The bodies last drawn, so an unchanged (304) answer is not drawn again
// (a redraw would swallow a click on a button it replaces).
let drawn = {};

// ---------------------------------------------------------------- queues

async function loadQueues() {
  let body;
  try {
    body = await getJson("v1/queues");
  } catch (err) {
    if (!(err instanceof Problem)) throw err;
    $("queues-table").hidden = true;
    drawn.queues = null;
    note(
      "queues-note",
      err.status === 404
        ? "This service has no queue overview (GET /v1/queues answered 404). The parents are listed below."
        : `The queue overview is unavailable: ${err.message} (${err.status}).`,
    );
    return;
  }
  if (body === drawn.queues) return;
  drawn.queues = body;
  drawQueues(Array.isArray(body.queues) ? body.queues : []);
}

function drawQueues(queues) {
  note("queues-note", queues.length ? "" : "No queues yet: register a parent and it shows here.");
  $("queues-table").hidden = !queues.length;
  const rows = queues.map((q) => {
    const children = q.children || {};
    const parents = q.parents || {};
    const throughput = q.throughput || {};
    const parentText = [
      parents.decomposing ? `${fmt(parents.decomposing)} decomposing` : null,
      `${fmt(parents.active || 0)} active`,
      `${fmt(parents.complete || 0)} complete`,
    ].filter(Boolean).join(" · ");
    const name = el("button", { type: "button", className: "link", title: "Show this queue's parents", onclick: () => filterQueue(q.queue) }, q.queue);
    return el(
      "tr",
      { className: view.filters.queue === q.queue ? "selected" : "", dataset: { queue: q.queue } },
      el("td", null, name, q.paused ? badge("paused") : null, flowKeys(q.flow_keys)),
      el("td", null, progress(children, children.total || 0)),
      num(children.pending),
      num(children.in_flight),
      num(children.held, "warm"),
      num(children.failed, "hot"),
      el("td", null, parentText),
      el("td", null, since(q.oldest_pending_since)),
      el("td", { className: "muted" }, `${rate(throughput.processed_per_minute)} processed · ${rate(throughput.failed_per_minute)} failed`),
    );
  });
  $("queues-table").tBodies[0].replaceChildren(...rows);
  rememberQueueNames(queues.map((q) => q.queue));
}

// A queue's flow keys in flight (what per-key limits count), busiest first.
function flowKeys(keys) {
  if (!Array.isArray(keys) || !keys.length) return null;
  const shown = keys.slice(0, 5).map((k) => `${k.flow_key} ${fmt(k.in_flight)}`).join(" · ");
  const more = keys.length > 5 ? ` · +${keys.length - 5} more` : "";
  return el("div", { className: "muted", title: "Children in flight per flow key" }, `keys in flight: ${shown}${more}`);
}

const queueNames = new Set();
function rememberQueueNames(names) {
  let added = false;
  for (const name of names) {
    if (name && !queueNames.has(name)) {
      queueNames.add(name);
      added = true;
    }
  }
  if (added) $("queue-names").replaceChildren(...[...queueNames].sort().map((name) => el("option", { value: name })));
}

// ---------------------------------------------------------------- parents

function parentsUrl() {
  const query = new URLSearchParams();
  const f = view.filters;
  if (f.queue) query.set("queue", f.queue);
  if (f.state) query.set("state", f.state);
  if (f.has) query.set("has", f.has);
  if (f.order !== "oldest") query.set("order", f.order);
  query.set("limit", String(PARENTS_PAGE));
  if (view.parents.at !== null) query.set("cursor", view.parents.at);
  return `v1/parents?${query}`;
}

async function loadParents() {
  let body;
  try {
    body = await getJson(parentsUrl());
  } catch (err) {
    if (!(err instanceof Problem)) throw err;
    note("parents-note", `Could not list parents: ${err.message} (${err.status}).`);
    return;
  }
  view.parents.next = body.next_cursor ?? null;
  if (body === drawn.parents && drawn.parentsSelected === view.selected) return;
  drawn.parents = body;
  drawn.parentsSelected = view.selected;
  drawParents(body.parents || []);
}

function drawParents(parents) {
  const f = view.filters;
  const filtered = f.queue || f.state || f.has;
  note("parents-note", parents.length ? "" : filtered ? "No parents match these filters." : "No parents yet.");
  const rows = parents.map((p) => {
    const counts = p.counts || {};
    const open = el("button", { type: "button", className: "link mono", title: "Show this parent's failed and held children", onclick: () => select(p.parent_id) }, p.parent_id);
    return el(
      "tr",
      { className: p.parent_id === view.selected ? "selected" : "", dataset: { parent: p.parent_id } },
      el("td", null, open),
      el("td", null, p.queue),
      el("td", null, badge(p.state)),
      el("td", null, progress(counts, counts.total || 0)),
      num(counts.failed, "hot"),
      num(counts.held, "warm"),
      num(counts.pending),
      num(counts.in_flight),
      el("td", null, since(p.created_at)),
      el("td", null, since(p.last_progress_at)),
    );
  });
  $("parents-table").tBodies[0].replaceChildren(...rows);
  $("parents-table").hidden = !parents.length;
  rememberQueueNames(parents.map((p) => p.queue));
  const pager = view.parents;
  $("parents-prev").disabled = !pager.back.length;
  $("parents-next").disabled = pager.next === null;
  $("parents-pager").hidden = !pager.back.length && pager.next === null;
  $("parents-page").textContent = `page ${pager.back.length + 1}`;
}

function applyFilters() {
  const queue = $("filter-queue").value.trim();
  if (queue && !QUEUE_NAME.test(queue)) {
    note("parents-note", "A queue name is 1-64 characters of a-z 0-9 . _ -");
    return;
  }
  view.filters = {
    queue,
    state: $("filter-state").value,
    has: $("filter-has").value,
    order: $("filter-order").value,
  };
  view.parents.reset();
  drawn.queues = null; // the selected queue is highlighted there
  refresh();
}

function filterQueue(name) {
  $("filter-queue").value = view.filters.queue === name ? "" : name;
  applyFilters();
}

// ---------------------------------------------------------------- one parent

function select(id) {
  view.selected = id;
  view.failed.reset();
  view.held.reset();
  drawn.parent = drawn.failed = drawn.held = null;
  history.replaceState(null, "", id ? `#${encodeURIComponent(id)}` : location.pathname + location.search);
  $("detail").hidden = !id;
  watchSelected();
  if (!id) {
    drawn.parents = null;
    refresh();
    return;
  }
  $("detail-id").textContent = id;
  $("detail-state").textContent = "";
  note("detail-note", "Loading…");
  $("failed-children").querySelector("tbody").replaceChildren();
  $("held-children").querySelector("tbody").replaceChildren();
  $("reconcile-verdict").textContent = "";
  $("reconcile-table").hidden = true;
  refresh();
  runReconcile();
  $("detail").scrollIntoView({ behavior: "smooth", block: "start" });
}

function childrenUrl(id, state, pager) {
  const query = new URLSearchParams({ state, limit: String(CHILDREN_PAGE) });
  if (pager.at !== null) query.set("after", String(pager.at));
  return `${parentPath(id)}/children?${query}`;
}

async function loadDetail() {
  const id = view.selected;
  if (!id) return;
  let parent, failed, held, summary;
  const streamed = isLive(id) && drawn.parent ? drawn.parent : null; // its stream's, while open
  try {
    [parent, failed, held, summary] = await Promise.all([
      streamed ?? getJson(parentPath(id)),
      getJson(childrenUrl(id, "failed", view.failed)),
      getJson(childrenUrl(id, "held", view.held)),
      getJson(`${parentPath(id)}/summary`),
    ]);
  } catch (err) {
    if (!(err instanceof Problem)) throw err;
    if (view.selected === id) {
      note("detail-note", err.status === 404 ? `There is no parent ${id} (it may have been deleted).` : `Could not read parent ${id}: ${err.message} (${err.status}).`);
    }
    return;
  }
  if (view.selected !== id) return; // another parent was chosen meanwhile
  // An event may have drawn a newer parent while the lists were read.
  if (streamed) parent = drawn.parent;
  note("detail-note", "");
  if (parent !== drawn.parent) {
    drawn.parent = parent;
    drawParent(parent);
  }
  view.failed.next = failed.next_after ?? null;
  view.held.next = held.next_after ?? null;
  if (summary !== drawn.summary) {
    drawn.summary = summary;
    drawSummary(summary.reasons || []);
  }
  if (failed !== drawn.failed) {
    drawn.failed = failed;
    drawFailed(failed.children || []);
  }
  if (held !== drawn.held) {
    drawn.held = held;
    drawHeld(id, held.children || []);
  }
}

function drawParent(p) {
  const counts = p.counts || {};
  const state = $("detail-state");
  state.textContent = p.state;
  state.className = `badge ${p.state}`;
  const verdict = $("detail-verdict");
  verdict.textContent = p.verdict ?? "";
  verdict.className = `badge verdict-${p.verdict}`;
  verdict.hidden = !p.verdict;
  $("detail-progress").replaceChildren(progress(counts, counts.total || 0));
  const facts = [
    ["Queue", p.queue],
    ["Verdict", p.verdict ?? "open"],
    ["Tolerates", tolerance(p.tolerated_failures)],
    ["Total", fmt(counts.total)],
    ["Processed", fmt(counts.processed)],
    ["Failed", fmt(counts.failed)],
    ["Skipped", fmt(counts.skipped)],
    ["Pending", fmt(counts.pending)],
    ["In flight", fmt(counts.in_flight)],
    ["Held", fmt(counts.held)],
    ["Created", since(p.created_at)],
    ["Last progress", since(p.last_progress_at)],
    ["Completed", since(p.completed_at)],
    ["Priority", fmt(p.priority)],
    ["Expired lease", p.expired_lease],
    ["Max attempts", p.max_attempts === null || p.max_attempts === undefined ? "unlimited" : fmt(p.max_attempts)],
  ];
  $("detail-facts").replaceChildren(...facts.map(([name, value]) => el("div", null, el("dt", null, name), el("dd", null, value))));
}

function tolerance(t) {
  if (!t) return "any failures";
  if (t.count !== undefined) return `${fmt(t.count)} failed`;
  return `${t.percent}% failed`;
}

function drawSummary(reasons) {
  const rows = reasons.map((r) =>
    el(
      "tr",
      null,
      el("td", null, r.state),
      el("td", { className: "reason" }, r.reason ?? "(no reason given)"),
      el("td", { className: "num" }, fmt(r.count)),
    ),
  );
  $("detail-summary").querySelector("tbody").replaceChildren(...(rows.length ? rows : [emptyRow(3, "No failed or skipped children.")]));
}

async function downloadResults(format) {
  const id = view.selected;
  if (!id) return;
  const [accept, extension] = format === "csv" ? ["text/csv", "csv"] : ["application/x-ndjson", "ndjson"];
  try {
    const blob = await getBlob(`${parentPath(id)}/results`, accept);
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: `${id}-results.${extension}` });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (err) {
    if (!(err instanceof Problem || err instanceof Unauthorized)) throw err;
    flash(`Could not download the results of ${id}: ${err.message}`, "error");
  }
}

function pagerButtons(name, pager) {
  for (const button of document.querySelectorAll(`[data-pager="${name}"]`)) {
    button.disabled = button.dataset.step === "back" ? !pager.back.length : pager.next === null;
    button.parentElement.hidden = !pager.back.length && pager.next === null;
  }
}

function emptyRow(columns, text) {
  return el("tr", null, el("td", { colSpan: columns, className: "empty" }, text));
}

function drawFailed(children) {
  const rows = children.map((c) =>
    el(
      "tr",
      { dataset: { sequence: String(c.sequence) } },
      el("td", { className: "num" }, fmt(c.sequence)),
      el("td", { className: "mono" }, c.key ?? "–"),
      el("td", { className: "num" }, fmt(c.outcome_attempt ?? c.attempts)),
      el("td", { className: "reason" }, c.reason ?? "(no reason given)", c.conflict_count ? badge(`${fmt(c.conflict_count)} conflicting`, "conflict") : null),
      el("td", null, since(c.terminal_at)),
    ),
  );
  $("failed-children").querySelector("tbody").replaceChildren(...(rows.length ? rows : [emptyRow(5, "No failed children.")]));
  pagerButtons("failed", view.failed);
}

function drawHeld(parentId, children) {
  const rows = children.map((c) => {
    const button = el("button", { type: "button", className: "retry", title: "Make this child claimable again (needs an admin token)" }, "Retry");
    button.addEventListener("click", () => retry(parentId, c.sequence, button));
    return el(
      "tr",
      { dataset: { sequence: String(c.sequence) } },
      el("td", { className: "num" }, fmt(c.sequence)),
      el("td", { className: "mono" }, c.key ?? "–"),
      el("td", { className: "num" }, fmt(c.attempts)),
      el("td", null, c.claimed_by ?? "–"),
      el("td", null, since(c.lease_expires_at)),
      el("td", null, button),
    );
  });
  $("held-children").querySelector("tbody").replaceChildren(...(rows.length ? rows : [emptyRow(6, "No held children.")]));
  pagerButtons("held", view.held);
}

async function retry(parentId, sequence, button) {
  button.disabled = true;
  button.textContent = "Retrying…";
  try {
    const { status, body } = await postJson(`${parentPath(parentId)}/children/${sequence}/retry`, {});
    if (status === 200) {
      flash(`Child ${sequence} of ${parentId} is ${body?.state || "pending"} again.`, "ok");
      if (view.selected === parentId) runReconcile(); // its open counts moved
    } else if (status === 403) {
      flash(`Retry refused (403): retrying a child needs an admin token; this token may only look. ${body?.detail || ""}`, "error");
    } else {
      flash(`Retry of child ${sequence} of ${parentId} answered ${status}: ${body?.detail || body?.title || "no detail"}`, "error");
    }
  } catch (err) {
    if (err instanceof Unauthorized) askForToken(err);
    else flash(`Retry of child ${sequence} of ${parentId} did not reach the service: ${err.message}`, "error");
  } finally {
    button.disabled = false;
    button.textContent = "Retry";
    drawn.held = null;
    refresh();
  }
}

function runReconcile() {
  if (view.selected) reconcileDryRun(view.selected, { current: () => view.selected, askForToken });
}

// ---------------------------------------------------------------- token

function drawTokenButton() {
  $("token-toggle").textContent = currentToken() ? "Change token" : "Enter token";
  $("token-forget").hidden = !currentToken();
}

// Asks for a token, unless the 401 answered a token the user has replaced since.
function askForToken(unauthorized) {
  if (!unauthorized.current) return;
  const alreadyWaiting = waitingForToken;
  waitingForToken = true;
  $("token-note").textContent = currentToken()
    ? "The service did not accept this token (401). Enter another one."
    : "This service needs a token (it answered 401). A reader token can look; retrying and the reconcile dry run need an admin token.";
  $("token-form").hidden = false;
  $("token-form").classList.add("asking");
  setStatus("Waiting for a token", true);
  if (!alreadyWaiting) $("token-input").focus();
}

function switchToken(value) {
  stopLive();
  useToken(value);
  drawn = {};
  waitingForToken = false;
  $("flash").hidden = true; // what it said was about the other token
  $("token-form").hidden = true;
  $("token-form").classList.remove("asking");
  drawTokenButton();
  refresh();
  watchSelected();
  if (view.selected) runReconcile();
}

// ---------------------------------------------------------------- live

// The selected parent's stream, while the page is visible.
function watchSelected() {
  if (document.hidden || !view.selected) {
    stopLive();
    return;
  }
  watch(view.selected, {
    draw(parent) {
      if (parent.parent_id !== view.selected || parent === drawn.parent) return;
      drawn.parent = parent;
      note("detail-note", "");
      drawParent(parent);
    },
    changed(live) {
      if (!waitingForToken) setStatus(statusLine(), false);
      if (!live) refresh(); // polling catches up with what the stream missed
    },
  });
}

function statusLine() {
  const live = view.selected && isLive(view.selected) ? " · parent live" : "";
  return `Updated ${new Date().toLocaleTimeString()} · every ${POLL_MS / 1000} s${live}`;
}

// ---------------------------------------------------------------- polling

let timer = null;
let running = false;
let again = false;

// One poll at a time; a refresh asked for during one runs right after it.
async function refresh() {
  if (running) {
    again = true;
    return;
  }
  running = true;
  clearTimeout(timer);
  try {
    do {
      again = false;
      await pollOnce();
    } while (again);
  } finally {
    running = false;
    timer = setTimeout(refresh, POLL_MS);
  }
}

async function pollOnce() {
  if (waitingForToken || document.hidden) return;
  try {
    await Promise.all([loadQueues(), loadParents(), loadDetail()]);
    if (!waitingForToken) setStatus(statusLine(), false);
  } catch (err) {
    if (err instanceof Unauthorized) askForToken(err);
    else setStatus(`Cannot reach the service: ${err.message}`, true);
  }
  tick();
}

// ---------------------------------------------------------------- wiring

$("filters").addEventListener("submit", (event) => {
  event.preventDefault();
  applyFilters();
});
$("filters").addEventListener("change", applyFilters);
$("parents-prev").addEventListener("click", () => view.parents.backward() && refresh());
$("parents-next").addEventListener("click", () => view.parents.forward() && refresh());
for (const button of document.querySelectorAll("[data-pager]")) {
  button.addEventListener("click", () => {
    const pager = view[button.dataset.pager];
    if (button.dataset.step === "back" ? pager.backward() : pager.forward()) refresh();
  });
}
$("detail-close").addEventListener("click", () => select(null));
$("results-ndjson").addEventListener("click", () => downloadResults("ndjson"));
$("results-csv").addEventListener("click", () => downloadResults("csv"));
$("reconcile-run").addEventListener("click", runReconcile);
const tokenHelp = $("token-note").textContent;
$("token-toggle").addEventListener("click", () => {
  const form = $("token-form");
  if (!waitingForToken) $("token-note").textContent = tokenHelp;
  form.hidden = !form.hidden;
  if (!form.hidden) $("token-input").focus();
});
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("token-input").value.trim();
  $("token-input").value = "";
  if (value) switchToken(value);
});
$("token-forget").addEventListener("click", () => switchToken(""));
document.addEventListener("visibilitychange", () => {
  watchSelected();
  if (!document.hidden) refresh();
});

drawTokenButton();
if (view.selected) select(view.selected);
else refresh();
