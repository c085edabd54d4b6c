// Failsoft's status page: one GET of /failsoft/view draws everything; the event stream says when to draw
// again. The login cookie is HttpOnly: this script never sees it, the browser sends it.
"use strict";

const $ = (id) => document.getElementById(id);
// The events after which what the page shows may have changed.
const EVENTS = ["worker_state", "worker_unhealthy", "worker_restarted", "budget", "route_decided", "job_state",
  "queue", "fallback_started", "fallback_completed", "fallback_refused", "approval_needed", "device_changed",
  "gpu_path", "journal_failed"];
const FAILOVER_WORDS = { fallback_started: "moved to the CPU", fallback_completed: "finished on the CPU",
  fallback_refused: "not moved to the CPU", approval_needed: "asked for approval" };
// Why a peer is down (its probe's failure kind), in a few words: view/peers.py's PEER_FAILURE_WORDS.
const PEER_FAILURE_WORDS = { unreachable: "unreachable", unhealthy: "unhealthy", insecure: "insecure address",
  peer_gpu_unavailable: "its GPU not ready", peer_failed: "other machine failed" };
const POLL_MS = 15000; // also without events: the uptime moves, and a dropped stream is noticed
let source = null;
let pending = null;

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function fill(list, items, empty) {
  list.replaceChildren(...items);
  if (empty) empty.hidden = items.length > 0;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "unknown";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

function ago(at) {
  return at ? `${duration(Date.now() / 1000 - at)} ago` : "";
}

function setLive(on, text) {
  const live = $("live");
  live.className = `live ${on ? "on" : "off"}`;
  live.textContent = text || (on ? "live" : "offline");
}

function flash(text, bad = false) {
  const box = $("flash");
  box.textContent = text;
  box.className = bad ? "flash bad" : "flash";
  box.hidden = false;
}

function showLogin() {
  if (source) { source.close(); source = null; }
  $("app").hidden = true;
  $("login").hidden = false;
  setLive(false, "logged out");
  $("token").focus();
}

// A bar's parts as spans, each as wide as its share of the bar's total; a part of zero is left out.
function barSpans(segments) {
  const total = segments.reduce((sum, s) => sum + s.bytes, 0) || 1;
  return segments.filter((s) => s.bytes > 0).map((s) => {
    const span = el("span", { title: `${s.label}: ${s.size}${s.detail ? ` (${s.detail})` : ""}`,
      dataset: { key: s.key } });
    span.style.width = `${(100 * s.bytes) / total}%`;
    span.style.background = s.color;
    return span;
  });
}

function drawBar(bar) {
  $("bar").replaceChildren(...barSpans(bar.segments));
  $("bar").setAttribute("aria-label", bar.segments.map((s) => `${s.label} ${s.size}`).join(", "));
  const legend = bar.segments.filter((s) => s.bytes > 0).map((s) => {
    const swatch = el("i");
    swatch.style.background = s.color;
    return el("li", {}, swatch, `${s.label} ${s.size}`);
  });
  $("legend").replaceChildren(...legend);
  $("total").textContent = bar.total;
  $("caps").textContent = bar.caps;
}

// One RPC box's share (view/budget_split.py remote_bars): its usable memory split as the GPU's is.
function remoteShare(share) {
  const bar = el("div", { class: "bar small", role: "img",
    "aria-label": `${share.label}: ${share.segments.map((s) => `${s.label} ${s.size}`).join(", ")}` },
  ...barSpans(share.segments));
  return el("div", { class: "remote-share", dataset: { key: share.key } },
    el("p", {}, `${share.label} · ${share.layers} · `, el("strong", {}, share.usage)), bar);
}

// The RPC boxes the GPU worker spans: a small bar per box that holds layers, and a line per configured box
// that holds none, and why (view/budget_split.py box_problems).
function drawRemote(bar) {
  const shares = bar.remote || [];
  const problems = (bar.problems || []).map((line) => el("p", { class: "error" }, line));
  fill($("remote"), [...shares.map(remoteShare), ...problems]);
  $("remote").hidden = shares.length + problems.length === 0;
}

// A peer ("peer:gaming-pc", a fallback's `to`) by name and what it is; never "the CPU" (view/reasons.py).
function peerPlace(to) {
  if (!to || !(to === "peer" || to.startsWith("peer:"))) return null;
  const name = to.slice("peer:".length);
  return name ? `${name} (another machine's GPU)` : "another machine's GPU";
}

// A failover in words: a move to a peer names the peer, and so does its end, found by the start before it
// (`events` is newest first; only a start says where the job went).
function failoverWords(event, events) {
  const started = (e) => e.type === "fallback_started" && e.job_id === event.job_id;
  const to = event.type === "fallback_started" ? event.to
    : event.type === "fallback_completed" ? (events.slice(events.indexOf(event) + 1).find(started) || {}).to
      : null;
  const peer = peerPlace(to);
  if (peer) return event.type === "fallback_started" ? `moved to ${peer}` : `finished on ${peer}`;
  return FAILOVER_WORDS[event.type] || event.type;
}

// A peer's state in a few words, as `failsoft status` says it (view/peers.py).
function peerState(p) {
  if (p.state === "ready") return p.gpu_ready === true ? "ready (GPU)" : "ready";
  if (p.state !== "down") return p.state === "unknown" || !p.state ? "not asked yet" : p.state;
  const kind = p.last_failure && p.last_failure.kind;
  const next = typeof p.next_probe_in === "number" ? ` (next try in ${duration(p.next_probe_in)})` : "";
  return `down${kind ? `: ${PEER_FAILURE_WORDS[kind] || kind}` : ""}${next}`;
}

function peerItem(p) {
  const slots = p.slots ? `${p.slots} slot${p.slots === 1 ? "" : "s"}` : "";
  const asked = [typeof p.priority === "number" ? `priority ${p.priority}` : "", slots,
    `serves ${p.models && p.models.length ? p.models.join(", ") : "the main model"}`].filter(Boolean);
  const failure = p.last_failure && p.state !== "ready" ? p.last_failure.message : "";
  return el("li", {},
    el("span", { class: "grow" }, el("strong", {}, p.name), ` · ${peerState(p)} · ${p.url}`,
      el("span", { class: "preview" }, asked.join(" · ")),
      failure ? el("span", { class: "preview error" }, failure) : null),
    stateBadge(p.state || "unknown"));
}

function stateBadge(state) {
  return el("span", { class: `state ${state}` }, String(state).replace("_", " "));
}

async function decide(job, action, button) {
  for (const b of button.parentNode.querySelectorAll("button")) b.disabled = true;
  const response = await fetch(`/failsoft/jobs/${encodeURIComponent(job.id)}/${action}`,
    { method: "POST", credentials: "same-origin" });
  if (response.status === 401) return showLogin();
  const answer = await response.json().catch(() => ({}));
  if (response.ok) {
    const words = { approve: `approved: ${job.id} runs on the CPU, about ${duration(job.estimated_seconds)}`,
      reject: `rejected: ${job.id} will not run`,
      "stand-in": `${job.stand_in_offer} answers ${job.id} on the GPU now` };
    flash(words[action]);
  } else {
    flash((answer.error && answer.error.message) || `${action} failed (${response.status})`, true);
  }
  schedule();
}

function approvalItem(job) {
  const actions = el("span", { class: "actions" });
  const approve = el("button", { class: "approve", type: "button", dataset: { job: job.id } }, "Approve");
  approve.addEventListener("click", () => decide(job, "approve", approve));
  const reject = el("button", { class: "reject", type: "button" }, "Reject");
  reject.addEventListener("click", () => decide(job, "reject", reject));
  actions.append(approve, reject);
  if (job.stand_in_offer) {
    const standIn = el("button", { class: "secondary", type: "button" }, `Use ${job.stand_in_offer} now`);
    standIn.addEventListener("click", () => decide(job, "stand-in", standIn));
    actions.append(standIn);
  }
  const text = el("span", { class: "grow" },
    el("strong", {}, job.id), ` · ${job.model || "model"} on the CPU in about ${duration(job.estimated_seconds)}`,
    job.preview ? el("span", { class: "preview" }, `“${job.preview}”`) : null);
  return el("li", { dataset: { job: job.id } }, text, actions);
}

function render(view) {
  const status = view.status;
  drawBar(view.bar);
  drawRemote(view.bar);
  const path = status.gpu_path || {};
  $("gpu-path").replaceChildren(...(path.state ? [el("span", {}, "GPU path "), stateBadge(path.state),
    path.state !== "normal" && path.reason ? ` ${path.reason}` : ""] : []));

  $("approvals-count").textContent = view.approvals.length || "";
  fill($("approvals"), view.approvals.map(approvalItem), $("no-approvals"));

  const workers = Object.entries({ ...status.workers, ...status.embedding_workers, ...status.library_workers });
  fill($("workers"), workers.map(([role, w]) => el("li", {},
    el("span", { class: "grow" }, el("strong", {}, role.toUpperCase()),
      w.pid ? ` · pid ${w.pid}` : "", w.slots ? ` · ${w.in_flight || 0}/${w.slots} slots busy` : "",
      w.reason && w.state !== "ready" ? ` · ${w.reason}` : ""),
    stateBadge(w.state || "unknown"))));

  const peers = status.peers || [];
  $("peers-card").hidden = peers.length === 0;
  fill($("peers"), peers.map(peerItem));

  fill($("models"), (status.models || []).map((m) => el("li", {},
    el("span", { class: "grow" }, el("strong", {}, m.name), m.main ? " · main model" : "",
      ` · ${m.where === "not loaded" ? m.where : `on ${m.where.toUpperCase()}`}`,
      m.in_flight ? ` · ${m.in_flight} in flight` : ""))));

  const queue = status.queue || {};
  $("queue").textContent = `${queue.depth || 0} waiting of at most ${queue.limit || 0}; ` +
    `${view.jobs.length} queued or running`;
  fill($("jobs"), view.jobs.map((job) => el("li", {},
    el("span", { class: "grow" }, el("strong", {}, job.id), ` · ${job.model} · ${job.route || "…"}`),
    stateBadge(job.state))));

  fill($("failovers"), view.failovers.map((e) => el("li", {},
    el("span", { class: "grow" }, el("strong", {}, e.job_id), ` · ${failoverWords(e, view.failovers)}`,
      e.reason ? `: ${e.reason}` : "", e.estimated_seconds ? ` (about ${duration(e.estimated_seconds)})` : "",
      e.seconds ? ` · took ${duration(e.seconds)}` : ""),
    el("span", { class: "muted" }, ago(e.at)))), $("no-failovers"));

  fill($("notify"), (status.notify || []).map((c) => el("li", {},
    el("span", { class: "grow" }, el("strong", {}, c.name), ` · ${c.kind}`, c.where ? ` → ${c.where}` : "", ` · ${c.sent} sent`,
      c.failed ? ` · ${c.failed} failed` : "", c.last_error ? el("span", { class: "preview error" }, c.last_error) : null),
    stateBadge(c.last_error && (!c.last_sent_at || c.last_error_at > c.last_sent_at) ? "failed" : "ready"))),
  $("no-notify"));

  const crash = status.service && status.service.restarted_after_crash;
  $("restarted").hidden = !crash;
  if (crash) {
    const at = new Date(crash.at * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    const how = crash.signal ? `signal ${crash.signal}` : crash.exit_code ? `exit status ${crash.exit_code}` : "";
    $("restarted").textContent = `The service restarted after a crash at ${at}${how ? ` (${how})` : ""}` +
      (crash.stack_log ? `; its stack: ${crash.stack_log}` : "");
  }

  $("version").textContent = `Failsoft ${status.version}${status.simulated ? " · simulated GPU" : ""} · up ${duration(status.uptime_seconds)}`;
}

async function refresh() {
  pending = null;
  let response;
  try {
    response = await fetch("/failsoft/view", { credentials: "same-origin" });
  } catch (error) {
    setLive(false, "service unreachable");
    return;
  }
  if (response.status === 401) return showLogin();
  if (!response.ok) { setLive(false, `error ${response.status}`); return; }
  render(await response.json());
  $("login").hidden = true;
  $("app").hidden = false;
  connect();
}

function schedule() {
  if (pending === null) pending = setTimeout(refresh, 200);
}

function connect() {
  if (source && source.readyState !== EventSource.CLOSED) return;
  source = new EventSource("/failsoft/events");
  source.onopen = () => setLive(true);
  source.onerror = () => setLive(false, source.readyState === EventSource.CLOSED ? "offline" : "reconnecting…");
  for (const type of EVENTS) source.addEventListener(type, schedule);
}

async function login(event) {
  event.preventDefault();
  $("login-error").textContent = "";
  const response = await fetch("/ui/login", { method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token: $("token").value }) });
  if (!response.ok) {
    $("login-error").textContent = "That is not this service's admin token.";
    return;
  }
  $("token").value = "";
  refresh();
}

async function logout() {
  await fetch("/ui/logout", { method: "POST", credentials: "same-origin" });
  showLogin();
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  refresh();
  setInterval(() => { if (!$("app").hidden) refresh(); }, POLL_MS);
});
