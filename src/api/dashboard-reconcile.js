// The selected parent's reconcile dry run (POST /v1/parents/{id}/reconcile
// with dry_run): the stored counters beside the ones the child rows give.

import { Unauthorized, parentPath, postJson } from "./dashboard-api.js";
import { $, el, fmt } from "./dashboard-dom.js";

/** Runs parent `id`'s reconcile dry run and shows it, unless `current()`
 * names another parent by the time it answers; a 401 goes to `askForToken`. */
export async function reconcileDryRun(id, { current, askForToken }) {
  const verdict = $("reconcile-verdict");
  verdict.className = "verdict";
  verdict.textContent = "Comparing the stored counters with the child rows…";
  let answer;
  try {
    answer = await postJson(`${parentPath(id)}/reconcile`, { dry_run: true });
  } catch (err) {
    if (err instanceof Unauthorized) askForToken(err);
    else if (current() === id) verdict.textContent = `The dry run did not reach the service: ${err.message}`;
    return;
  }
  if (current() !== id) return;
  const { status, body } = answer;
  if (status !== 200) {
    $("reconcile-table").hidden = true;
    verdict.className = "verdict muted";
    verdict.textContent =
      status === 403
        ? "The reconcile dry run needs an admin token; this token may only look."
        : `The dry run answered ${status}: ${body?.detail || body?.title || "no detail"}`;
    return;
  }
  drawReconcile(body);
}

function drawReconcile(report) {
  const changes = Array.isArray(report.changes) ? report.changes : [];
  const changed = new Set(changes.map((c) => c.field));
  const stored = report.stored || {};
  const derived = report.derived || {};
  const verdict = $("reconcile-verdict");
  if (changes.length) {
    verdict.className = "verdict drift";
    verdict.textContent = `Drift in ${changes.length} field${changes.length === 1 ? "" : "s"}: ${changes
      .map((c) => `${c.field} ${show(c.from)} → ${show(c.to)}`)
      .join(", ")}. A reconcile without dry_run would write the values from the child rows.`;
  } else {
    verdict.className = "verdict ok";
    verdict.textContent = "No drift: the stored counters agree with the child rows.";
  }
  verdict.append(el("span", { className: "muted" }, ` Checked ${new Date().toLocaleTimeString()}.`));
  // Every counter either side reports, so a counter the service adds shows too.
  const counters = [...new Set([...Object.keys(stored), ...Object.keys(derived)])].filter(
    (field) => typeof stored[field] === "number" || typeof derived[field] === "number",
  );
  const rows = counters.map((field) =>
    el("tr", { className: changed.has(field) ? "changed" : "" }, el("td", null, field), el("td", { className: "num-left" }, fmt(stored[field])), el("td", { className: "num-left" }, fmt(derived[field]))),
  );
  rows.push(
    el(
      "tr",
      { className: changed.has("completed_at") ? "changed" : "" },
      el("td", null, "completed_at"),
      el("td", null, stored.completed_at ? new Date(stored.completed_at).toLocaleString() : "not set"),
      el("td", null, derived.complete ? "complete" : "not complete"),
    ),
  );
  $("reconcile-table").tBodies[0].replaceChildren(...rows);
  $("reconcile-table").hidden = false;
}

const show = (value) => (value === null || value === undefined ? "null" : String(value));
