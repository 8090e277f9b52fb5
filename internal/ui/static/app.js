// llmlb dashboard: reads GET /admin/events (server-sent events) with fetch,
// so that the admin token travels in the Authorization header, never in the
// URL. The token lives in this tab only (sessionStorage).
'use strict';

const TOKEN_KEY = 'llmlb.adminToken';
const KEEP_DECISIONS = 500; // decisions kept in memory for the session filter
const SHOW_DECISIONS = 100;
// Okabe-Ito, without yellow (too light on white): one colour per replica.
const COLORS = ['#0072B2', '#E69F00', '#009E73', '#CC79A7', '#56B4E9', '#D55E00', '#000000'];
const SYMBOL = { LIVE: '\u25CF', PROBING: '\u25D0', EJECTED: '\u2716' };

let token = sessionStorage.getItem(TOKEN_KEY) || '';
let snap = null;
let decisions = []; // newest first, unique by seq
let controller = null;
let lastEvent = 0;
const colorOf = new Map();

const $ = (id) => document.getElementById(id);

function esc(s) {
  return String(s ?? '').replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);
}

function fmtDur(sec) {
  sec = Math.max(0, Math.round(sec));
  if (sec < 60) return sec + 's';
  if (sec < 3600) return Math.floor(sec / 60) + 'm' + (sec % 60 ? ' ' + String(sec % 60).padStart(2, '0') + 's' : '');
  return Math.floor(sec / 3600) + 'h ' + String(Math.floor(sec / 60) % 60).padStart(2, '0') + 'm';
}

function fmtSec(s) {
  if (!s) return '-';
  return s < 1 ? Math.round(s * 1000) + ' ms' : s.toFixed(s < 10 ? 2 : 1) + ' s';
}

function pct(v) { return v == null ? '-' : (100 * v).toFixed(v > 0 && v < 0.1 ? 1 : 0) + '%'; }

function clock(iso) {
  const d = new Date(iso);
  return d.toLocaleTimeString([], { hour12: false }) + '.' + String(d.getMilliseconds()).padStart(3, '0').slice(0, 1);
}

function replicaColor(name) {
  if (!colorOf.has(name)) colorOf.set(name, COLORS[colorOf.size % COLORS.length]);
  return colorOf.get(name);
}

function swatch(name) {
  return `<svg class="swatch" width="10" height="10" viewBox="0 0 10 10" aria-hidden="true"><circle cx="5" cy="5" r="5" fill="${replicaColor(name)}"/></svg>`;
}

// FULL_BY says in words why flow control counts a replica full (full_by).
const FULL_BY = {
  memory: 'its own queue waits for KV memory',
  prefill_backlog: 'its own queue waits behind more prefill than prefill_backlog',
  kv_commit: "llmlb's requests commit its KV capacity",
  slots: 'at its running-slot limit',
};

function stateBadge(state) {
  return `<span class="badge st-${esc(state)}">${SYMBOL[state] || ''} ${esc(state)}</span>`;
}

// sparkline draws values (0..max) as a filled line in a 120x24 box.
function sparkline(values, max, color) {
  const n = values.length;
  if (!n) return '';
  const top = max || Math.max(1e-9, ...values);
  const pts = values.map((v, i) => {
    const x = n === 1 ? 120 : (i * 120) / (n - 1);
    const y = 23 - (22 * Math.min(v, top)) / top;
    return x.toFixed(1) + ',' + y.toFixed(1);
  });
  return `<polygon points="0,24 ${pts.join(' ')} 120,24" fill="${color}" fill-opacity="0.15"/>` +
    `<polyline points="${pts.join(' ')}" fill="none" stroke="${color}" stroke-width="1.6" vector-effect="non-scaling-stroke"/>`;
}

function kvBar(v) {
  const w = Math.round(90 * Math.min(Math.max(v, 0), 1));
  const color = v >= 0.9 ? '#D55E00' : v >= 0.7 ? '#E69F00' : '#0072B2';
  return `<svg class="bar" viewBox="0 0 90 10" aria-hidden="true"><rect width="90" height="10" fill="#e6eaee" rx="2"/>` +
    `<rect width="${w}" height="10" fill="${color}" rx="2"/></svg>${pct(v)}`;
}

function canMutate() { return snap && snap.authorized && (snap.token_configured ? !!token : snap.open_mutations); }

function renderHeader(s) {
  $('policy').textContent = 'policy ' + s.policy;
  $('updated').textContent = 'updated ' + clock(s.at);
  let st = '';
  if (!s.token_configured) st = s.open_mutations ? 'no admin token needed here: drain / undrain enabled' : 'no admin_token configured: drain / undrain are off';
  else if (!token) st = 'session keys hidden; give the token to see them and to drain';
  else st = s.authorized ? 'token accepted' : 'token not accepted';
  $('token-state').textContent = st;
}

function renderKPIs(f) {
  $('k-rps').textContent = f.requests_per_second.toFixed(f.requests_per_second < 10 ? 1 : 0);
  const perSec = f.routed_history.slice(firstBucket(f)).map((c) => c / f.share_bucket_seconds);
  $('k-rps-spark').innerHTML = sparkline(perSec, 0, '#0072B2');
  $('k-ttft-window').textContent = '(last ' + fmtDur(f.ttft_window_seconds) + ')';
  $('k-p50').textContent = fmtSec(f.ttft_p50_seconds);
  $('k-p99').textContent = fmtSec(f.ttft_p99_seconds);
  $('k-samples').textContent = f.ttft_samples + ' first bytes';
  $('k-imb').textContent = f.imbalance_index ? f.imbalance_index.toFixed(2) : '-';
  $('k-states').innerHTML = `<span class="badge st-LIVE">${SYMBOL.LIVE} ${f.live} LIVE</span> ` +
    `<span class="badge st-PROBING">${SYMBOL.PROBING} ${f.probing} PROBING</span> ` +
    `<span class="badge st-EJECTED">${SYMBOL.EJECTED} ${f.ejected} EJECTED</span>`;
  $('k-draining').textContent = f.draining ? f.draining + ' draining (no new traffic)' : 'none draining';
  $('k-errors').textContent = f.server_errors_per_minute + f.stream_errors_per_minute;
  $('k-answered').textContent = `${f.server_errors_per_minute} 5xx, ${f.stream_errors_per_minute} broken streams of ${f.answered_per_minute}`;
}

function renderAlerts(alerts) {
  const el = $('alerts');
  if (!alerts.length) { el.innerHTML = '<div class="none">No alerts firing.</div>'; return; }
  el.innerHTML = alerts.map((a) => `<div class="alert"><b>${esc(a.name)}</b>${a.replica ? ' · ' + esc(a.replica) : ''}: ${esc(a.message)}</div>`).join('');
}

// firstBucket is the first share bucket with traffic: the history before it
// predates the balancer (or any request) and is left out of the charts.
function firstBucket(f) {
  const i = f.routed_history.findIndex((c) => c > 0);
  return i < 0 ? f.routed_history.length : i;
}

// ttftError shows how far policy cost's TTFT estimates for a replica are
// off; '-' until one of its streamed first tokens was checked.
function ttftError(r) {
  if (!r.ttft_predictions) return '<span class="muted">-</span>';
  const slow = r.ttft_prediction_ratio < 1 ? 'slower than estimated' : 'faster than estimated';
  return `<span title="median estimate / measured ${r.ttft_prediction_ratio.toFixed(2)} (${slow}) over ${Math.min(r.ttft_predictions, 256)} first tokens">${(100 * r.ttft_prediction_error).toFixed(0)}%</span>`;
}

function renderReplicas(s) {
  const mutate = canMutate();
  const first = firstBucket(s.fleet);
  $('share-head').textContent = `Traffic share (last ${fmtDur(s.fleet.share_history_seconds)})`;
  $('replicas').querySelector('tbody').innerHTML = s.replicas.map((r) => {
    const cooldown = r.state === 'EJECTED' && r.cooldown_left_seconds > 0
      ? fmtDur(r.cooldown_left_seconds) + ' left of ' + fmtDur(r.cooldown_seconds)
      : r.cooldown_seconds > 0 ? '<span class="muted">last ' + fmtDur(r.cooldown_seconds) + '</span>' : '<span class="muted">-</span>';
    const action = !mutate ? '' : r.draining
      ? `<button data-action="undrain" data-name="${esc(r.name)}">Undrain</button>`
      : `<button data-action="drain" data-name="${esc(r.name)}">Drain</button>`;
    const color = replicaColor(r.name);
    return `<tr data-replica="${esc(r.name)}" data-state="${esc(r.state)}" class="row-${esc(r.state)}">
      <td>${swatch(r.name)}<span class="name">${esc(r.name)}</span><div class="url">${esc(r.url)}</div></td>
      <td class="state">${stateBadge(r.state)}${r.draining ? '<span class="badge st-draining">draining</span>' : ''}${r.full_by ? `<span class="badge st-full" title="full for flow control: new requests wait in llmlb (${esc(FULL_BY[r.full_by] || r.full_by)})">full: ${esc(r.full_by)}</span>` : ''}${r.full_for_lower_by ? `<span class="badge st-full-lower" title="full for lower priorities while a higher one has requests outstanding: theirs wait in llmlb (${esc(FULL_BY[r.full_for_lower_by] || r.full_for_lower_by)}, less the reserve kept for the higher one)">full for lower: ${esc(r.full_for_lower_by)}</span>` : ''}</td>
      <td>${fmtDur(r.state_seconds)}</td>
      <td>${cooldown}</td>
      <td class="num running">${r.running.toFixed(0)}</td>
      <td class="num waiting">${r.waiting.toFixed(0)}</td>
      <td class="num load" title="effective running ${r.effective_running.toFixed(1)} + waiting ${r.effective_waiting.toFixed(1)}">${r.load.toFixed(1)}</td>
      <td class="num">${r.in_flight}</td>
      <td>${kvBar(r.kv_cache_usage)}</td>
      <td class="num">${pct(r.prefix_hit_rate)}</td>
      <td class="num ttft-err">${ttftError(r)}</td>
      <td><span class="share"><svg viewBox="0 0 120 24" preserveAspectRatio="none" aria-hidden="true">${sparkline(r.share_history.slice(first), 1, color)}</svg>${pct(r.share)}</span></td>
      <td class="num">${r.ejections}</td>
      <td>${action}</td></tr>`;
  }).join('') || '<tr><td colspan="14" class="empty">no replica configured</td></tr>';
}

// mergeDecisions adds a snapshot's decisions (newest first) to the ones
// kept: sequence numbers only grow, unless the balancer restarted.
function mergeDecisions(list) {
  if (list.length && decisions.length && list[0].seq < decisions[0].seq) decisions = [];
  const newest = decisions.length ? decisions[0].seq : 0;
  decisions = list.filter((d) => d.seq > newest).concat(decisions).slice(0, KEEP_DECISIONS);
}

function renderDecisions() {
  const q = $('filter').value.trim().toLowerCase();
  const shown = (q ? decisions.filter((d) => (d.session || '').toLowerCase().includes(q)) : decisions).slice(0, SHOW_DECISIONS);
  $('decisions-count').textContent = q
    ? `${shown.length} of the last ${decisions.length} match`
    : `latest ${shown.length} of ${decisions.length} kept`;
  $('decisions').querySelector('tbody').innerHTML = shown.length ? shown.map((d) => `<tr data-seq="${d.seq}">
      <td class="t">${esc(clock(d.at))}</td>
      <td class="rep">${swatch(d.replica)}${esc(d.replica)}</td>
      <td><span class="badge rt-${esc(d.reason)}">${esc(d.reason)}</span></td>
      <td class="sess" title="${esc(d.session)}">${d.session ? esc(d.session) : '<span class="muted">-</span>'}</td>
      <td class="num">${d.prompt_tokens}</td>
      <td class="why">${esc(d.why)}</td></tr>`).join('')
    : `<tr><td colspan="6" class="empty">${q ? 'no decision for this session key' : 'no routing decision yet'}</td></tr>`;
}

function renderEvents(ts) {
  $('events').innerHTML = ts.length ? ts.map((t) => `<li>${esc(clock(t.at))} ${swatch(t.replica)}<b>${esc(t.replica)}</b>
      ${stateBadge(t.from)} \u2192 ${stateBadge(t.to)}${t.cooldown_seconds ? ' cooldown ' + fmtDur(t.cooldown_seconds) : ''}
      <span class="cause">${esc(t.cause)}</span></li>`).join('')
    : '<li class="empty">no state change since the balancer started</li>';
}

function renderSessions(p) {
  $('k-pins').textContent = p.session + ' · ' + p.prefix;
  $('sessions-note').textContent = `sessions in the last ${p.window} decisions`;
  $('sessions').innerHTML = p.by_replica.map((r) => `<div class="sessions-rep">${swatch(r.replica)}<b>${esc(r.replica)}</b>
      <span class="muted">${r.sessions} session${r.sessions === 1 ? '' : 's'}</span>
      ${r.top.length ? '<ol>' + r.top.map((t) => `<li>${esc(t.session)} <span class="muted">\u00d7${t.requests}</span></li>`).join('') + '</ol>' : ''}</div>`).join('');
}

// renderQueue shows flow control's queue of every model: what waits, for how
// long, by priority and by tenant, and what was refused.
function renderQueue(q) {
  q = q || [];
  const waiting = q.reduce((n, m) => n + m.queued, 0);
  const oldest = Math.max(0, ...q.map((m) => m.oldest_wait_seconds));
  $('k-queued').textContent = waiting;
  $('k-oldest').textContent = waiting ? 'oldest ' + fmtSec(oldest) : 'none waiting';
  $('queue').querySelector('tbody').innerHTML = q.map((m) => {
    const classes = m.classes.map((c) => `<span class="qcell">p${c.priority}: ${c.queued} <span class="muted">${fmtSec(c.oldest_wait_seconds)}</span></span>`).join('') ||
      '<span class="muted">-</span>';
    const tenants = m.tenants.map((t) => `<span class="qcell">${t.tenant ? esc(t.tenant) : '<i>none</i>'} ${t.queued} <span class="muted">\u00b7 ${t.in_flight}</span></span>`).join('') ||
      '<span class="muted">-</span>';
    const refused = Object.entries(m.refused).map(([r, n]) => `${esc(r)} ${n}`).join(', ') || '<span class="muted">none</span>';
    return `<tr data-model="${esc(m.model)}"${m.queued ? ' class="row-waiting"' : ''}>
      <td class="name">${esc(m.model)}</td>
      <td class="num">${m.queued}</td>
      <td class="num">${m.queued ? fmtSec(m.oldest_wait_seconds) : '-'}</td>
      <td>${classes}</td>
      <td>${tenants}</td>
      <td class="num">${m.dispatched}</td>
      <td class="num">${m.expired}</td>
      <td>${refused}</td></tr>`;
  }).join('') || '<tr><td colspan="8" class="empty">no request yet</td></tr>';
}

function render(s) {
  snap = s;
  renderHeader(s);
  renderKPIs(s.fleet);
  renderAlerts(s.alerts);
  renderReplicas(s);
  mergeDecisions(s.decisions);
  renderDecisions();
  renderEvents(s.transitions);
  renderSessions(s.pins);
  renderQueue(s.queue);
}

function setConn(cls, text) {
  const el = $('conn');
  el.className = 'conn ' + cls;
  el.textContent = text;
}

function handleBlock(block) {
  let event = 'message';
  const data = [];
  for (const line of block.split('\n')) {
    if (line.startsWith('event:')) event = line.slice(6).trim();
    else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
  }
  if (event !== 'snapshot' || !data.length) return;
  lastEvent = Date.now();
  setConn('conn-live', 'live');
  render(JSON.parse(data.join('\n')));
}

async function connect() {
  if (controller) controller.abort();
  const ctrl = new AbortController();
  controller = ctrl;
  const headers = { Accept: 'text/event-stream' };
  if (token) headers.Authorization = 'Bearer ' + token;
  try {
    const res = await fetch('/admin/events', { headers, signal: ctrl.signal, cache: 'no-store' });
    if (!res.ok) throw new Error('HTTP ' + res.status);
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value.replace(/\r\n?/g, '\n');
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        handleBlock(buf.slice(0, i));
        buf = buf.slice(i + 2);
      }
    }
    throw new Error('stream ended');
  } catch (err) {
    if (ctrl.signal.aborted) return;
    setConn('conn-down', 'disconnected: ' + err.message + '; retrying');
    setTimeout(() => { if (controller === ctrl) connect(); }, 2000);
  }
}

async function mutate(action, name) {
  const status = $('action-status');
  status.textContent = `${action} ${name}...`;
  const headers = { 'Content-Type': 'application/json' };
  if (token) headers.Authorization = 'Bearer ' + token;
  try {
    const res = await fetch(`/admin/replicas/${encodeURIComponent(name)}/${action}`, {
      method: 'POST', headers, body: '{}', cache: 'no-store',
    });
    if (res.ok) {
      status.textContent = `${action} ${name}: done`;
    } else {
      let msg = 'HTTP ' + res.status;
      try { msg = (await res.json()).error.message || msg; } catch (_) { /* not JSON */ }
      status.textContent = `${action} ${name} failed: ${msg}`;
    }
  } catch (err) {
    status.textContent = `${action} ${name} failed: ${err.message}`;
  }
}

document.addEventListener('DOMContentLoaded', () => {
  $('token').value = token;
  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    token = $('token').value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
    decisions = [];
    connect();
  });
  $('token-forget').addEventListener('click', () => {
    token = '';
    $('token').value = '';
    sessionStorage.removeItem(TOKEN_KEY);
    decisions = [];
    connect();
  });
  $('filter').addEventListener('input', renderDecisions);
  $('replicas').addEventListener('click', (e) => {
    const b = e.target.closest('button[data-action]');
    if (b) mutate(b.dataset.action, b.dataset.name);
  });
  setInterval(() => {
    if (lastEvent && Date.now() - lastEvent > 5000) setConn('conn-wait', 'stale: no update for ' + Math.round((Date.now() - lastEvent) / 1000) + 's');
  }, 1000);
  connect();
});
