// The registry's pages: table sorting and filtering, and writes through the HTTP API with the token typed into the
// page (kept for this browser tab only). Nothing is loaded from another host.
"use strict";

function token() { return sessionStorage.getItem("registry-token") || ""; }
function say(text) { document.getElementById("status").textContent = text; }

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (token()) h["Authorization"] = "Bearer " + token();
  return h;
}

async function write(url, options) {
  if (document.body.dataset.needsToken === "yes" && !token()) {
    say("This server needs its token for writes: type it in the token box above.");
    return null;
  }
  const r = await fetch(url, options);
  const body = await r.json().catch(() => ({}));
  if (!r.ok) { say(r.status === 401 ? "The token was refused: " + (body.detail || "") : (body.detail || r.statusText)); return null; }
  return body;
}

function sortable(table) {
  table.querySelectorAll("th").forEach((th, col) => th.addEventListener("click", () => {
    const body = table.tBodies[0], rows = Array.from(body.rows), num = th.dataset.type === "num";
    const dir = th.dataset.dir === "asc" ? -1 : 1;
    th.dataset.dir = dir === 1 ? "asc" : "desc";
    const key = r => { const t = r.cells[col].textContent.trim(); return num ? (t === "" ? -Infinity : parseFloat(t)) : t.toLowerCase(); };
    rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * dir).forEach(r => body.appendChild(r));
  }));
}

function filtering() {
  const box = document.getElementById("filter"), open = document.getElementById("open-only");
  if (!box) return;
  const apply = () => {
    const q = box.value.toLowerCase();
    document.querySelectorAll("#models tbody tr").forEach(r => {
      const show = r.textContent.toLowerCase().includes(q) && (!open.checked || r.dataset.open === "yes");
      r.style.display = show ? "" : "none";
    });
  };
  box.addEventListener("input", apply);
  open.addEventListener("change", apply);
}

function parseCsv(text) {
  const lines = text.split(/\r?\n/).filter(l => l.trim());
  const head = lines.shift().split(",").map(h => h.trim().toLowerCase());
  const qi = ["question_id", "query_id", "id"].map(h => head.indexOf(h)).find(i => i >= 0);
  const ci = ["correct", "score", "label"].map(h => head.indexOf(h)).find(i => i >= 0);
  if (qi === undefined || ci === undefined) throw new Error("the file needs question_id and correct columns");
  return lines.map(l => { const c = l.split(","); return {question_id: c[qi].trim(), correct: /^(1|true)$/i.test(c[ci].trim()) ? 1 : 0}; });
}

// bar widths and legend colours come as data attributes: the pages' security policy runs no inline style
function sizes() {
  document.querySelectorAll("[data-width]").forEach(e => { e.style.width = e.dataset.width + "px"; });
  document.querySelectorAll("[data-colour]").forEach(e => { e.style.background = e.dataset.colour; });
}

document.addEventListener("DOMContentLoaded", () => {
  sizes();
  const t = document.getElementById("token");
  t.value = token();
  t.addEventListener("change", () => sessionStorage.setItem("registry-token", t.value));
  document.querySelectorAll("table.sortable").forEach(sortable);
  filtering();
  document.querySelectorAll("button.write").forEach(b => b.addEventListener("click", async () => {
    const done = await write("/availability/" + b.dataset.action, {method: "POST",
      headers: headers({"Content-Type": "application/json"}), body: JSON.stringify({models: [b.dataset.model]})});
    if (done) location.reload();
  }));
  document.querySelectorAll("button.upload").forEach(b => b.addEventListener("click", async () => {
    const f = document.getElementById("upload-file").files[0];
    if (!f) { say("Choose a results file first."); return; }
    const kind = f.name.endsWith(".jsonl") ? "application/jsonl" : f.name.endsWith(".parquet") ? "application/vnd.apache.parquet" : "text/csv";
    const r = await write("/models/" + encodeURIComponent(b.dataset.model) + "/evaluations",
      {method: "POST", headers: headers({"Content-Type": kind}), body: await f.arrayBuffer()});
    if (r) { say(r.evaluations_added + " evaluations added"); setTimeout(() => location.reload(), 800); }
  }));
  const fp = document.getElementById("fp-button");
  if (fp) fp.addEventListener("click", async () => {
    const f = document.getElementById("fp-file").files[0], out = document.getElementById("fp-result");
    if (!f) { say("Choose a results file first."); return; }
    let rows;
    try { rows = parseCsv(await f.text()); } catch (e) { say(e.message); return; }
    const r = await fetch("/fingerprint", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({evaluations: rows})});
    const v = await r.json();
    if (!r.ok) { say(v.detail); return; }
    out.innerHTML = "";
    const h = document.createElement("h2");
    h.id = "verdict";
    h.textContent = (v.verdict === "same" ? "same: " : "closest: ") + v.match + (v.verdict === "same" ? "" : ", not conclusive");
    const p = document.createElement("p");
    p.textContent = v.method === "answers"
      ? `disagrees on ${(100 * v.disagreement).toFixed(1)}% of ${v.shared_queries} shared questions; "same" needs at most ${v.threshold === null ? "(none possible at this size)" : (100 * v.threshold).toFixed(1) + "%"}; next: ${v.runner_up || "-"} (${v.runner_up_disagreement === null ? "-" : (100 * v.runner_up_disagreement).toFixed(1) + "%"}); calibrated on the closest distinct pair ${v.closest_pair.join(" / ")} (${(100 * v.p_min).toFixed(1)}%)`
      : `embedding distance ${v.distance.toFixed(4)}; "same" under ${v.threshold === null ? "-" : v.threshold.toFixed(4)}`;
    out.append(h, p);
  });
});
