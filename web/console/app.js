// Switchyard console: a hash-routed single page over the REST API (/api/v1), signed in with a
// session cookie. Plain browser JavaScript, no build step, nothing fetched from elsewhere, no
// inline code (the page is served with CSP `default-src 'self'`): every element is built with
// the DOM API, never from HTML strings, so API data cannot inject markup.
'use strict';

// Errors are collected where the browser tests can read them (window.__syErrors).
window.__syErrors = window.__syErrors || [];
window.addEventListener('error', (e) => {
  window.__syErrors.push('error: ' + (e.message || (e.target && e.target.src) || String(e)));
}, true);
window.addEventListener('unhandledrejection', (e) => {
  const r = e.reason;
  window.__syErrors.push('unhandled rejection: ' + (r && r.message ? r.message : String(r)));
});
document.addEventListener('securitypolicyviolation', (e) => {
  window.__syErrors.push('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI);
});

(function () {
  // ---- State -------------------------------------------------------------------------------

  const S = {
    me: null,        // {role, team, name, expires_at}
    timers: [],      // page refresh timers, cleared on every navigation
    seq: 0,          // navigation counter: stale async renders check it
    dirty: null,     // the open page's "has unsaved edits?" check, or null
    hash: undefined, // the hash the open page was rendered for
  };

  const ROLES_ALL = ['admin', 'finance', 'infra', 'developer'];
  const PAGES = [
    { id: 'overview', title: 'Overview', roles: ROLES_ALL, render: overviewPage },
    { id: 'catalogue', title: 'Catalogue', roles: ROLES_ALL, render: cataloguePage },
    { id: 'jobs', title: 'Jobs', roles: ROLES_ALL, render: jobsPage },
    { id: 'services', title: 'Services', roles: ROLES_ALL, render: servicesPage },
    { id: 'policies', title: 'Policies', roles: ROLES_ALL, render: policiesPage },
    { id: 'spend', title: 'Spend', roles: ROLES_ALL, render: spendPage },
    { id: 'instances', title: 'Instances', roles: ['admin', 'infra', 'finance'], render: instancesPage },
    { id: 'audit', title: 'Audit', roles: ['admin', 'finance', 'infra'], render: auditPage },
  ];
  // Pages reached by links, not from the top bar.
  const HIDDEN_PAGES = [
    { id: 'nodes', title: 'Node', nav: 'catalogue', roles: ROLES_ALL, render: nodePage },
  ];
  const JOB_STATES = ['queued', 'provisioning', 'held', 'placed', 'running', 'succeeded', 'failed', 'cancelled'];
  const WAITING_STATES = ['queued', 'provisioning', 'held', 'placed', 'running'];
  const PRIORITIES = ['critical', 'high', 'normal', 'low'];
  const TERMINAL = ['succeeded', 'failed', 'cancelled'];
  const PALETTE = ['#2f7dd1', '#e67e22', '#27ae60', '#8e44ad', '#c0392b', '#16a085', '#d4ac0d',
    '#7f8c8d', '#2c3e50', '#e84393', '#00a8b5', '#a0522d'];

  const can = {
    editPolicies: () => S.me && ['admin', 'finance'].includes(S.me.role),
    editPools: () => S.me && ['admin', 'infra'].includes(S.me.role),
    // An owned pool's marginal cost is finance's figure (infra and admins may set it too).
    editMarginal: () => S.me && ['admin', 'infra', 'finance'].includes(S.me.role),
    cancelJobs: () => S.me && ['admin', 'developer'].includes(S.me.role),
    allTeams: () => S.me && S.me.role !== 'developer',
  };

  // ---- DOM helpers -------------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    append(el, children);
    return el;
  }

  const SVG_NS = 'http://www.w3.org/2000/svg';
  function s(tag, attrs, ...children) {
    const el = document.createElementNS(SVG_NS, tag);
    setAttrs(el, attrs);
    append(el, children);
    return el;
  }

  function setAttrs(el, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith('on') && typeof v === 'function') {
        el.addEventListener(k.slice(2), v);
      } else if (k === 'text') {
        el.textContent = String(v);
      } else if (k === 'value') {
        el.value = v;
      } else if (k === 'checked' || k === 'disabled' || k === 'selected' || k === 'hidden') {
        el[k] = Boolean(v);
      } else {
        el.setAttribute(k, v === true ? '' : String(v));
      }
    }
  }

  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  function $(sel, root) { return (root || document).querySelector(sel); }

  function toast(message, bad) {
    const t = $('#toast');
    t.textContent = message;
    t.className = 'toast' + (bad ? ' bad' : '');
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, 3500);
  }

  function notice(message, bad, test) {
    return h('div', { class: 'notice' + (bad ? ' bad' : ''), role: 'alert', 'data-test': test || 'notice' }, message);
  }

  /// On a phone, a `stack` table shows each row as a card: every cell gets its column's
  /// name (`data-label`, drawn by the style sheet) and its content wrapped in one box.
  function labelCells(tr, labels) {
    [...tr.children].forEach((td, i) => {
      if (td.tagName !== 'TD' || td.hasAttribute('colspan')) return;
      td.setAttribute('data-label', labels[i] || '');
      const cell = h('div', { class: 'cell' });
      while (td.firstChild) cell.appendChild(td.firstChild);
      td.appendChild(cell);
    });
  }

  function table(headers, rows, opts) {
    opts = opts || {};
    if (opts.stack) {
      const labels = headers.map((hd) => (Array.isArray(hd) ? hd[0] : hd));
      rows.forEach((tr) => labelCells(tr, labels));
    }
    const thead = h('thead', null, h('tr', null, headers.map((hd) => {
      const [label, cls] = Array.isArray(hd) ? hd : [hd, ''];
      return h('th', { class: cls || null }, label);
    })));
    const tbody = h('tbody', { 'data-test': opts.bodyTest || null }, rows);
    const t = h('table', { 'data-test': opts.test || null, class: opts.stack ? 'stack' : null }, thead, tbody);
    const wrap = h('div', { class: 'table-wrap' }, t);
    if (!rows.length) wrap.appendChild(h('p', { class: 'empty', 'data-test': (opts.test || 'table') + '-empty' }, opts.empty || 'Nothing here yet.'));
    return wrap;
  }

  function badge(text, extra) {
    return h('span', { class: 'badge ' + String(text || '').replace(/[^a-z_]/g, '') + (extra ? ' ' + extra : '') }, text || '—');
  }

  function bar(fraction, opts) {
    opts = opts || {};
    const wrap = h('div', { class: 'bar' + (opts.cls ? ' ' + opts.cls : ''), role: 'img', 'aria-label': opts.label || pct(fraction) });
    if (opts.committed !== undefined) {
      const c = h('span', { class: 'committed' });
      c.style.width = clampPct(opts.committed);
      wrap.appendChild(c);
    }
    const sp = h('span', { class: 'spent' });
    sp.style.width = clampPct(fraction);
    wrap.appendChild(sp);
    return wrap;
  }

  function clampPct(f) {
    const v = Math.max(0, Math.min(1, Number(f) || 0));
    return (v * 100).toFixed(1) + '%';
  }

  // ---- Formatting --------------------------------------------------------------------------

  /// Money as money, one format everywhere: whole cents ("$12.50", "$1,204.00"), and below a
  /// dollar a fraction of a cent where it matters ("$0.0145"), never float noise.
  function usd(x) {
    const n = Number(x);
    if (!Number.isFinite(n)) return '—';
    const abs = Math.abs(n);
    const cents = Math.round(abs * 100) / 100;
    const fine = Math.round(abs * 10000) / 10000;
    let digits = 2;
    if (abs !== 0 && abs < 1 && Math.abs(fine - cents) >= 0.00005) digits = 4;
    const text = (digits === 4 ? fine : cents).toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: digits });
    if (abs !== 0 && fine === 0) return (n < 0 ? '-' : '') + '<$0.0001';
    return (n < 0 ? '-$' : '$') + text;
  }

  function pct(f) {
    const n = Number(f);
    return Number.isFinite(n) ? (n * 100).toFixed(n < 0.1 && n > 0 ? 1 : 0) + '%' : '—';
  }

  /// A time (RFC 3339) as `2026-07-01 14:03:09 UTC`.
  function dt(iso) {
    if (iso === null || iso === undefined || iso === '') return '—';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return d.toISOString().slice(0, 19).replace('T', ' ') + ' UTC';
  }

  function dtShort(iso) {
    if (iso === null || iso === undefined || iso === '') return '—';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return d.toISOString().slice(5, 19).replace('T', ' ');
  }

  function ago(iso) {
    if (!iso) return '—';
    const t = new Date(iso).getTime();
    if (Number.isNaN(t)) return String(iso);
    return duration((Date.now() - t) / 1000) + ' ago';
  }

  function duration(secs) {
    const v = Math.max(0, Math.round(Number(secs) || 0));
    if (v < 90) return v + ' s';
    if (v < 3600) return Math.floor(v / 60) + ' min' + (v % 60 ? ' ' + (v % 60) + ' s' : '');
    if (v < 172800) return Math.floor(v / 3600) + ' h' + (Math.round((v % 3600) / 60) ? ' ' + Math.round((v % 3600) / 60) + ' min' : '');
    return (v / 86400).toFixed(1) + ' d';
  }

  /// Seconds between two times (the second defaults to now), or null.
  function between(a, b) {
    if (!a) return null;
    const t0 = new Date(a).getTime();
    const t1 = b ? new Date(b).getTime() : Date.now();
    return Number.isFinite(t0) && Number.isFinite(t1) ? Math.max(0, (t1 - t0) / 1000) : null;
  }

  // Ids are UUIDv7: their first digits are a timestamp shared by jobs submitted together.
  function short(id) { return String(id || '').slice(-8); }

  // Explanation fields that carry times (RFC 3339); money comes as `*_usd` dollars.
  const TIME_KEYS = ['finish', 'deadline', 'expected_start', 'start', 'at'];

  function fieldValue(k, x) {
    if (x === null || x === undefined) return '—';
    if (/_usd$/.test(k)) return usd(x);
    if (TIME_KEYS.includes(k) || /_at$/.test(k)) return dt(x);
    if (typeof x === 'object') return JSON.stringify(x);
    // Enumerations read as words; ids (pools, nodes) stay as they are.
    return ['market', 'kind', 'decision', 'code'].includes(k) ? String(x).replace(/_/g, ' ') : String(x);
  }

  function fieldName(k) {
    return k.replace(/_usd$/, '').replace(/_/g, ' ');
  }

  /// An outcome or rejection in words: "misses deadline: finish 2026-… UTC, deadline …".
  function describe(v) {
    if (v === null || v === undefined) return '—';
    if (typeof v !== 'object') return String(v).replace(/_/g, ' ');
    const tag = v.code || v.decision || v.kind;
    if (v.decision === 'hold' && v.reason) return 'held: ' + v.reason;
    // Rejections come in the broker's own words (their times shown as dates here).
    if (typeof v.message === 'string' && v.message) {
      const words = tag ? String(tag).replace(/_/g, ' ') : '';
      const msg = v.message.replace(/\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)/g, (m) => dt(m));
      return !words || msg.toLowerCase().startsWith(words.toLowerCase()) ? msg : words + ': ' + msg;
    }
    const rest = Object.entries(v)
      .filter(([k]) => !['code', 'decision', 'kind'].includes(k))
      .map(([k, x]) => fieldName(k) + ' ' + fieldValue(k, x));
    return [tag ? String(tag).replace(/_/g, ' ') : null, rest.join(', ')].filter(Boolean).join(': ');
  }

  function teamLabel(team, project) { return project ? team + ' / ' + project : team; }

  // ---- API ---------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      const err = (body && body.error) || {};
      super(err.message || ('HTTP ' + status));
      this.status = status;
      this.code = err.code || ('http_' + status);
      this.field = err.field || null;
    }
  }

  function csrfToken() {
    const m = document.cookie.match(/(?:^|;\s*)sy_csrf=([^;]*)/);
    return m ? decodeURIComponent(m[1]) : '';
  }

  async function api(method, path, body, extraHeaders) {
    const headers = Object.assign({ Accept: 'application/json' }, extraHeaders || {});
    if (method !== 'GET' && method !== 'HEAD') headers['X-CSRF-Token'] = csrfToken();
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (_) { data = text; }
    }
    if (res.status === 401 && !path.startsWith('/console/')) {
      signedOut('Your session ended. Sign in again.');
    }
    if (!res.ok) throw new ApiError(res.status, data);
    return { data, headers: res.headers, status: res.status };
  }

  const get = async (path) => (await api('GET', path)).data;

  function qs(params) {
    const parts = Object.entries(params)
      .filter(([, v]) => v !== null && v !== undefined && v !== '')
      .map(([k, v]) => encodeURIComponent(k) + '=' + encodeURIComponent(v));
    return parts.length ? '?' + parts.join('&') : '';
  }

  /// Resolves to the data or to an ApiError (never rejects), for pages that show what loaded.
  function settle(promise) {
    return promise.then((d) => d, (e) => (e instanceof ApiError ? e : new ApiError(0, { error: { message: String(e && e.message || e) } })));
  }

  // ---- Session -----------------------------------------------------------------------------

  async function boot() {
    $('#login-form').addEventListener('submit', onLogin);
    $('#logout').addEventListener('click', onLogout);
    window.addEventListener('hashchange', onHashChange);
    try {
      const r = await api('GET', '/console/session');
      if (r.data && r.data.signed_in) {
        S.me = r.data;
      }
    } catch (e) {
      // Shown on the sign-in form below.
      $('#login-error').textContent = 'Could not reach the broker: ' + e.message;
      $('#login-error').hidden = false;
    }
    route();
  }

  async function onLogin(ev) {
    ev.preventDefault();
    const input = $('#login-token');
    const err = $('#login-error');
    const button = $('#login-submit');
    err.hidden = true;
    button.disabled = true;
    try {
      const r = await api('POST', '/console/login', { token: input.value.trim() });
      S.me = r.data;
      input.value = '';
      if (!location.hash || location.hash === '#/login' || location.hash === '#/') {
        location.hash = '#/overview';
      }
      route();
    } catch (e) {
      err.textContent = e.status === 401 ? 'That token is not valid, or it was revoked.' : e.message;
      err.hidden = false;
    } finally {
      button.disabled = false;
    }
  }

  async function onLogout() {
    try {
      await api('POST', '/console/logout');
    } catch (_) {
      // The session is gone either way.
    }
    signedOut('Signed out.');
  }

  function signedOut(message) {
    const was = S.me;
    S.me = null;
    if (was) {
      const err = $('#login-error');
      err.textContent = message;
      err.hidden = false;
    }
    route();
  }

  // ---- Routing -----------------------------------------------------------------------------

  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, '');
    const [path, query] = raw.split('?');
    const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
    const params = {};
    for (const kv of (query || '').split('&').filter(Boolean)) {
      const [k, v] = kv.split('=');
      params[decodeURIComponent(k)] = decodeURIComponent(v || '');
    }
    return { page: parts[0] || 'overview', args: parts.slice(1), params };
  }

  function stopTimers() {
    S.timers.forEach((t) => clearInterval(t));
    S.timers = [];
  }

  function every(ms, fn) {
    S.timers.push(setInterval(fn, ms));
  }

  /// A page with unsaved edits sets `S.dirty` to a function answering whether it has some.
  /// Leaving such a page (another hash, a reload, closing the tab) asks first.
  function isDirty() { return Boolean(S.dirty && S.dirty()); }

  window.addEventListener('beforeunload', (ev) => {
    if (!isDirty()) return undefined;
    ev.preventDefault();
    ev.returnValue = 'You have unsaved changes.';
    return ev.returnValue;
  });

  function onHashChange() {
    if (S.hash !== undefined && location.hash !== S.hash && isDirty()) {
      const wanted = location.hash;
      // Stay where the edits are (replaceState fires no hashchange) and ask.
      history.replaceState(null, '', S.hash || '#/');
      unsavedBar(wanted);
      return;
    }
    route();
  }

  function unsavedBar(wanted) {
    const old = $('#unsaved-bar');
    if (old) old.remove();
    const bar = h('div', { id: 'unsaved-bar', class: 'notice unsaved', role: 'alertdialog', 'data-test': 'unsaved-bar' },
      h('strong', null, 'Unsaved changes — discard?'), ' ',
      h('span', { class: 'muted small' }, 'Your edits to this page are not saved.'), ' ',
      h('button', {
        type: 'button', class: 'danger', 'data-test': 'unsaved-discard',
        onclick: () => { S.dirty = null; bar.remove(); location.hash = wanted; },
      }, 'Discard and leave'), ' ',
      h('button', { type: 'button', class: 'secondary', 'data-test': 'unsaved-stay', onclick: () => bar.remove() }, 'Stay'));
    $('#main').insertBefore(bar, $('#main').firstChild);
  }

  function route() {
    stopTimers();
    S.seq += 1;
    S.dirty = null;
    S.hash = location.hash;
    const bar = $('#unsaved-bar');
    if (bar) bar.remove();
    const page = $('#page');
    clear(page);
    if (!S.me) {
      $('#nav').hidden = true;
      $('#who').hidden = true;
      $('#login').hidden = false;
      document.title = 'Sign in · Switchyard';
      $('#login-token').focus();
      return;
    }
    $('#login').hidden = true;
    renderNav();
    const { page: id, args, params } = parseHash();
    const known = PAGES.find((p) => p.id === id) || HIDDEN_PAGES.find((p) => p.id === id);
    let def = known && known.roles.includes(S.me.role) ? known : null;
    let refusal = null;
    if (!def) {
      if (known) {
        refusal = known;
      } else if (id !== 'overview' && id !== 'login') {
        toast('No such page here: ' + id, true);
      }
      if (!refusal) def = PAGES[0];
    }
    const navId = def ? (def.nav || def.id) : null;
    for (const a of document.querySelectorAll('#nav a')) {
      a.classList.toggle('active', a.getAttribute('data-page') === navId);
    }
    if (refusal) {
      document.title = refusal.title + ' · Switchyard';
      page.appendChild(h('section', { class: 'page', id: 'page-' + refusal.id, 'data-test': 'page-' + refusal.id, 'data-state': 'ready' },
        h('h1', null, refusal.title),
        notice(refusal.title + ' is not visible to your role (' + S.me.role + ').', false, 'not-visible')));
      return;
    }
    document.title = def.title + ' · Switchyard';
    const root = h('section', { class: 'page', id: 'page-' + def.id, 'data-test': 'page-' + def.id, 'data-state': 'loading' });
    page.appendChild(root);
    const seq = S.seq;
    Promise.resolve()
      .then(() => def.render(root, args, params, seq))
      .then(() => { root.setAttribute('data-state', 'ready'); })
      .catch((e) => {
        root.setAttribute('data-state', 'error');
        root.appendChild(notice(e && e.message ? e.message : String(e), true, 'page-error'));
      });
  }

  function renderNav() {
    const nav = clear($('#nav'));
    for (const p of PAGES) {
      if (!p.roles.includes(S.me.role)) continue;
      nav.appendChild(h('a', { href: '#/' + p.id, 'data-page': p.id, 'data-test': 'nav-' + p.id }, p.title));
    }
    nav.hidden = false;
    $('#who').hidden = false;
    $('#who-label').textContent = (S.me.name ? S.me.name + ' · ' : '') + S.me.role + (S.me.team ? ' · ' + S.me.team : '');
  }

  const live = (seq) => seq === S.seq;

  // ---- Overview ----------------------------------------------------------------------------

  async function overviewPage(root, _args, _params, seq) {
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Overview'),
      h('span', { class: 'muted small', 'data-test': 'overview-updated' }, 'as of ' + dt(new Date().toISOString()))));
    const [budgets, pools, ...jobLists] = await Promise.all([
      settle(get('/api/v1/budgets')),
      settle(get('/api/v1/pools')),
      ...WAITING_STATES.map((st) => settle(get('/api/v1/jobs' + qs({ state: st, limit: 500 })))),
    ]);
    if (!live(seq)) return;
    const jobs = jobLists.flatMap((l) => (l instanceof ApiError ? [] : l.jobs));
    const poolRows = pools instanceof ApiError ? [] : pools.pools;
    const count = (st) => jobs.filter((j) => j.state === st).length;
    const gpusTotal = poolRows.reduce((a, p) => a + p.gpus_total, 0);
    const gpusFree = poolRows.reduce((a, p) => a + p.gpus_free, 0);
    const budgetRows = budgets instanceof ApiError ? [] : budgets.budgets;
    // Budgets of different periods are never added up: one figure per period.
    const periods = periodGroups(budgetRows);

    root.appendChild(h('div', { class: 'cards', 'data-test': 'overview-cards' },
      card('Running jobs', count('running'), 'card-running'),
      card('Waiting', count('queued') + count('provisioning') + count('placed'), 'card-waiting'),
      card('Held', count('held'), 'card-held'),
      card('GPUs in use', (gpusTotal - gpusFree) + ' / ' + gpusTotal, 'card-gpus'),
      periods.map((g) => {
        const c = card('Spent this ' + g.label + ' (of ' + usd(g.amount) + ')', usd(g.spent), 'card-spent');
        c.setAttribute('data-period', g.label);
        c.title = g.budgets.map((x) => teamLabel(x.team, x.project)).join(', ') + ': ' + dt(g.start).slice(0, 10) + ' → ' + dt(g.end).slice(0, 10);
        return c;
      })));

    // Spend trend of each budget period, with the budget line and a forecast.
    const trend = h('div', { class: 'panel', 'data-test': 'overview-trend' }, h('h2', null, 'Spend trend'));
    root.appendChild(trend);
    const groups = periods.length ? periods : [monthGroup()];
    const spendRes = await Promise.all(groups.map((g) => settle(get('/api/v1/spend' + qs({
      group_by: 'team', bucket: 'day', from: new Date(g.start).toISOString(), to: new Date(Date.now() + 60000).toISOString(),
    })))));
    if (!live(seq)) return;
    groups.forEach((g, i) => {
      const r = spendRes[i];
      const box = h('div', { class: 'trend', 'data-test': 'trend', 'data-period': g.label });
      trend.appendChild(box);
      box.appendChild(h('h3', null, g.budgets.length
        ? 'This ' + g.label + ': ' + g.budgets.map((x) => teamLabel(x.team, x.project)).join(', ')
        : 'This month, all teams (no budget set)'));
      if (r instanceof ApiError) { box.appendChild(notice('Spend is not available: ' + r.message, r.status !== 404)); return; }
      const teams = new Set(g.budgets.filter((x) => !x.project).map((x) => x.team));
      const rows = g.budgets.length ? r.rows.filter((x) => teams.has(x.team)) : r.rows;
      box.appendChild(trendChart(g, rows, chartWidth(trend)));
    });

    const grid = h('div', { class: 'grid two' });
    root.appendChild(grid);

    // Spend against budget.
    const bp = h('div', { class: 'panel wide', 'data-test': 'overview-budgets' }, h('h2', null, 'Spend against budget'));
    if (budgets instanceof ApiError) {
      bp.appendChild(notice('Budgets are not available: ' + budgets.message, budgets.status !== 404));
    } else {
      bp.appendChild(table(
        ['Team', ['Period', 'hide-narrow'], ['Spent', 'num'], ['Budget', 'num'], 'Use', ''],
        budgetRows.map((b) => {
          const amount = Number(b.amount_usd) || 0;
          const frac = amount > 0 ? Number(b.spent_usd) / amount : 0;
          const committed = amount > 0 ? (Number(b.spent_usd) + Number(b.committed_usd || 0)) / amount : 0;
          const cls = frac >= 1 ? 'over' : (b.alerts_crossed && b.alerts_crossed.length ? 'warn' : '');
          return h('tr', { 'data-test': 'budget-row', 'data-team': b.team },
            h('td', null, teamLabel(b.team, b.project)),
            h('td', { class: 'small hide-narrow', title: dt(b.period_start) + ' → ' + dt(b.period_end) }, periodLabel(b.period_start, b.period_end).replace(/^(week|month)$/, 'this $1'),
              h('div', { class: 'muted' }, dt(b.period_start).slice(0, 10) + ' → ' + dt(b.period_end).slice(0, 10))),
            h('td', { class: 'num', 'data-test': 'budget-spent' }, usd(b.spent_usd)),
            h('td', { class: 'num', 'data-test': 'budget-amount' }, usd(amount)),
            h('td', null, bar(frac, { committed, cls, label: pct(frac) + ' spent' }),
              h('div', { class: 'small muted' }, pct(frac) + ' spent, ' + usd(b.committed_usd) + ' committed'),
              alertText(b) ? h('div', { class: 'small alert-text', role: 'status', 'data-test': 'budget-alerts' }, alertText(b)) : null),
            h('td', null, badge(b.enforcement)));
        }),
        { test: 'budgets-table', empty: 'No budgets yet: set one on the Policies page.' }));
    }
    grid.appendChild(bp);

    // GPU utilisation per region.
    const byRegion = new Map();
    for (const p of poolRows) {
      const r = byRegion.get(p.region) || { region: p.region, provider: p.provider, total: 0, free: 0, nodes: 0 };
      r.total += p.gpus_total; r.free += p.gpus_free; r.nodes += p.nodes;
      byRegion.set(p.region, r);
    }
    const regions = [...byRegion.values()].filter((r) => r.total > 0 || r.nodes > 0)
      .sort((a, b) => (b.total - b.free) - (a.total - a.free) || a.region.localeCompare(b.region));
    const up = h('div', { class: 'panel', 'data-test': 'overview-utilisation' }, h('h2', null, 'GPU utilisation by region'));
    if (pools instanceof ApiError) up.appendChild(notice(pools.message, true));
    up.appendChild(table(['Region', ['GPUs used', 'num'], 'Utilisation'],
      regions.map((r) => {
        const used = r.total - r.free;
        const f = r.total ? used / r.total : 0;
        return h('tr', { 'data-test': 'util-row', 'data-region': r.region },
          h('td', null, r.region),
          h('td', { class: 'num' }, used + ' / ' + r.total),
          h('td', null, bar(f), h('div', { class: 'small muted' }, pct(f))));
      }),
      { test: 'utilisation-table', empty: 'No nodes have joined yet: regions without nodes are on the Catalogue page.' }));
    grid.appendChild(up);

    // Queue by priority.
    const qp = h('div', { class: 'panel', 'data-test': 'overview-queue' }, h('h2', null, 'Queue by priority'));
    const cols = [['queued', ['queued']], ['starting', ['provisioning', 'placed']], ['held', ['held']], ['running', ['running']]];
    qp.appendChild(table(['Priority', ...cols.map(([c]) => [c, 'num'])],
      PRIORITIES.map((p) => h('tr', { 'data-test': 'queue-row', 'data-priority': p },
        h('td', null, p),
        cols.map(([c, states]) => h('td', { class: 'num', 'data-test': 'queue-' + c },
          String(jobs.filter((j) => j.priority === p && states.includes(j.state)).length))))),
      { test: 'queue-table' }));
    const held = jobs.filter((j) => j.state === 'held').slice(0, 8);
    if (held.length) {
      qp.appendChild(h('h3', null, 'Held jobs'));
      const reasons = await Promise.all(held.map((j) => settle(get('/api/v1/jobs/' + encodeURIComponent(j.id) + '/placement'))));
      if (!live(seq)) return;
      qp.appendChild(h('ul', { 'data-test': 'held-list' }, held.map((j, i) => {
        const p = reasons[i];
        const words = !(p instanceof ApiError) && p.outcome && p.outcome.reason ? p.outcome.reason : (j.reason || 'held');
        return h('li', { 'data-test': 'held-job', 'data-job-id': j.id },
          h('a', { href: '#/jobs/' + j.id }, j.name), ' (' + teamLabel(j.team, j.project) + '): ',
          h('span', { class: 'muted', 'data-test': 'held-reason' }, String(words).replace(/_/g, ' ')), ' · ',
          h('a', { href: '#/policies/' + encodeURIComponent(j.team) + (j.project ? '/' + encodeURIComponent(j.project) : ''), 'data-test': 'held-policy-link' }, 'policy of ' + j.team));
      })));
    }
    grid.appendChild(qp);

    // Idle GPU-hours this month by team, and the jobs that wasted most (the waste rule, issue 28;
    // `GET /api/v1/waste` is for admin, finance and infra).
    if (S.me.role !== 'developer') {
      const waste = await settle(get('/api/v1/waste' + qs({ period: 'month' })));
      if (!live(seq)) return;
      const wp = h('div', { class: 'panel', 'data-test': 'overview-waste' }, h('h2', null, 'Idle GPU-hours this month, by team'));
      const gpuHours = (x) => (Number(x) || 0).toFixed(2);
      if (waste instanceof ApiError) {
        wp.appendChild(notice('Idle GPU-hours are not available: ' + waste.message, waste.status !== 404));
      } else {
        wp.appendChild(table(['Team', ['Idle GPU-hours', 'num'], ['Jobs', 'num']],
          waste.teams.map((t) => h('tr', { 'data-test': 'waste-team-row', 'data-team': t.team },
            h('td', null, t.team),
            h('td', { class: 'num', 'data-test': 'waste-hours' }, gpuHours(t.idle_gpu_hours)),
            h('td', { class: 'num' }, String(t.jobs)))),
          { test: 'waste-teams-table', empty: 'No GPU time judged this month.' }));
        const worst = waste.worst.filter((j) => j.idle_gpu_hours > 0).slice(0, 8);
        if (worst.length) {
          wp.appendChild(h('h3', null, 'Worst jobs'));
          wp.appendChild(table(['Job', 'Team', ['Idle GPU-hours', 'num'], 'Rule'],
            worst.map((j) => h('tr', { 'data-test': 'waste-job', 'data-job-id': j.job_id },
              h('td', null, h('a', { href: '#/jobs/' + j.job_id }, j.name)),
              h('td', null, teamLabel(j.team, j.project)),
              h('td', { class: 'num' }, gpuHours(j.idle_gpu_hours)),
              h('td', { class: 'small', title: j.reason || '' }, j.action ? badge(j.action) : (j.idle_since ? 'idle now' : '—')))),
            { test: 'waste-jobs-table' }));
        }
      }
      grid.appendChild(wp);
    }
  }

  /// The budget's `alert_at` thresholds its spend has crossed this period, as words
  /// ("50%, 90% alerts crossed"); '' when none.
  function alertText(b) {
    const crossed = (b.alerts_crossed || []).map(Number).filter(Number.isFinite).sort((x, y) => x - y);
    if (!crossed.length) return '';
    return crossed.map(pct).join(', ') + (crossed.length === 1 ? ' alert' : ' alerts') + ' crossed';
  }

  /// Budgets grouped by their period (start and end), each labelled by what it is: a calendar
  /// month, an ISO week, or a custom range. Sums only within a group.
  function periodGroups(budgets) {
    const m = new Map();
    for (const b of budgets) {
      const k = b.period_start + '|' + b.period_end;
      if (!m.has(k)) m.set(k, { start: b.period_start, end: b.period_end, label: periodLabel(b.period_start, b.period_end), budgets: [], spent: 0, amount: 0 });
      const g = m.get(k);
      g.budgets.push(b);
      g.spent += Number(b.spent_usd) || 0;
      g.amount += Number(b.amount_usd) || 0;
    }
    return [...m.values()].sort((a, b) => new Date(a.end) - new Date(b.end));
  }

  function periodLabel(start, end) {
    const a = new Date(start);
    const b = new Date(end);
    const days = (b - a) / 86400000;
    if (Math.abs(days - 7) < 0.01 && a.getUTCDay() === 1) return 'week';
    if (a.getUTCDate() === 1 && b.getUTCDate() === 1 && days >= 28 && days <= 31) return 'month';
    return 'period ' + dt(start).slice(0, 10) + ' → ' + dt(end).slice(0, 10);
  }

  function monthGroup() {
    const n = new Date();
    const start = new Date(Date.UTC(n.getUTCFullYear(), n.getUTCMonth(), 1)).toISOString();
    const end = new Date(Date.UTC(n.getUTCFullYear(), n.getUTCMonth() + 1, 1)).toISOString();
    return { start, end, label: 'month', budgets: [], spent: 0, amount: 0 };
  }

  /// Cumulative spend per day of the period so far, the budget as a line, and a linear forecast
  /// to the end of the period (the rate so far, continued).
  function trendChart(g, rows, CW) {
    const start = new Date(g.start).getTime();
    const end = new Date(g.end).getTime();
    const now = Date.now();
    const days = [];
    for (let t = start; t < end; t += 86400000) days.push(new Date(t).toISOString().slice(0, 10));
    const perDay = new Map();
    for (const r of rows) {
      const k = String(r.bucket_start || '').slice(0, 10);
      perDay.set(k, (perDay.get(k) || 0) + Number(r.amount_usd));
    }
    const today = new Date(now).toISOString().slice(0, 10);
    let acc = 0;
    const values = [];
    for (const d of days) {
      if (d > today) break;
      acc += perDay.get(d) || 0;
      values.push(acc);
    }
    const elapsed = Math.max(1, Math.min(now, end) - start);
    const forecast = acc * (end - start) / elapsed;
    const max = niceMax(Math.max(acc, forecast, g.amount || 0));
    const svgEl = s('svg', { class: 'chart', viewBox: '0 0 ' + CW + ' ' + CH, width: CW, height: CH, role: 'img', 'aria-label': 'spend trend this ' + g.label, 'data-test': 'chart-trend' });
    axes(svgEl, days, max, CW);
    const iw = CW - PAD.l - PAD.r;
    const ih = CH - PAD.t - PAD.b;
    const x = (i) => PAD.l + (iw * (i + 0.5)) / days.length;
    const y = (v) => PAD.t + ih - (ih * v) / max;
    if (g.amount > 0) {
      svgEl.appendChild(s('line', { x1: PAD.l, x2: CW - PAD.r, y1: y(g.amount).toFixed(1), y2: y(g.amount).toFixed(1), stroke: '#c0392b', 'stroke-width': 1.5, 'stroke-dasharray': '2 3', 'data-test': 'trend-budget' },
        s('title', null, 'budget ' + usd(g.amount))));
    }
    if (values.length) {
      const pts = values.map((v, i) => [x(i), y(v)]);
      svgEl.appendChild(s('path', { d: pts.map((p, i) => (i ? 'L' : 'M') + p[0].toFixed(1) + ' ' + p[1].toFixed(1)).join(' '), fill: 'none', stroke: '#2f7dd1', 'stroke-width': 2, 'data-test': 'trend-spent' }));
      pts.forEach((p, i) => svgEl.appendChild(s('circle', { cx: p[0].toFixed(1), cy: p[1].toFixed(1), r: 2.5, fill: '#2f7dd1' }, s('title', null, days[i] + ': ' + usd(values[i])))));
      const last = pts[pts.length - 1];
      svgEl.appendChild(s('path', { d: 'M' + last[0].toFixed(1) + ' ' + last[1].toFixed(1) + ' L' + x(days.length - 1).toFixed(1) + ' ' + y(forecast).toFixed(1), fill: 'none', stroke: '#2f7dd1', 'stroke-width': 1.5, 'stroke-dasharray': '5 4', 'data-test': 'trend-forecast' },
        s('title', null, 'forecast (linear) ' + usd(forecast))));
    }
    const sw = (color, dash) => { const e = h('span', { class: 'sw' + (dash ? ' dash' : '') }); e.style.background = color; return e; };
    return h('div', null, svgEl, h('div', { class: 'legend', 'data-test': 'trend-legend' },
      h('span', null, sw('#2f7dd1'), 'spent ' + usd(acc)),
      h('span', { 'data-test': 'trend-forecast-label' }, sw('#9cc3ec', true), 'forecast (linear): ' + usd(forecast) + ' by ' + dt(g.end).slice(0, 10)),
      g.amount > 0 ? h('span', null, sw('#c0392b'), 'budget ' + usd(g.amount)) : null));
  }

  function card(label, value, test) {
    return h('div', { class: 'card', 'data-test': test }, h('div', { class: 'value' }, String(value)), h('div', { class: 'label' }, label));
  }

  // ---- Catalogue ---------------------------------------------------------------------------

  async function cataloguePage(root, _args, params, seq) {
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Catalogue'),
      h('span', { class: 'muted small' }, 'Every pool: price per GPU-hour, latency, capacity and how fresh the price is.')));
    const data = await get('/api/v1/pools');
    if (!live(seq)) return;
    const pools = data.pools;
    const providers = [...new Set(pools.map((p) => p.provider))].sort();
    const models = [...new Set(pools.map((p) => p.gpu_model))].sort();
    const provSel = h('select', { id: 'cat-provider', 'data-test': 'filter-provider' },
      h('option', { value: '' }, 'All providers'), providers.map((p) => h('option', { value: p, selected: params.provider === p }, p)));
    const modelSel = h('select', { id: 'cat-model', 'data-test': 'filter-model' },
      h('option', { value: '' }, 'All GPU models'), models.map((m) => h('option', { value: m }, m)));
    const search = h('input', { id: 'cat-search', type: 'text', placeholder: 'region or pool', 'data-test': 'filter-search' });
    const sortSel = h('select', { id: 'cat-sort', 'data-test': 'filter-sort' },
      h('option', { value: 'price' }, 'Cheapest first'), h('option', { value: 'latency' }, 'Lowest latency'),
      h('option', { value: 'free' }, 'Most free GPUs'), h('option', { value: 'id' }, 'By id'));
    root.appendChild(h('div', { class: 'filters' },
      field('Provider', provSel, 'cat-provider'), field('GPU model', modelSel, 'cat-model'),
      field('Search', search, 'cat-search'), field('Sort', sortSel, 'cat-sort')));
    const holder = h('div', { class: 'panel' });
    root.appendChild(holder);
    const draw = () => {
      const q = search.value.trim().toLowerCase();
      const rows = pools.filter((p) => (!provSel.value || p.provider === provSel.value)
        && (!modelSel.value || p.gpu_model === modelSel.value)
        && (!q || p.id.toLowerCase().includes(q) || p.region.toLowerCase().includes(q)));
      const key = sortSel.value;
      rows.sort((a, b) => (key === 'price' ? a.price_per_gpu_hour - b.price_per_gpu_hour
        : key === 'latency' ? a.latency_ms - b.latency_ms
          : key === 'free' ? b.gpus_free - a.gpus_free : 0) || a.id.localeCompare(b.id));
      clear(holder);
      holder.appendChild(h('p', { class: 'muted small', 'data-test': 'pool-count' }, rows.length + ' of ' + pools.length + ' pools'));
      const trs = [];
      for (const p of rows) {
        const used = p.gpus_total - p.gpus_free;
        const util = p.gpus_total ? used / p.gpus_total : 0;
        const tr = h('tr', { 'data-test': 'pool-row', 'data-pool': p.id },
          h('td', null, h('div', { class: 'mono small' }, p.id), h('div', { class: 'small muted' }, p.instance_type)),
          h('td', { class: 'hide-narrow' }, p.provider),
          h('td', { class: 'hide-narrow' }, p.region),
          h('td', null, p.gpu_model + ' ×' + p.gpus_per_node, h('div', { class: 'small muted' }, p.gpu_memory_gb + ' GB')),
          h('td', { class: 'num', 'data-test': 'pool-price' }, usd(p.price_per_gpu_hour)),
          h('td', {
            class: 'num hide-narrow', 'data-test': 'pool-cash',
            title: p.launchable ? 'a cloud pool costs its price' : (p.marginal_set ? 'marginal cost set by finance' : 'default: a fifth of the internal rate'),
          }, p.cash_per_gpu_hour === undefined ? '—' : usd(p.cash_per_gpu_hour), !p.launchable && !p.marginal_set ? h('div', { class: 'small muted' }, 'default') : null),
          h('td', { class: 'num hide-narrow' }, p.spot_price_per_gpu_hour === null || p.spot_price_per_gpu_hour === undefined ? '—' : usd(p.spot_price_per_gpu_hour)),
          h('td', { class: 'num' }, p.latency_ms + ' ms'),
          h('td', { class: 'hide-narrow', 'data-test': 'pool-nodes' }, nodesCell(p)),
          h('td', { class: 'num', 'data-test': 'pool-free' }, freeCell(p)),
          h('td', null, bar(util), h('div', { class: 'small muted' }, pct(util))),
          h('td', { class: 'num', title: dt(p.price_updated_at), 'data-test': 'pool-price-age' }, ago(p.price_updated_at)),
          can.editPools() || (can.editMarginal() && !p.launchable) ? h('td', null, h('button', {
            type: 'button', class: 'secondary', 'data-test': 'pool-edit',
            onclick: () => togglePoolEditor(tr, p),
          }, 'Edit')) : (can.editMarginal() ? h('td') : null));
        trs.push(tr);
      }
      holder.appendChild(table(['Pool', ['Provider', 'hide-narrow'], ['Region', 'hide-narrow'], 'GPU', ['$/GPU-h', 'num'], ['Cash $/GPU-h', 'num hide-narrow'], ['Spot', 'num hide-narrow'], ['Latency', 'num'],
        ['Nodes', 'hide-narrow'], ['GPUs free', 'num'], 'Utilisation', ['Price age', 'num'], can.editMarginal() ? '' : null].filter((x) => x !== null),
      trs, { test: 'pools-table', empty: 'No pool matches.', stack: true }));
    };
    [provSel, modelSel, sortSel].forEach((el) => el.addEventListener('change', draw));
    search.addEventListener('input', draw);
    draw();
  }

  /// The pool's live nodes (healthy, joined, not revoked) from its node list, each a link to
  /// its page; a launchable pool says how many it may launch.
  function liveNodes(p) {
    return (p.node_list || []).filter((n) => n.healthy);
  }

  function nodesCell(p) {
    const nodes = liveNodes(p);
    const count = nodes.length;
    const line = h('div', { 'data-test': 'pool-node-count' }, count
      ? count + (count === 1 ? ' node' : ' nodes')
      : (p.launchable ? 'launchable, up to ' + p.node_limit + (p.node_limit === 1 ? ' node' : ' nodes') : 'no nodes'));
    const more = count && p.launchable ? h('div', { class: 'small muted' }, 'launchable, up to ' + p.node_limit) : null;
    const links = nodes.slice(0, 6).map((n) => h('div', { class: 'small' },
      h('a', { href: '#/nodes/' + encodeURIComponent(n.id), title: n.id, 'data-test': 'node-link', 'data-node': n.id }, n.hostname || short(n.id)),
      n.draining ? ' (draining)' : ''));
    if (nodes.length > 6) links.push(h('div', { class: 'small muted' }, '… ' + (nodes.length - 6) + ' more'));
    return [line, more, links];
  }

  function freeCell(p) {
    if (!liveNodes(p).length && p.launchable) return h('span', { class: 'muted small' }, 'on launch: ' + p.gpus_per_node + ' per node');
    return p.gpus_free + ' / ' + p.gpus_total;
  }

  function togglePoolEditor(tr, pool) {
    const next = tr.nextElementSibling;
    if (next && next.classList.contains('editor-row')) { next.remove(); return; }
    const limit = h('input', { type: 'number', min: '0', step: '1', value: pool.node_limit, 'data-test': 'pool-node-limit' });
    const price = h('input', { type: 'number', min: '0', step: '0.01', value: pool.price_per_gpu_hour, 'data-test': 'pool-price-input' });
    const launch = h('input', { type: 'checkbox', checked: pool.launchable, 'data-test': 'pool-launchable' });
    const marginalNow = pool.marginal_set ? String(pool.cash_per_gpu_hour) : '';
    const marginal = h('input', { type: 'number', min: '0', step: '0.01', value: marginalNow, placeholder: 'default ' + usd(pool.cash_per_gpu_hour), 'data-test': 'pool-marginal-input' });
    const infra = can.editPools();
    const errors = {};
    const f = (label, input, key) => {
      const fe = field(label, input, null, key);
      errors[key] = fe;
      return fe;
    };
    const status = h('span', { class: 'small', 'data-test': 'pool-edit-status' });
    const form = h('form', { class: 'form-grid', 'data-test': 'pool-editor' },
      infra ? f('Node limit', limit, 'node_limit') : null,
      infra ? f('Price per GPU-hour (USD)', price, 'price_per_gpu_hour') : null,
      infra ? h('div', { class: 'field', 'data-field': 'launchable' }, h('label', { class: 'check' }, launch, 'Launchable (burst allowed)')) : null,
      pool.launchable ? null : field('Marginal cost per GPU-hour (USD)', marginal, null, 'marginal_usd_per_gpu_hour',
        'Power and wear: what an hour of use costs in cash, 0 or more. Empty: a fifth of the internal rate'),
      h('div', { class: 'actions' }, h('button', { type: 'submit', 'data-test': 'pool-save' }, 'Save'), status));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      clearFieldErrors(form);
      const body = {};
      if (infra && String(limit.value) !== String(pool.node_limit)) body.node_limit = numOrRaw(limit.value);
      if (infra && String(price.value) !== String(pool.price_per_gpu_hour)) body.price_per_gpu_hour = numOrRaw(price.value);
      if (infra && launch.checked !== pool.launchable) body.launchable = launch.checked;
      if (!pool.launchable && marginal.value.trim() !== '' && String(marginal.value).trim() !== marginalNow) body.marginal_usd_per_gpu_hour = numOrRaw(marginal.value);
      if (!Object.keys(body).length) { status.textContent = 'Nothing changed.'; return; }
      try {
        await api('PATCH', '/api/v1/pools/' + encodeURIComponent(pool.id), body);
        toast('Pool ' + pool.id + ' saved');
        route();
      } catch (e) {
        if (!showFieldError(form, e)) status.textContent = e.message;
      }
    });
    const cols = tr.children.length;
    tr.after(h('tr', { class: 'editor-row' }, h('td', { colspan: String(cols) }, form)));
  }

  function numOrRaw(v) {
    const t = String(v).trim();
    if (t === '') return null;
    const n = Number(t);
    return Number.isFinite(n) ? n : t;
  }

  // ---- Forms: fields and their error messages ------------------------------------------------

  /// A labelled field; `path` is the API's dotted field name its errors come back under.
  function field(label, input, id, path, hint) {
    if (id && !input.id) input.id = id;
    if (!input.id) input.id = 'f-' + Math.random().toString(36).slice(2, 9);
    if (path && !input.getAttribute('data-test')) input.setAttribute('data-test', 'field-' + path);
    return h('div', { class: 'field', 'data-field': path || null },
      h('label', { for: input.id }, label), input,
      hint ? h('div', { class: 'hint' }, hint) : null,
      h('div', { class: 'field-error', 'data-test': path ? 'error-' + path : null, hidden: true, role: 'alert' }));
  }

  function clearFieldErrors(form) {
    for (const f of form.querySelectorAll('.field.invalid')) f.classList.remove('invalid');
    for (const e of form.querySelectorAll('.field-error')) { e.textContent = ''; e.hidden = true; }
  }

  /// Puts an API error next to the field it names (or the nearest enclosing one). False when
  /// the error names no field shown on the form.
  function showFieldError(form, e, focus) {
    if (!e || !e.field) return false;
    let path = e.field;
    let target = null;
    while (path) {
      target = [...form.querySelectorAll('[data-field]')].find((el) => el.getAttribute('data-field') === path);
      if (target) break;
      const cut = Math.max(path.lastIndexOf('.'), path.lastIndexOf('['));
      if (cut <= 0) break;
      path = path.slice(0, cut);
    }
    if (!target) return false;
    target.classList.add('invalid');
    const slot = target.querySelector(':scope > .field-error');
    if (slot) {
      const prefix = e.field + ': ';
      let text = e.message.startsWith(prefix) ? e.message.slice(prefix.length) : e.message;
      if (path !== e.field) text = e.field + ': ' + text;
      // Several errors for one field: each on its own line.
      if (!slot.hidden && slot.textContent) slot.appendChild(h('br'));
      slot.appendChild(document.createTextNode(text));
      slot.hidden = false;
    }
    const input = target.querySelector('input, select, textarea');
    if (input && focus !== false) input.focus();
    return true;
  }

  // ---- Jobs --------------------------------------------------------------------------------

  async function jobsPage(root, args, params, seq) {
    if (args[0]) return jobDetail(root, args[0], seq);
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Jobs'),
      h('span', { class: 'muted small' }, 'Newest first. Click a job for its placement, logs and cost.')));
    const stateSel = h('select', { 'data-test': 'filter-state' }, h('option', { value: '' }, 'Any state'),
      JOB_STATES.map((st) => h('option', { value: st, selected: params.state === st }, st)));
    const teamIn = h('input', { type: 'text', value: params.team || '', placeholder: 'any team', 'data-test': 'filter-team', disabled: !can.allTeams() });
    if (!can.allTeams()) teamIn.value = S.me.team || '';
    const prioSel = h('select', { 'data-test': 'filter-priority' }, h('option', { value: '' }, 'Any priority'),
      PRIORITIES.map((p) => h('option', { value: p, selected: params.priority === p }, p)));
    const auto = h('input', { type: 'checkbox', checked: true, 'data-test': 'jobs-auto-refresh' });
    const refresh = h('button', { type: 'button', class: 'secondary', 'data-test': 'jobs-refresh' }, 'Refresh');
    root.appendChild(h('div', { class: 'filters' },
      field('State', stateSel, 'jobs-state'), field('Team', teamIn, 'jobs-team'), field('Priority', prioSel, 'jobs-priority'),
      h('div', { class: 'actions' }, refresh, h('label', { class: 'check' }, auto, 'Refresh every 3 s'))));
    const holder = h('div', { class: 'panel', 'data-test': 'jobs-panel' });
    root.appendChild(holder);
    const status = h('p', { class: 'muted small', 'data-test': 'jobs-status' });
    let busy = false;
    const load = async () => {
      if (busy) return;
      busy = true;
      try {
        const data = await get('/api/v1/jobs' + qs({ state: stateSel.value, team: can.allTeams() ? teamIn.value.trim() : '', priority: prioSel.value, limit: 200 }));
        if (!live(seq)) return;
        const jobs = data.jobs;
        clear(holder);
        holder.appendChild(status);
        status.textContent = jobs.length + ' job' + (jobs.length === 1 ? '' : 's') + ' · updated ' + new Date().toISOString().slice(11, 19) + ' UTC';
        holder.appendChild(table(['Job', 'Team', 'State', 'Reason', 'Priority', ['GPUs', 'num'], 'Submitted', ['Cost', 'num'], 'Where'],
          jobs.map((j) => h('tr', {
            class: 'clickable', 'data-test': 'job-row', 'data-job-id': j.id, 'data-state': j.state,
            onclick: () => { location.hash = '#/jobs/' + j.id; },
          },
          h('td', null, h('a', { href: '#/jobs/' + j.id, 'data-test': 'job-link' }, j.name), h('div', { class: 'mono small muted' }, short(j.id))),
          h('td', null, teamLabel(j.team, j.project)),
          h('td', { 'data-test': 'job-state' }, badge(j.state)),
          h('td', { class: 'small', 'data-test': 'job-reason' }, j.reason || ''),
          h('td', null, j.priority),
          h('td', { class: 'num' }, String(j.spec && j.spec.resources ? j.spec.resources.gpus : '')),
          h('td', { title: dt(j.submitted_at) }, ago(j.submitted_at)),
          h('td', { class: 'num', 'data-test': 'job-cost' }, j.cost_usd === undefined ? '—' : usd(j.cost_usd)),
          h('td', { class: 'small' }, j.placement ? j.placement.pool : ''))),
        { test: 'jobs-table', empty: 'No jobs match.', stack: true }));
      } catch (e) {
        if (!live(seq)) return;
        clear(holder).appendChild(notice(e.message, true, 'jobs-error'));
      } finally {
        busy = false;
      }
    };
    const reload = () => {
      const p = { state: stateSel.value, team: can.allTeams() ? teamIn.value.trim() : '', priority: prioSel.value };
      const hash = '#/jobs' + qs(p);
      if (location.hash !== hash) history.replaceState(null, '', hash);
      load();
    };
    [stateSel, prioSel].forEach((el) => el.addEventListener('change', reload));
    teamIn.addEventListener('change', reload);
    refresh.addEventListener('click', load);
    every(3000, () => { if (auto.checked) load(); });
    await load();
  }

  async function jobDetail(root, id, seq) {
    root.appendChild(h('p', null, h('a', { href: '#/jobs', 'data-test': 'back-to-jobs' }, '← All jobs')));
    const body = h('div', { 'data-test': 'job-detail', 'data-job-id': id });
    root.appendChild(body);
    const info = h('div');
    body.appendChild(info);
    // The log pane outlives the refreshes: new output is appended, and the pane follows it
    // while the reader is at its bottom.
    const pre = h('pre', { class: 'log', 'data-test': 'log-text', hidden: true });
    const logNote = h('p', { class: 'muted', 'data-test': 'log-note' }, 'Loading output…');
    const follow = h('span', { class: 'small muted', 'data-test': 'log-follow' });
    const lp = h('div', { class: 'panel', 'data-test': 'detail-logs' }, h('div', { class: 'page-head' }, h('h2', null, 'Logs'), follow), logNote, pre);
    const pp = h('div', { class: 'panel wide', 'data-test': 'detail-placement' });
    const jobPanel = h('div', { class: 'panel', 'data-test': 'detail-job' });
    body.appendChild(h('div', { class: 'grid two' }, jobPanel, lp));
    body.appendChild(pp);
    let after = null;
    let logsDone = false;
    const atBottom = () => pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    const pollLogs = async (state) => {
      if (logsDone) return;
      const page = await settle(get('/api/v1/jobs/' + encodeURIComponent(id) + '/logs' + qs({ after, limit: 1000 })));
      if (!live(seq)) return;
      if (page instanceof ApiError) { logNote.textContent = page.message; logNote.hidden = false; return; }
      if (page.entries.length) {
        const stick = pre.hidden || atBottom();
        pre.hidden = false;
        logNote.hidden = true;
        pre.appendChild(document.createTextNode(page.entries.map((e) => (e.stream === 'stdout' ? '' : '[' + e.stream + '] ') + e.text).join('')));
        if (stick) pre.scrollTop = pre.scrollHeight;
      } else if (pre.hidden) {
        logNote.textContent = TERMINAL.includes(state) ? 'No output.' : 'No output yet.';
      }
      if (page.next_after !== undefined && page.next_after !== null) after = page.next_after;
      logsDone = Boolean(page.complete);
      follow.textContent = logsDone ? 'complete' : 'following new output';
      pre.setAttribute('data-complete', logsDone ? '1' : '0');
      // A long log: read on at once rather than on the next tick.
      if (page.entries.length >= 1000) await pollLogs(state);
    };
    const load = async () => {
      const [job, placement] = await Promise.all([
        get('/api/v1/jobs/' + encodeURIComponent(id)),
        settle(get('/api/v1/jobs/' + encodeURIComponent(id) + '/placement')),
      ]);
      if (!live(seq)) return null;
      clear(info);
      body.setAttribute('data-state', job.state);
      const head = h('div', { class: 'page-head' },
        h('h1', null, job.name, ' ', h('span', { 'data-test': 'detail-state' }, badge(job.state))));
      if (can.cancelJobs() && !TERMINAL.includes(job.state) && !job.cancel_requested) {
        head.appendChild(h('button', {
          type: 'button', class: 'danger', 'data-test': 'job-cancel',
          onclick: async () => {
            try { await api('POST', '/api/v1/jobs/' + encodeURIComponent(id) + '/cancel'); toast('Cancel requested'); load(); } catch (e) { toast(e.message, true); }
          },
        }, 'Cancel job'));
      }
      info.appendChild(head);
      if (job.reason) info.appendChild(notice('Reason: ' + String(job.reason).replace(/_/g, ' '), job.state === 'failed', 'detail-reason'));
      const spec = job.spec || {};
      const res = spec.resources || {};
      const estimate = placementEstimate(placement);
      const queued = between(job.submitted_at, job.started_at);
      const ran = job.started_at ? between(job.started_at, job.finished_at) : null;
      const pl = job.placement;
      clear(jobPanel).appendChild(h('h2', null, 'Job'));
      jobPanel.appendChild(kv([
        ['Id', h('span', { class: 'mono small' }, job.id)],
        ['Team', teamLabel(job.team, job.project)],
        ['Priority', job.priority + (job.kind ? ' · ' + job.kind : '')],
        ['Resources', res.gpus + ' GPU' + (res.gpus === 1 ? '' : 's') + (res.gpu_models && res.gpu_models.length ? ' (' + res.gpu_models.join(', ') + ')' : '') + (res.nodes > 1 ? ' × ' + res.nodes + ' nodes' : '')],
        ['Command', h('span', { class: 'mono small' }, (spec.command || []).join(' '))],
        ['Estimated runtime', spec.estimated_runtime_s ? duration(spec.estimated_runtime_s) : '—'],
        ['Deadline', dt(spec.deadline)],
        ['Submitted', h('span', { 'data-test': 'detail-submitted' }, dt(job.submitted_at))],
        ['Started', h('span', { 'data-test': 'detail-started' }, dt(job.started_at))],
        ['Finished', h('span', { 'data-test': 'detail-finished' }, dt(job.finished_at))],
        ['Queued', h('span', { 'data-test': 'detail-queued' }, queued === null ? '—' : duration(queued) + (job.started_at ? '' : ' so far'))],
        ['Ran', h('span', { 'data-test': 'detail-ran' }, ran === null ? '—' : duration(ran) + (job.finished_at ? '' : ' so far'))],
        ['Attempts', String(job.attempts)],
        ['Exit code', job.exit_code === null || job.exit_code === undefined ? '—' : String(job.exit_code)],
        ['Cost to date', h('span', null, h('span', { 'data-test': 'detail-cost' }, job.cost_usd === undefined ? '—' : usd(job.cost_usd)),
          h('span', { class: 'muted small', 'data-test': 'detail-estimate' }, estimate === null ? '' : ' · estimate ' + usd(estimate)))],
        ['Runs on', pl ? h('span', { 'data-test': 'detail-runs-on' }, pl.pool + ' · ', nodeRef(pl.node), ' · GPUs ' + pl.gpus.join(',') + ' · ' + pl.market) : '—'],
        // A multi-node job: each rank's node, GPUs and how its attempt stands.
        ...(pl && pl.ranks && pl.ranks.length ? [['Ranks', h('div', { 'data-test': 'detail-ranks' }, ...pl.ranks.map((r) =>
          h('div', { class: 'small', 'data-test': 'detail-rank' }, 'rank ' + r.rank + ' · ', nodeRef(r.node),
            ' · GPUs ' + r.gpus.join(',') + ' · ' + r.state + (r.exit_code === null || r.exit_code === undefined ? '' : ' · exit ' + r.exit_code))))]] : []),
      ]));
      clear(pp).appendChild(h('h2', null, 'Placement explanation'));
      if (placement instanceof ApiError) {
        pp.appendChild(h('p', { class: 'muted' }, placement.status === 404 ? 'Not planned yet.' : placement.message));
      } else {
        pp.appendChild(explanationView(placement, 'candidates-table', 'candidate-row'));
        if (placement.launch_round) {
          pp.appendChild(h('h3', null, 'The round that chose to launch'));
          pp.appendChild(h('p', { class: 'muted small' }, 'What waiting for existing capacity would have cost, and when it would have finished.'));
          pp.appendChild(h('div', { 'data-test': 'launch-round' }, explanationView(placement.launch_round, 'launch-candidates-table', 'launch-candidate-row')));
        }
      }
      return job;
    };
    const job = await load();
    if (!job) return;
    await pollLogs(job.state);
    if (!TERMINAL.includes(job.state) || !logsDone) {
      let state = job.state;
      every(2000, () => {
        if (!TERMINAL.includes(state)) load().then((j) => { if (j) state = j.state; }).catch(() => {});
        pollLogs(state).catch(() => {});
      });
    }
  }

  /// The cost the planner estimated for the job: the assigned (winning) candidate's, in the
  /// launch round when the job burst. Null when there is none.
  function placementEstimate(p) {
    if (!p || p instanceof ApiError) return null;
    const win = (x) => x && (x.candidates || []).find((c) => !c.rejected);
    const c = win(p) || win(p.launch_round);
    return c ? Number(c.cost_usd) : null;
  }

  function explanationView(p, test, rowTest) {
    return h('div', null,
      h('p', null, h('strong', null, 'Decision: '), h('span', { 'data-test': 'placement-outcome' }, describe(p.outcome)),
        h('span', { class: 'muted small' }, ' · planned ' + dt(p.planned_at))),
      table(['Pool', 'Verdict', ['Cost', 'num'], 'Start', 'Finish', 'Kind', 'Market'],
        (p.candidates || []).map((c) => h('tr', { 'data-test': rowTest, 'data-kind': c.kind },
          h('td', null, h('div', { class: 'mono small' }, c.pool), c.node ? h('div', { class: 'small muted' }, 'node ', nodeRef(c.node)) : null),
          h('td', { class: 'small' }, c.rejected ? describe(c.rejected) : h('strong', { class: 'ok' }, 'chosen')),
          h('td', { class: 'num' }, usd(c.cost_usd)),
          h('td', { class: 'small nowrap' }, dt(c.start)), h('td', { class: 'small nowrap' }, dt(c.finish)),
          h('td', null, String(c.kind).replace(/_/g, ' ')), h('td', null, c.market))),
        { test, empty: 'No candidate pool.' }));
  }

  /// A node id, shortened, with the full id on hover, a link to the node's page and a copy
  /// button.
  function nodeRef(id) {
    if (!id) return '—';
    const copy = h('button', {
      type: 'button', class: 'link small', title: 'Copy the full node id', 'data-test': 'node-copy', 'data-node': id,
      onclick: (ev) => { ev.preventDefault(); ev.stopPropagation(); copyText(id); },
    }, 'copy');
    return h('span', { class: 'node-ref' },
      h('a', { href: '#/nodes/' + encodeURIComponent(id), class: 'mono', title: id, 'data-test': 'node-ref', 'data-node': id }, String(id).slice(0, 12) + (String(id).length > 12 ? '…' : '')), ' ', copy);
  }

  async function copyText(text) {
    try {
      await navigator.clipboard.writeText(text);
    } catch (_) {
      // No clipboard permission: copy through a selected, hidden text field.
      const ta = h('textarea', { class: 'offscreen', readonly: true });
      ta.value = text;
      document.body.appendChild(ta);
      ta.select();
      try { document.execCommand('copy'); } catch (_e) { /* nothing more to try */ }
      ta.remove();
    }
    window.__syCopied = text;
    toast('Copied ' + text);
  }

  function kv(pairs) {
    return h('dl', { class: 'kv' }, pairs.map(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
  }

  // ---- Services ----------------------------------------------------------------------------

  // The broker's view of a service holds the gateway's figures for its current window only. The
  // charts keep their own history: every view this tab reads (the list or one service, every
  // 2 s) is a sample, kept per service for the last 10 minutes, in this tab only.
  const SVC_POLL_MS = 2000;
  const SVC_KEEP_MS = 10 * 60 * 1000;
  // A gap of more than this between two samples (the tab was on another page) breaks a line.
  const SVC_GAP_MS = 3 * SVC_POLL_MS + 1000;
  const SVC_HISTORY = new Map();
  const REPLICA_ORDER = ['ready', 'starting', 'draining', 'failed'];

  const numOrNull = (v) => (v === null || v === undefined || !Number.isFinite(Number(v)) ? null : Number(v));

  /// Latency in words: "57 ms", "4.2 ms", "1.3 s"; "—" when nothing was measured.
  function ms(v) {
    const n = numOrNull(v);
    if (n === null) return '—';
    if (n >= 10000) return (n / 1000).toFixed(1) + ' s';
    return (n < 10 && !Number.isInteger(n) ? n.toFixed(1) : String(Math.round(n))) + ' ms';
  }

  /// A request rate: "17.2", "0.5", "240".
  function rate(v) {
    const n = numOrNull(v);
    if (n === null) return '—';
    return n >= 100 ? String(Math.round(n)) : n.toFixed(1);
  }

  function liveReplicas(v) { return (v.replicas || []).filter((r) => r.state !== 'failed'); }
  function readyReplicas(v) { return (v.replicas || []).filter((r) => r.state === 'ready'); }
  function p95Target(v) { return numOrNull(v.spec && v.spec.scaling ? v.spec.scaling.target_p95_latency_ms : null); }

  /// Adds what `v` says now to its service's history; drops samples older than the window.
  function recordSample(v) {
    const now = Date.now();
    const list = SVC_HISTORY.get(v.id) || [];
    const tr = v.traffic || {};
    const windowS = Number(tr.window_s) || 0;
    // Two reads within half a poll (the list and the detail at once) are one sample.
    if (list.length && now - list[list.length - 1].t < SVC_POLL_MS / 4) list.pop();
    list.push({
      t: now,
      rps: numOrNull(tr.rps),
      errors: windowS > 0 ? Number(tr.errors || 0) / windowS : null,
      p50: numOrNull(tr.p50_ms),
      p95: numOrNull(tr.p95_ms),
      p99: numOrNull(tr.p99_ms),
      desired: numOrNull(v.desired_replicas),
      ready: readyReplicas(v).length,
      live: liveReplicas(v).length,
    });
    while (list.length && list[0].t < now - SVC_KEEP_MS) list.shift();
    SVC_HISTORY.set(v.id, list);
    return list;
  }

  const canDeleteServices = () => S.me && ['admin', 'developer'].includes(S.me.role);

  async function servicesPage(root, args, _params, seq) {
    if (args[0]) return serviceDetail(root, args[0], seq);
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Services'),
      h('span', { class: 'muted small' }, 'Inference services: replicas behind the gateway, scaled on latency, rate and queue. Click one for its replicas, charts and events.')));
    const holder = h('div', { class: 'panel', 'data-test': 'services-panel' });
    root.appendChild(holder);
    const status = h('p', { class: 'muted small', 'data-test': 'services-status' });
    let busy = false;
    const load = async () => {
      if (busy) return;
      busy = true;
      try {
        const data = await get('/api/v1/services');
        if (!live(seq)) return;
        const services = data.services;
        services.forEach(recordSample);
        clear(holder);
        holder.appendChild(status);
        const ready = services.reduce((a, v) => a + readyReplicas(v).length, 0);
        const cost = services.reduce((a, v) => a + (Number(v.cost_usd) || 0), 0);
        status.textContent = services.length + ' service' + (services.length === 1 ? '' : 's') + ' · ' + ready + ' ready replica' + (ready === 1 ? '' : 's') +
          ' · ' + usd(cost) + ' so far · updated ' + new Date().toISOString().slice(11, 19) + ' UTC';
        holder.appendChild(table(['Service', 'State', ['Replicas', 'num'], 'Why', ['Req/s', 'num'], ['p95 / target', 'num'], ['Errors', 'num hide-narrow'], 'Regions', ['Cost', 'num']],
          services.map((v) => serviceRow(v)),
          { test: 'services-table', empty: (can.allTeams() ? 'No services yet' : 'Your team has no services yet') + ': deploy one with switchyard service deploy FILE.toml, or POST /api/v1/services.', stack: true }));
      } catch (e) {
        if (!live(seq)) return;
        clear(holder).appendChild(notice(e.message, true, 'services-error'));
      } finally {
        busy = false;
      }
    };
    every(SVC_POLL_MS, load);
    await load();
  }

  function serviceRow(v) {
    const link = '#/services/' + encodeURIComponent(v.id);
    const ready = readyReplicas(v).length;
    const starting = (v.replicas || []).filter((r) => r.state === 'starting').length;
    const tr = v.traffic || {};
    const regions = new Map();
    for (const r of liveReplicas(v)) regions.set(r.region || '(unplaced)', (regions.get(r.region || '(unplaced)') || 0) + 1);
    return h('tr', {
      class: 'clickable', 'data-test': 'service-row', 'data-service-id': v.id, 'data-name': v.name, 'data-team': v.team, 'data-state': v.state,
      onclick: (ev) => { if (!ev.target.closest('a')) location.hash = link; },
    },
    h('td', null, h('a', { href: link, 'data-test': 'service-link' }, v.name), h('div', { class: 'small muted' }, teamLabel(v.team, v.project))),
    h('td', { 'data-test': 'service-state' }, badge(v.state)),
    h('td', { class: 'num', 'data-test': 'service-replicas', title: ready + ' ready of ' + v.desired_replicas + ' desired' },
      ready + ' / ' + v.desired_replicas, starting ? h('div', { class: 'small muted' }, starting + ' starting') : null),
    h('td', { class: 'small', 'data-test': 'service-reason' }, v.desired_reason || ''),
    h('td', { class: 'num', 'data-test': 'service-rps' }, rate(tr.rps)),
    h('td', { class: 'num', 'data-test': 'service-p95' }, p95Cell(tr.p95_ms, p95Target(v))),
    h('td', { class: 'num hide-narrow' }, String(tr.errors || 0)),
    h('td', { class: 'small' }, [...regions.entries()].map(([r, n]) => h('div', null, r + (n > 1 ? ' ×' + n : '')))),
    h('td', { class: 'num', 'data-test': 'service-cost' }, usd(v.cost_usd)));
  }

  /// The p95 against its target: red when above it.
  function p95Cell(p95, target) {
    const over = target !== null && numOrNull(p95) !== null && Number(p95) > target;
    return h('span', { class: over ? 'over' : null, 'data-over': over ? '1' : '0' },
      ms(p95), h('span', { class: 'muted' }, ' / ' + (target === null ? 'no target' : ms(target))));
  }

  async function serviceDetail(root, id, seq) {
    root.appendChild(h('p', null, h('a', { href: '#/services', 'data-test': 'back-to-services' }, '← All services')));
    const body = h('div', { 'data-test': 'service-detail', 'data-service-id': id });
    root.appendChild(body);
    const head = h('div');
    const updated = h('span', { class: 'muted small', 'data-test': 'service-updated' });
    const infoPanel = h('div', { class: 'panel', 'data-test': 'service-info' });
    const trafficPanel = h('div', { class: 'panel', 'data-test': 'service-traffic' });
    const chartsPanel = h('div', { class: 'panel', 'data-test': 'service-charts' });
    const replicasPanel = h('div', { class: 'panel', 'data-test': 'service-replicas' });
    const eventsPanel = h('div', { class: 'panel', 'data-test': 'service-events' });
    body.append(head, h('div', { class: 'grid two' }, infoPanel, trafficPanel), chartsPanel, replicasPanel, eventsPanel);

    // Events come oldest first after an id: read them all once, then only the new ones.
    const events = [];
    let after = 0;
    let showAll = false;
    const loadEvents = async () => {
      for (;;) {
        const page = await get('/api/v1/services/' + encodeURIComponent(id) + '/events' + qs({ after, limit: 1000 }));
        if (!live(seq)) return;
        for (const e of page.events) { events.push(e); after = Math.max(after, Number(e.id) || after); }
        if (page.events.length < 1000) break;
      }
      drawEvents();
    };
    const drawEvents = () => {
      clear(eventsPanel).appendChild(h('div', { class: 'page-head' }, h('h2', null, 'Events'),
        h('span', { class: 'muted small' }, 'Every scaling and placement decision, newest first.')));
      const newest = events.slice().reverse();
      const shown = showAll ? newest : newest.slice(0, 100);
      eventsPanel.appendChild(table(['When', 'Kind', 'What happened'], shown.map((e) => h('tr', { 'data-test': 'service-event', 'data-kind': e.kind, 'data-event-id': e.id },
        h('td', { class: 'small nowrap', title: dt(e.at) }, dt(e.at)),
        h('td', null, badge(e.kind)),
        h('td', { class: 'small', 'data-test': 'service-event-message' }, e.message))),
      { test: 'service-events-table', empty: 'No events yet.', stack: true }));
      if (newest.length > shown.length) {
        eventsPanel.appendChild(h('div', { class: 'actions' }, h('button', {
          type: 'button', class: 'secondary', 'data-test': 'service-events-all',
          onclick: () => { showAll = true; drawEvents(); },
        }, 'Show all ' + newest.length + ' events')));
      }
    };

    let confirming = false;
    const draw = (v, history) => {
      body.setAttribute('data-state', v.state);
      const tr = v.traffic || {};
      const spec = v.spec || {};
      const scaling = spec.scaling || {};
      const range = spec.replicas || { min: 1, max: 1 };
      const target = p95Target(v);
      const actions = h('div', { class: 'actions' });
      if (canDeleteServices() && v.state !== 'stopped') {
        if (!confirming) {
          actions.appendChild(h('button', { type: 'button', class: 'danger', 'data-test': 'service-delete', onclick: () => { confirming = true; draw(v, history); } }, 'Delete service'));
        } else {
          actions.append(
            h('span', { class: 'small' }, 'Drain every replica, then stop?'),
            h('button', {
              type: 'button', class: 'danger', 'data-test': 'service-delete-confirm',
              onclick: async () => {
                try {
                  await api('DELETE', '/api/v1/services/' + encodeURIComponent(id));
                  toast('Service ' + v.name + ' is draining');
                } catch (e) { toast(e.message, true); }
                confirming = false;
                refresh();
              },
            }, 'Delete'),
            h('button', { type: 'button', class: 'secondary', 'data-test': 'service-delete-keep', onclick: () => { confirming = false; draw(v, history); } }, 'Keep'));
        }
      }
      clear(head).append(h('div', { class: 'page-head' },
        h('h1', null, v.name, ' ', h('span', { 'data-test': 'service-detail-state' }, badge(v.state))),
        h('span', null, updated, ' ', actions)));
      head.appendChild(notice([h('strong', null, 'Desired ' + v.desired_replicas + ' replica' + (v.desired_replicas === 1 ? '' : 's') + ', ' + readyReplicas(v).length + ' ready: '),
        h('span', { 'data-test': 'service-desired-reason' }, v.desired_reason || '—')], false, 'service-desired'));

      clear(infoPanel).appendChild(h('h2', null, 'Service'));
      infoPanel.appendChild(kv([
        ['Team', teamLabel(v.team, v.project)],
        ['Endpoint', h('span', null, h('span', { class: 'mono small endpoint', 'data-test': 'service-endpoint' }, v.endpoint), ' ',
          h('button', { type: 'button', class: 'link small', 'data-test': 'service-endpoint-copy', onclick: () => copyText(v.endpoint) }, 'copy'))],
        ['Spec version', h('span', { 'data-test': 'service-version' }, String(v.spec_version))],
        ['Priority', spec.priority || 'normal'],
        ['Per replica', (spec.resources ? spec.resources.gpus : '?') + ' GPU' + (spec.resources && spec.resources.gpus === 1 ? '' : 's') +
          (spec.resources && spec.resources.gpu_models && spec.resources.gpu_models.length ? ' (' + spec.resources.gpu_models.join(', ') + ')' : '')],
        ['Replicas', range.min + ' to ' + range.max + (spec.schedule && spec.schedule.length ? ' · ' + spec.schedule.map((r) => r.days.join(',') + ' ' + r.from + '–' + r.to + ' ' + r.tz + ': at least ' + r.min_replicas).join('; ') : '')],
        ['Scaling targets', h('span', { 'data-test': 'service-targets' }, [
          target !== null ? 'p95 ' + ms(target) : null,
          scaling.target_rps_per_replica ? rate(scaling.target_rps_per_replica) + ' req/s per replica' : null,
          scaling.max_concurrency_per_replica ? scaling.max_concurrency_per_replica + ' at once per replica' : null,
        ].filter(Boolean).join(' · ') || 'none: replicas.min and the schedule only')],
        ['Scaling delays', 'window ' + (scaling.window_s || 30) + ' s · up after ' + (scaling.scale_up_delay_s || 15) + ' s · down after ' + (scaling.scale_down_delay_s || 120) + ' s'],
        ['Cost to date', h('span', { 'data-test': 'service-detail-cost' }, usd(v.cost_usd))],
        ['Deployed', dt(v.created_at)],
        ['Updated', dt(v.updated_at)],
      ]));

      clear(trafficPanel).appendChild(h('h2', null, 'Traffic over the last ' + (tr.window_s || '?') + ' s'));
      const p95Card = card('p95' + (target !== null ? ' (target ' + ms(target) + ')' : ''), ms(tr.p95_ms), 'service-card-p95');
      if (target !== null && numOrNull(tr.p95_ms) !== null && tr.p95_ms > target) p95Card.classList.add('over');
      trafficPanel.appendChild(h('div', { class: 'cards' },
        card('requests per second', rate(tr.rps), 'service-card-rps'),
        card('p50', ms(tr.p50_ms), 'service-card-p50'), p95Card,
        card('p99', ms(tr.p99_ms), 'service-card-p99'),
        card('errors of ' + (tr.requests || 0) + ' requests', String(tr.errors || 0), 'service-card-errors')));

      clear(chartsPanel).appendChild(h('div', { class: 'page-head' }, h('h2', null, 'Since this page opened'),
        h('span', { class: 'muted small', 'data-test': 'service-history-note' }, 'Read every 2 s and kept in this browser tab for the last 10 minutes (' + history.length + ' sample' + (history.length === 1 ? '' : 's') + '): the broker keeps only the current window.')));
      const grid = h('div', { class: 'grid charts' });
      chartsPanel.appendChild(grid);
      const boxes = ['rps', 'p95', 'replicas'].map((k) => { const b = h('div', { 'data-test': 'service-chart-panel', 'data-chart': k }); grid.appendChild(b); return b; });
      // Drawn at the width its box has once laid out, so the text stays legible.
      const width = Math.max(280, Math.min(900, Math.floor(boxes[0].clientWidth)));
      const times = history.map((x) => x.t);
      const col = (k) => history.map((x) => x[k]);
      boxes[0].append(h('h3', null, 'Requests per second'), timeChart(times, [
        { key: 'rps', label: 'req/s', color: '#2f7dd1', values: col('rps'), fmt: rate },
        { key: 'errors', label: 'errors/s', color: '#c0392b', values: col('errors'), fmt: rate },
      ], { width, test: 'service-chart-rps', yFmt: (n) => rate(n).replace(/\.0$/, '') }));
      boxes[1].append(h('h3', null, 'Latency'), timeChart(times, [
        { key: 'p95', label: 'p95', color: '#e67e22', values: col('p95'), fmt: ms },
        { key: 'p50', label: 'p50', color: '#9cc3ec', values: col('p50'), fmt: ms },
      ], {
        width, test: 'service-chart-p95', yFmt: ms,
        lines: target !== null ? [{ value: target, label: 'target ' + ms(target), color: '#c0392b', test: 'service-p95-target' }] : [],
      }));
      if (target === null) boxes[1].appendChild(h('p', { class: 'muted small', 'data-test': 'service-no-target' }, 'No p95 target in the spec (scaling.target_p95_latency_ms).'));
      else if (!history.some((x) => x.p95 !== null)) boxes[1].appendChild(h('p', { class: 'muted small' }, 'No requests through the gateway yet.'));
      boxes[2].append(h('h3', null, 'Replicas: desired and actual'), timeChart(times, [
        { key: 'desired', label: 'desired', color: '#8e44ad', values: col('desired'), step: true, dash: '6 3', fmt: String },
        { key: 'ready', label: 'ready', color: '#27ae60', values: col('ready'), step: true, fmt: String },
        { key: 'live', label: 'running (starting, ready or draining)', color: '#7f8c8d', values: col('live'), step: true, dash: '2 3', fmt: String },
      ], { width, test: 'service-chart-replicas', yFmt: (x) => (Number.isInteger(x) ? String(x) : x.toFixed(1)), minMax: Math.max(1, range.max) }),
      h('p', { class: 'small' }, h('span', { class: 'muted' }, 'Now: '), v.desired_reason || '—'));

      clear(replicasPanel).appendChild(h('h2', null, 'Replicas by region'));
      const byRegion = new Map();
      for (const r of v.replicas || []) {
        const k = r.region || '(not placed yet)';
        if (!byRegion.has(k)) byRegion.set(k, []);
        byRegion.get(k).push(r);
      }
      if (!byRegion.size) replicasPanel.appendChild(h('p', { class: 'empty', 'data-test': 'service-replicas-empty' }, 'No replicas yet.'));
      const RCOLS = ['Replica', 'Version', 'State', 'Pool', 'Node', 'Market', ['Req/s', 'num'], ['In flight', 'num'], ['p95', 'num']];
      for (const [region, reps] of [...byRegion.entries()].sort((a, b) => b[1].length - a[1].length || a[0].localeCompare(b[0]))) {
        reps.sort((a, b) => REPLICA_ORDER.indexOf(a.state) - REPLICA_ORDER.indexOf(b.state) || String(a.job_id).localeCompare(String(b.job_id)));
        const nReady = reps.filter((r) => r.state === 'ready').length;
        replicasPanel.appendChild(h('div', { 'data-test': 'service-region', 'data-region': region },
          h('h3', null, region, h('span', { class: 'muted small' }, ' · ' + nReady + ' of ' + reps.length + ' ready · ' + rate(reps.reduce((a, r) => a + (Number(r.rps) || 0), 0)) + ' req/s')),
          table(RCOLS, reps.map((r) => h('tr', { 'data-test': 'service-replica', 'data-job-id': r.job_id, 'data-state': r.state, 'data-region': region },
            h('td', null, h('a', { href: '#/jobs/' + r.job_id, class: 'mono small', title: r.job_id }, short(r.job_id))),
            h('td', { class: 'num' }, 'v' + r.spec_version),
            h('td', null, badge(r.state)),
            h('td', { class: 'mono small', 'data-test': 'replica-pool' }, r.pool || '—'),
            h('td', { class: 'small', 'data-test': 'replica-node' }, r.node ? nodeRef(r.node) : '—'),
            h('td', null, r.market ? String(r.market).replace(/_/g, '-') : '—'),
            h('td', { class: 'num', 'data-test': 'replica-rps' }, rate(r.rps)),
            h('td', { class: 'num', 'data-test': 'replica-in-flight' }, String(r.in_flight || 0)),
            h('td', { class: 'num', 'data-test': 'replica-p95' }, p95Cell(r.p95_ms, target)))),
          { stack: true })));
      }
    };

    let busy = false;
    const refresh = async () => {
      if (busy) return;
      busy = true;
      try {
        const v = await get('/api/v1/services/' + encodeURIComponent(id));
        if (!live(seq)) return;
        draw(v, recordSample(v));
        updated.textContent = 'updated ' + new Date().toISOString().slice(11, 19) + ' UTC';
        updated.classList.remove('alert-text');
        await loadEvents();
      } catch (e) {
        if (!live(seq)) return;
        updated.textContent = 'not updated: ' + e.message;
        updated.classList.add('alert-text');
      } finally {
        busy = false;
      }
    };
    // The first read decides the page: a service this caller may not see is a 404.
    const first = await settle(get('/api/v1/services/' + encodeURIComponent(id)));
    if (!live(seq)) return;
    if (first instanceof ApiError) {
      body.appendChild(notice(first.status === 404 ? 'No service ' + id + ' that you may see.' : first.message, first.status !== 404, 'service-error'));
      return;
    }
    draw(first, recordSample(first));
    updated.textContent = 'updated ' + new Date().toISOString().slice(11, 19) + ' UTC';
    await loadEvents();
    every(SVC_POLL_MS, refresh);
  }

  /// Lines over time for the service charts. x spans the samples (at least a minute); a gap
  /// of more than three polls breaks a line, as does a missing value (never drawn as zero).
  /// `step` series hold their value until the next sample (replica counts). `opts.lines` are
  /// horizontal lines across the chart (a target), always inside the y range.
  function timeChart(times, series, opts) {
    const CW = opts.width;
    const lines = opts.lines || [];
    const now = times.length ? times[times.length - 1] : Date.now();
    const t0 = Math.min(times.length ? times[0] : now, now - 60000);
    const span = Math.max(1, now - t0);
    const values = series.flatMap((x) => x.values.filter((v) => v !== null));
    const max = niceMax(Math.max(opts.minMax || 0, ...values, ...lines.map((l) => l.value * 1.1)));
    const svgEl = s('svg', {
      class: 'chart', viewBox: '0 0 ' + CW + ' ' + CH, width: CW, height: CH, role: 'img',
      'aria-label': series.map((x) => x.label).join(', ') + ' since this page opened', 'data-test': opts.test, 'data-samples': times.length,
    });
    const iw = CW - PAD.l - PAD.r;
    const ih = CH - PAD.t - PAD.b;
    const x = (t) => PAD.l + (iw * (t - t0)) / span;
    const y = (v) => PAD.t + ih - (ih * v) / max;
    for (let i = 0; i <= 4; i++) {
      const yy = PAD.t + ih - (ih * i) / 4;
      svgEl.appendChild(s('line', { class: i ? 'grid-line' : 'axis', x1: PAD.l, x2: CW - PAD.r, y1: yy, y2: yy }));
      svgEl.appendChild(s('text', { x: PAD.l - 6, y: yy + 4, 'text-anchor': 'end' }, (opts.yFmt || String)((max * i) / 4)));
    }
    // Time labels on round seconds or minutes, as many as fit.
    const fits = Math.max(2, Math.floor(iw / 64));
    const step = [5, 10, 15, 30, 60, 120, 300].map((x) => x * 1000).find((st) => span / st <= fits) || 600000;
    for (let t = Math.ceil(t0 / step) * step; t <= now; t += step) {
      svgEl.appendChild(s('text', { x: x(t).toFixed(1), y: CH - 8, 'text-anchor': 'middle' }, new Date(t).toISOString().slice(step < 60000 ? 14 : 11, 19)));
    }
    for (const l of lines) {
      const yy = y(l.value).toFixed(1);
      svgEl.appendChild(s('line', { x1: PAD.l, x2: CW - PAD.r, y1: yy, y2: yy, stroke: l.color, 'stroke-width': 1.5, 'stroke-dasharray': '6 4', 'data-test': l.test, 'data-value': l.value },
        s('title', null, l.label)));
      svgEl.appendChild(s('text', { x: CW - PAD.r - 4, y: Number(yy) - 4, 'text-anchor': 'end', class: 'chart-line-label' }, l.label));
    }
    for (const ser of series) {
      let d = '';
      let prev = null;
      let points = 0;
      ser.values.forEach((v, i) => {
        if (v === null) { prev = null; return; }
        const px = x(times[i]).toFixed(1);
        const py = y(v).toFixed(1);
        if (prev && times[i] - prev.t <= SVC_GAP_MS) {
          d += (ser.step ? 'L' + px + ' ' + prev.py + ' ' : '') + 'L' + px + ' ' + py + ' ';
        } else {
          d += 'M' + px + ' ' + py + ' ';
        }
        prev = { t: times[i], py };
        points += 1;
      });
      if (!points) continue;
      const last = [...ser.values].reverse().find((v) => v !== null);
      // A lone sample is a dot, so a line of one point still shows.
      if (points === 1) {
        const i = ser.values.findIndex((v) => v !== null);
        svgEl.appendChild(s('circle', { cx: x(times[i]).toFixed(1), cy: y(ser.values[i]).toFixed(1), r: 2.5, fill: ser.color, 'data-test': 'service-line-' + ser.key },
          s('title', null, ser.label + ': ' + ser.fmt(last))));
      } else {
        svgEl.appendChild(s('path', { d: d.trim(), fill: 'none', stroke: ser.color, 'stroke-width': 2, 'stroke-dasharray': ser.dash || null, 'data-test': 'service-line-' + ser.key, 'data-points': points },
          s('title', null, ser.label + ', now ' + ser.fmt(last))));
      }
    }
    const legend = h('div', { class: 'legend' }, series.map((ser) => {
      const sw = h('span', { class: 'sw' + (ser.dash ? ' dash' : '') });
      sw.style.background = ser.color;
      const last = [...ser.values].reverse().find((v) => v !== null);
      return h('span', { 'data-test': 'legend-' + ser.key }, sw, ser.label + (last === undefined ? '' : ' ' + ser.fmt(last)));
    }), lines.map((l) => {
      const sw = h('span', { class: 'sw dash' });
      sw.style.background = l.color;
      return h('span', null, sw, l.label);
    }));
    return h('div', null, svgEl, legend);
  }

  // ---- Policies ----------------------------------------------------------------------------

  async function policiesPage(root, args, params, seq) {
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Policies'),
      h('span', { class: 'muted small' }, can.editPolicies()
        ? 'Budgets and placement rules per team. Every save is a new version, recorded in the audit log.'
        : 'Read only: finance and admin edit policies.')));
    const [list, budgets, jobs, regions, pools] = await Promise.all([
      get('/api/v1/policies'),
      settle(get('/api/v1/budgets')),
      settle(get('/api/v1/jobs?limit=500')),
      settle(get('/api/v1/regions')),
      settle(get('/api/v1/pools')),
    ]);
    if (!live(seq)) return;
    const catalogue = {
      regions: regions instanceof ApiError ? null : regions.regions,
      pools: pools instanceof ApiError ? null : pools.pools,
    };
    const keys = new Map();
    const add = (team, project) => {
      if (!team) return;
      const k = team + '\u0000' + (project || '');
      if (!keys.has(k)) keys.set(k, { team, project: project || null });
    };
    list.policies.forEach((p) => add(p.team, p.project));
    if (!(budgets instanceof ApiError)) budgets.budgets.forEach((b) => add(b.team, null));
    if (!(jobs instanceof ApiError)) jobs.jobs.forEach((j) => add(j.team, null));
    if (!can.allTeams() && S.me.team) add(S.me.team, null);
    let selTeam = args[0] || null;
    let selProject = args[1] || params.project || null;
    const hiddenTeam = selTeam && !can.allTeams() && selTeam !== S.me.team;
    if (selTeam && !hiddenTeam) add(selTeam, selProject);
    const entries = [...keys.values()].filter((e) => can.allTeams() || e.team === S.me.team)
      .sort((a, b) => a.team.localeCompare(b.team) || String(a.project || '').localeCompare(String(b.project || '')));
    if (!selTeam && entries.length) { selTeam = entries[0].team; selProject = entries[0].project; }

    const side = h('div', { class: 'panel', 'data-test': 'policy-teams' }, h('h2', null, 'Teams'),
      h('ul', { class: 'team-list' }, entries.map((e) => {
        const has = list.policies.find((p) => p.team === e.team && (p.project || null) === e.project);
        return h('li', null, h('a', {
          href: '#/policies/' + encodeURIComponent(e.team) + (e.project ? '/' + encodeURIComponent(e.project) : ''),
          class: e.team === selTeam && (e.project || null) === (selProject || null) ? 'active' : null,
          'data-test': 'policy-team', 'data-team': e.team,
        }, teamLabel(e.team, e.project), has ? h('span', { class: 'muted small' }, ' v' + has.version) : h('span', { class: 'muted small' }, ' (none)')));
      })));
    if (can.editPolicies()) {
      const nt = h('input', { type: 'text', placeholder: 'team', 'data-test': 'new-team' });
      const np = h('input', { type: 'text', placeholder: 'project (optional)', 'data-test': 'new-project' });
      side.appendChild(h('form', {
        class: 'actions', 'data-test': 'new-policy-form',
        onsubmit: (ev) => {
          ev.preventDefault();
          const t = nt.value.trim();
          if (t) location.hash = '#/policies/' + encodeURIComponent(t) + (np.value.trim() ? '/' + encodeURIComponent(np.value.trim()) : '');
        },
      }, nt, np, h('button', { type: 'submit', class: 'secondary', 'data-test': 'new-policy' }, 'New policy')));
    }
    const main = h('div', { 'data-test': 'policy-main' });
    root.appendChild(h('div', { class: 'split' }, side, main));
    if (!selTeam) {
      main.appendChild(h('div', { class: 'panel' }, h('p', { class: 'empty' }, 'No team has a policy or jobs yet.')));
      return;
    }
    if (hiddenTeam) {
      // The API answers 404 for another team's policy whether or not it has one.
      main.appendChild(h('div', { class: 'panel', 'data-test': 'policy-hidden' },
        h('h2', null, 'Policy: ' + teamLabel(selTeam, selProject)),
        notice('The policy of team ' + selTeam + ' is not visible to your role (' + S.me.role + ' of team ' + S.me.team + ').', false, 'not-visible')));
      return;
    }
    const exists = list.policies.find((p) => p.team === selTeam && (p.project || null) === (selProject || null));
    let view = null;
    let etag = null;
    if (exists) {
      const r = await api('GET', '/api/v1/policies/' + encodeURIComponent(selTeam) + qs({ project: selProject }));
      if (!live(seq)) return;
      view = r.data;
      etag = r.headers.get('ETag');
    }
    main.appendChild(policyForm(selTeam, selProject, view, etag,
      budgets instanceof ApiError ? null : budgets.budgets.find((b) => b.team === selTeam && (b.project || null) === (selProject || null)),
      catalogue, seq));
  }

  // ---- Policy checks: the broker's rules (broker/src/rules/policy.rs), run before anything is sent,
  // every field at once. The broker checks again; its answer is put next to its field too.

  const NUMBER_RE = /^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/;
  const HHMM_RE = /^(\d\d):(\d\d)$/;

  /// `text` as a number, or null when it is not one (`abc`, `1,5`, `2 usd`).
  function parseNumber(text) {
    const t = String(text === null || text === undefined ? '' : text).trim();
    if (!NUMBER_RE.test(t)) return null;
    const n = Number(t);
    return Number.isFinite(n) ? n : null;
  }

  /// Minutes after midnight of `HH:MM` (24:00 is the end of the day), or null.
  function parseHhmm(text) {
    const m = HHMM_RE.exec(String(text || '').trim());
    if (!m) return null;
    const hh = Number(m[1]);
    const mm = Number(m[2]);
    if (hh === 24 && mm === 0) return 1440;
    return hh <= 23 && mm <= 59 ? hh * 60 + mm : null;
  }

  function validTimeZone(tz) {
    try {
      new Intl.DateTimeFormat('en-US', { timeZone: tz });
      return true;
    } catch (_) {
      return false;
    }
  }

  function oneOf(values, most) {
    const v = [...new Set(values)].sort();
    const shown = v.slice(0, most || 12);
    return shown.join(', ') + (v.length > shown.length ? ', … (' + v.length + ' in all)' : '');
  }

  /// Flattens a policy body to `path → JSON text` for diffs (times compared as instants).
  function flatPolicy(body) {
    const out = new Map();
    const walk = (v, path) => {
      if (v === null || v === undefined) return;
      if (typeof v === 'object' && !Array.isArray(v)) {
        for (const [k, x] of Object.entries(v)) walk(x, path ? path + '.' + k : k);
        return;
      }
      if (Array.isArray(v) && v.length && typeof v[0] === 'object') {
        v.forEach((x, i) => walk(x, path + '[' + i + ']'));
        return;
      }
      if ((path === 'budget.from' || path === 'budget.to') && typeof v === 'string') {
        const d = new Date(v);
        if (!Number.isNaN(d.getTime())) { out.set(path, JSON.stringify(d.toISOString().replace('.000Z', 'Z'))); return; }
      }
      out.set(path, JSON.stringify(v));
    };
    walk(body, '');
    return out;
  }

  /// What the draft changes against the saved body: [{field, before, after}] (before/after
  /// `undefined` when absent).
  function policyDiff(saved, draft) {
    const a = flatPolicy(saved || {});
    const b = flatPolicy(draft || {});
    const changes = [];
    for (const k of [...new Set([...a.keys(), ...b.keys()])].sort()) {
      if (a.get(k) !== b.get(k)) changes.push({ field: k, before: a.get(k), after: b.get(k) });
    }
    return changes;
  }

  function policyForm(team, project, view, etag, budgetNow, catalogue, seq) {
    const policy = (view && view.policy) || {};
    const editable = can.editPolicies();
    const b = policy.budget || null;
    const dis = !editable;
    const state = { version: view ? view.version : null, etag, saved: view ? view.policy : {} };
    // Numbers are typed into text fields: a number field would hand the script '' for `abc`,
    // and '' means "no rule".
    const numberInput = (value, placeholder) => h('input', { type: 'text', inputmode: 'decimal', value: value === null || value === undefined ? '' : String(value), disabled: dis, placeholder: placeholder || null, autocomplete: 'off' });

    const hasBudget = h('input', { type: 'checkbox', checked: Boolean(b), disabled: dis, 'data-test': 'field-budget.enabled' });
    const amount = numberInput(b ? b.amount_usd : '', 'e.g. 500');
    const period = selectOf(['month', 'week', 'custom'], b ? b.period : 'month', dis);
    const from = h('input', { type: 'datetime-local', value: b && b.from ? localInput(b.from) : '', disabled: dis });
    const to = h('input', { type: 'datetime-local', value: b && b.to ? localInput(b.to) : '', disabled: dis });
    const enforcement = selectOf(['hard', 'soft'], b ? b.enforcement : 'hard', dis);
    const alertAt = h('input', { type: 'text', value: b ? (b.alert_at || []).join(', ') : '0.5, 0.9', disabled: dis, placeholder: '0.5, 0.9' });
    const fromF = field('From (UTC)', from, null, 'budget.from');
    const toF = field('To (UTC)', to, null, 'budget.to');
    const budgetFields = h('div', { class: 'form-grid' },
      field('Amount (USD)', amount, null, 'budget.amount_usd', 'At least 0'),
      field('Period', period, null, 'budget.period', 'Calendar month or ISO week, UTC'),
      fromF, toF,
      field('Enforcement', enforcement, null, 'budget.enforcement', 'hard: hold jobs that do not fit; soft: alert only'),
      field('Alert at (fractions)', alertAt, null, 'budget.alert_at', 'Each in (0, 1], e.g. 0.5, 0.9'));
    const syncBudget = () => {
      budgetFields.hidden = !hasBudget.checked;
      const custom = period.value === 'custom';
      fromF.hidden = !custom;
      toF.hidden = !custom;
    };
    hasBudget.addEventListener('change', syncBudget);
    period.addEventListener('change', syncBudget);

    const knownProviders = catalogue.regions || catalogue.pools
      ? [...(catalogue.regions || []).map((r) => r.provider), ...(catalogue.pools || []).map((p) => p.provider)] : null;
    const knownRegions = catalogue.regions ? catalogue.regions.map((r) => r.id) : null;
    const knownModels = catalogue.pools ? catalogue.pools.map((p) => p.gpu_model) : null;

    const maxPrice = numberInput(policy.max_price_per_gpu_hour, 'no limit');
    const providers = h('input', { type: 'text', value: (policy.allowed_providers || []).join(', '), disabled: dis, placeholder: 'any (e.g. onprem, aws)' });
    const regions = h('input', { type: 'text', value: (policy.allowed_regions || []).join(', '), disabled: dis, placeholder: 'any (e.g. aws:us-east-1)' });
    const spot = selectOf(['', 'never', 'allowed', 'preferred'], policy.spot || '', dis, { '': 'no rule' });
    const burst = selectOf(['', 'true', 'false'], policy.burst === undefined || policy.burst === null ? '' : String(policy.burst), dis, { '': 'no rule', true: 'allowed', false: 'not allowed' });
    const ceiling = selectOf(['', ...PRIORITIES], policy.priority_ceiling || '', dis, { '': 'no ceiling' });
    // What placement minimises for the team (issue 29): the company's cash or the team's bill.
    const objective = selectOf(['', 'company', 'team'], policy.objective || '', dis,
      { '': 'company (the default)', company: 'company: what we pay in cash', team: 'team: the team’s bill' });

    // Windows and on-prem rates: editable rows.
    const windows = (policy.windows || []).map((w) => Object.assign({}, w));
    const rates = Object.entries(policy.onprem_rates || {}).map(([model, rate]) => ({ model, rate: String(rate) }));
    const windowsBox = h('div', { 'data-test': 'windows' });
    const ratesBox = h('div', { 'data-test': 'onprem-rates' });
    const drawWindows = () => {
      clear(windowsBox);
      windows.forEach((w, i) => {
        const pr = selectOf(['', ...PRIORITIES], w.priority || '', dis, { '': 'all priorities' });
        pr.addEventListener('change', () => { w.priority = pr.value || null; });
        const f = h('input', { type: 'text', value: w.from || '', placeholder: '20:00', disabled: dis });
        f.addEventListener('input', () => { w.from = f.value; });
        const t = h('input', { type: 'text', value: w.to || '', placeholder: '08:00', disabled: dis });
        t.addEventListener('input', () => { w.to = t.value; });
        const tz = h('input', { type: 'text', value: w.tz || '', placeholder: 'UTC', disabled: dis });
        tz.addEventListener('input', () => { w.tz = tz.value; });
        windowsBox.appendChild(h('div', { class: 'row-editor', 'data-field': 'windows[' + i + ']', 'data-test': 'window-row' },
          field('Priority', pr, null, 'windows[' + i + '].priority'),
          field('From', f, null, 'windows[' + i + '].from', 'HH:MM'),
          field('To', t, null, 'windows[' + i + '].to', 'HH:MM'),
          field('Time zone', tz, null, 'windows[' + i + '].tz', 'IANA, e.g. Europe/Berlin'),
          editable ? h('button', { type: 'button', class: 'secondary', 'data-test': 'window-remove', onclick: () => { windows.splice(i, 1); drawWindows(); changed(); } }, 'Remove') : h('span'),
          h('div', { class: 'field-error', hidden: true })));
      });
      if (!windows.length) windowsBox.appendChild(h('p', { class: 'muted small' }, 'No windows: jobs may start at any time.'));
    };
    const drawRates = () => {
      clear(ratesBox);
      rates.forEach((r, i) => {
        const m = h('input', { type: 'text', value: r.model, placeholder: 'H100', disabled: dis });
        const row = h('div', { class: 'row-editor two', 'data-field': 'onprem_rates.' + r.model, 'data-test': 'rate-row' });
        m.addEventListener('input', () => { r.model = m.value; row.setAttribute('data-field', 'onprem_rates.' + m.value.trim()); });
        const v = numberInput(r.rate, '1.50');
        v.addEventListener('input', () => { r.rate = v.value; });
        append(row, [
          field('GPU model', m, null, 'onprem_rates[' + i + '].model'),
          field('USD per GPU-hour', v, null, 'onprem_rates[' + i + '].rate'),
          editable ? h('button', { type: 'button', class: 'secondary', onclick: () => { rates.splice(i, 1); drawRates(); changed(); } }, 'Remove') : h('span'),
          h('div', { class: 'field-error', hidden: true })]);
        ratesBox.appendChild(row);
      });
      if (!rates.length) ratesBox.appendChild(h('p', { class: 'muted small' }, 'No internal rates: on-prem pools use their configured price.'));
    };
    drawWindows();
    drawRates();

    // Idle GPUs: the waste rule (`utilization`, issue 28). A job whose GPUs stay under the
    // threshold for the window is acted on; exempt priorities never are.
    const u = policy.utilization || null;
    const hasUtil = h('input', { type: 'checkbox', checked: Boolean(u), disabled: dis, 'data-test': 'field-utilization.enabled' });
    const minPct = numberInput(u ? u.min_gpu_utilization_pct : '', 'e.g. 10');
    const windowS = numberInput(u ? u.window_s : '', 'e.g. 1800');
    const utilAction = selectOf(['notify', 'stop', 'requeue'], u ? u.action : 'notify', dis,
      { notify: 'notify (audit entry, the job runs on)', stop: 'stop the job', requeue: 'requeue the job' });
    const savedExempt = (u && u.exempt_priorities) || [];
    const exemptBoxes = PRIORITIES.map((p) => h('input', { type: 'checkbox', value: p, checked: savedExempt.includes(p), disabled: dis, 'data-test': 'field-utilization.exempt_priorities.' + p }));
    const windowWords = h('span', { class: 'muted small', 'data-test': 'utilization-window-words' });
    const syncWindowWords = () => {
      const n = parseNumber(windowS.value);
      windowWords.textContent = n !== null && Number.isInteger(n) && n > 0 ? ' = ' + duration(n) : '';
    };
    windowS.addEventListener('input', syncWindowWords);
    syncWindowWords();
    const utilFields = h('div', { class: 'form-grid' },
      field('Idle under (% of GPU)', minPct, null, 'utilization.min_gpu_utilization_pct', 'A whole percentage, 1 to 100: SM activity where the GPU reports it, else utilisation'),
      field('For (seconds)', windowS, null, 'utilization.window_s', h('span', null, '60 to 604800 (7 days)', windowWords)),
      field('Then', utilAction, null, 'utilization.action', 'Service replicas are never acted on'),
      h('div', { class: 'field', 'data-field': 'utilization.exempt_priorities', 'data-test': 'field-utilization.exempt_priorities' },
        h('label', null, 'Exempt priorities'),
        h('div', { class: 'checks' }, exemptBoxes.map((c) => h('label', { class: 'check' }, c, c.value))),
        h('div', { class: 'hint' }, 'Jobs of these priorities are never acted on'),
        h('div', { class: 'field-error', 'data-test': 'error-utilization.exempt_priorities', hidden: true, role: 'alert' })));
    const syncUtil = () => { utilFields.hidden = !hasUtil.checked; };
    hasUtil.addEventListener('change', syncUtil);
    syncUtil();

    const status = h('div', { class: 'small', 'data-test': 'policy-status', role: 'status' });
    const general = h('div', { class: 'field-error', 'data-test': 'policy-error', hidden: true, role: 'alert' });
    const diffBox = h('div', { class: 'diff', 'data-test': 'policy-diff' });
    const whatIfOut = h('div', { 'data-test': 'whatif-result' });
    const saveBtn = h('button', { type: 'submit', 'data-test': 'policy-save' }, view ? 'Save new version' : 'Create policy');
    const whatIfBtn = h('button', { type: 'button', class: 'secondary', 'data-test': 'whatif-run' }, 'What-if');

    const form = h('form', { class: 'panel', 'data-test': 'policy-form', 'data-team': team, novalidate: true },
      h('div', { class: 'page-head' },
        h('h2', { 'data-test': 'policy-title' }, 'Policy: ' + teamLabel(team, project)),
        h('span', { class: 'muted small', 'data-test': 'policy-version' }, view
          ? 'version ' + view.version + ' · saved ' + dt(view.updated_at) + ' by ' + view.updated_by
          : 'no policy yet')),
      budgetNow ? h('p', { class: 'small', 'data-test': 'policy-budget-now' }, budgetLine(budgetNow)) : null,
      budgetNow && alertText(budgetNow) ? h('p', { class: 'small alert-text', role: 'status', 'data-test': 'policy-budget-alerts' }, alertText(budgetNow) + ' this period.') : null,
      general,
      h('fieldset', { 'data-field': 'budget' },
        h('legend', null, h('label', { class: 'check' }, hasBudget, 'Budget')),
        budgetFields,
        h('div', { class: 'field-error', hidden: true })),
      h('fieldset', null, h('legend', null, 'Placement rules'),
        h('div', { class: 'form-grid' },
          field('Max price per GPU-hour (USD)', maxPrice, null, 'max_price_per_gpu_hour', 'More than 0; empty: no limit'),
          field('Allowed providers', providers, null, 'allowed_providers', knownProviders ? 'Comma-separated, of: ' + oneOf(knownProviders) + '; empty: any' : 'Comma-separated; empty: any'),
          field('Allowed regions', regions, null, 'allowed_regions', 'Comma-separated provider:code; empty: any'),
          field('Spot', spot, null, 'spot'),
          field('Burst to the cloud', burst, null, 'burst'),
          field('Priority ceiling', ceiling, null, 'priority_ceiling'),
          field('Minimise', objective, null, 'objective', 'Company: cloud spend plus owned GPUs at their marginal cost, so idle owned GPUs win over cheap spot. Team: the team’s bill, owned GPUs at the internal rate. Budgets bind on the bill either way.'))),
      h('fieldset', { 'data-field': 'windows' }, h('legend', null, 'Time windows'), windowsBox,
        h('div', { class: 'field-error', hidden: true }),
        editable ? h('button', {
          type: 'button', class: 'secondary', 'data-test': 'window-add',
          onclick: () => { windows.push({ priority: 'low', from: '20:00', to: '08:00', tz: 'UTC' }); drawWindows(); changed(); },
        }, 'Add window') : null),
      h('fieldset', { 'data-field': 'utilization', 'data-test': 'policy-utilization' },
        h('legend', null, h('label', { class: 'check' }, hasUtil, 'Idle GPUs (utilization rule)')),
        utilFields,
        h('div', { class: 'field-error', hidden: true })),
      h('fieldset', { 'data-field': 'onprem_rates' }, h('legend', null, 'On-prem internal rates'), ratesBox,
        h('div', { class: 'field-error', hidden: true }),
        editable ? h('button', {
          type: 'button', class: 'secondary', 'data-test': 'rate-add',
          onclick: () => { rates.push({ model: 'H100', rate: '' }); drawRates(); changed(); },
        }, 'Add rate') : null),
      editable ? diffBox : null,
      editable ? h('div', { class: 'actions' }, saveBtn, whatIfBtn, status) : null,
      whatIfOut);
    syncBudget();

    const list = (v) => v.split(',').map((x) => x.trim()).filter(Boolean);
    const num = (text) => { const n = parseNumber(text); return n === null ? String(text).trim() : n; };

    /// The draft as the form holds it (numbers that do not parse kept as their text, so the
    /// diff shows what was typed) and its errors, all of them: [{field, message}].
    const draft = () => {
      const body = {};
      const errors = [];
      const bad = (f, message) => errors.push({ field: f, message });
      if (hasBudget.checked) {
        const budget = { period: period.value, enforcement: enforcement.value };
        const amt = parseNumber(amount.value);
        if (amount.value.trim() === '') bad('budget.amount_usd', 'enter an amount of USD, at least 0 (e.g. 500 or 12.50)');
        else if (amt === null || amt < 0) bad('budget.amount_usd', JSON.stringify(amount.value.trim()) + ' is not an amount of USD: enter a number, at least 0 (e.g. 500 or 12.50)');
        budget.amount_usd = amount.value.trim() === '' ? undefined : num(amount.value);
        const alerts = list(alertAt.value);
        const wrong = alerts.filter((x) => { const n = parseNumber(x); return n === null || !(n > 0 && n <= 1); });
        if (wrong.length) bad('budget.alert_at', 'each must be a fraction of the budget in (0, 1], e.g. 0.5, 0.9; not ' + wrong.join(', '));
        else if (alerts.length > 16) bad('budget.alert_at', 'at most 16 thresholds');
        budget.alert_at = alerts.map(num);
        if (period.value === 'custom') {
          if (!from.value) bad('budget.from', 'a custom period needs a start');
          else budget.from = new Date(from.value + 'Z').toISOString();
          if (!to.value) bad('budget.to', 'a custom period needs an end');
          else budget.to = new Date(to.value + 'Z').toISOString();
          if (from.value && to.value && new Date(to.value + 'Z') <= new Date(from.value + 'Z')) bad('budget.to', 'must be after the start');
        }
        body.budget = budget;
      }
      if (maxPrice.value.trim() !== '') {
        const n = parseNumber(maxPrice.value);
        if (n === null || !(n > 0)) bad('max_price_per_gpu_hour', JSON.stringify(maxPrice.value.trim()) + ' is not a price: enter USD per GPU-hour, more than 0 (e.g. 2.50), or leave it empty for no limit');
        body.max_price_per_gpu_hour = num(maxPrice.value);
      }
      const provs = list(providers.value);
      if (provs.length) {
        body.allowed_providers = provs;
        if (knownProviders) {
          const unknown = provs.filter((x) => !knownProviders.some((k) => k.toLowerCase() === x.toLowerCase()));
          if (unknown.length) bad('allowed_providers', 'unknown provider ' + unknown.map((x) => JSON.stringify(x)).join(', ') + '; valid: ' + oneOf(knownProviders));
        }
      }
      const regs = list(regions.value);
      if (regs.length) {
        body.allowed_regions = regs;
        if (knownRegions) {
          const unknown = regs.filter((x) => !knownRegions.includes(x));
          if (unknown.length) bad('allowed_regions', 'unknown region ' + unknown.map((x) => JSON.stringify(x)).join(', ') + '; valid: ' + oneOf(knownRegions, 8));
        }
      }
      if (hasUtil.checked) {
        const rule = { min_gpu_utilization_pct: num(minPct.value), window_s: num(windowS.value), action: utilAction.value };
        const pct = parseNumber(minPct.value);
        if (minPct.value.trim() === '') bad('utilization.min_gpu_utilization_pct', 'enter a whole percentage from 1 to 100 (e.g. 10)');
        else if (pct === null || !Number.isInteger(pct) || pct < 1 || pct > 100) bad('utilization.min_gpu_utilization_pct', JSON.stringify(minPct.value.trim()) + ' is not a percentage: enter a whole number from 1 to 100 (e.g. 10)');
        const secs = parseNumber(windowS.value);
        if (windowS.value.trim() === '') bad('utilization.window_s', 'enter a window in seconds, 60 to 604800 (e.g. 1800 for 30 min)');
        else if (secs === null || !Number.isInteger(secs) || secs < 60 || secs > 604800) bad('utilization.window_s', JSON.stringify(windowS.value.trim()) + ' is not a window: enter whole seconds from 60 to 604800 (7 days), e.g. 1800 for 30 min');
        // The saved order first, so an unchanged rule shows no change.
        const checked = exemptBoxes.filter((c) => c.checked).map((c) => c.value);
        const exempt = [...savedExempt.filter((p) => checked.includes(p)), ...checked.filter((p) => !savedExempt.includes(p))];
        if (exempt.length) rule.exempt_priorities = exempt;
        body.utilization = rule;
      }
      if (spot.value) body.spot = spot.value;
      if (burst.value) body.burst = burst.value === 'true';
      if (ceiling.value) body.priority_ceiling = ceiling.value;
      if (objective.value) body.objective = objective.value;
      if (windows.length) {
        if (windows.length > 64) bad('windows', 'at most 64 windows');
        body.windows = windows.map((w, i) => {
          const o = { from: (w.from || '').trim(), to: (w.to || '').trim() };
          if (w.priority) o.priority = w.priority;
          if (w.tz && w.tz.trim()) o.tz = w.tz.trim();
          const fm = parseHhmm(o.from);
          if (fm === null || fm >= 1440) bad('windows[' + i + '].from', 'a time of day HH:MM, 00:00 to 23:59');
          if (parseHhmm(o.to) === null) bad('windows[' + i + '].to', 'a time of day HH:MM, 00:00 to 24:00');
          if (o.tz && !validTimeZone(o.tz)) bad('windows[' + i + '].tz', JSON.stringify(o.tz) + ' is not an IANA time zone (e.g. Asia/Shanghai, UTC)');
          return o;
        });
      }
      if (rates.length) {
        body.onprem_rates = {};
        rates.forEach((r, i) => {
          const model = r.model.trim();
          if (!model) { bad('onprem_rates[' + i + '].model', 'name a GPU model' + (knownModels ? ': ' + oneOf(knownModels) : '')); return; }
          if (knownModels && !knownModels.some((k) => k.toLowerCase() === model.toLowerCase())) {
            bad('onprem_rates[' + i + '].model', 'no pool has GPU model ' + JSON.stringify(model) + '; valid: ' + oneOf(knownModels));
          }
          const n = parseNumber(r.rate);
          if (n === null || !(n > 0)) bad('onprem_rates[' + i + '].rate', 'USD per GPU-hour, more than 0 (e.g. 1.50)');
          if (Object.prototype.hasOwnProperty.call(body.onprem_rates, model)) bad('onprem_rates[' + i + '].model', model + ' has a rate already');
          body.onprem_rates[model] = num(r.rate);
        });
      }
      return { body, errors };
    };

    /// Marks every error next to its field; true when there was none.
    const markErrors = (errors) => {
      clearFieldErrors(form);
      general.hidden = true;
      errors.forEach((e, i) => showFieldError(form, e, i === 0));
      return errors.length === 0;
    };

    const drawDiff = () => {
      const changes = policyDiff(state.saved, draft().body);
      clear(diffBox).appendChild(h('h3', null, 'Changes to save'));
      if (!changes.length) {
        diffBox.appendChild(h('p', { class: 'muted small', 'data-test': 'policy-diff-empty' }, state.version
          ? 'None: the form matches version ' + state.version + '.' : 'None yet: fill in a rule to create the policy.'));
        return changes;
      }
      diffBox.appendChild(h('p', { class: 'muted small' }, state.version ? 'Against version ' + state.version + ':' : 'A new policy:'));
      diffBox.appendChild(h('table', { class: 'diff-table', 'data-test': 'policy-diff-table' }, h('tbody', null, changes.map((c) => h('tr', { 'data-test': 'diff-row', 'data-field': c.field },
        h('td', { class: 'mono small' }, c.field),
        h('td', { class: 'small del' }, c.before === undefined ? '(none)' : c.before),
        h('td', { class: 'small' }, '→'),
        h('td', { class: 'small ins' }, c.after === undefined ? '(removed)' : c.after))))));
      return changes;
    };
    const changed = () => { if (live(seq)) drawDiff(); };
    form.addEventListener('input', changed);
    form.addEventListener('change', changed);
    drawDiff();
    if (editable) S.dirty = () => live(seq) && document.body.contains(form) && policyDiff(state.saved, draft().body).length > 0;

    const path = '/api/v1/policies/' + encodeURIComponent(team);
    const query = qs({ project });
    const showError = (e) => {
      if (e.status === 409) {
        general.textContent = 'Someone saved a newer version while you edited. Reload to see it, then apply your change again.';
        general.hidden = false;
        general.appendChild(h('button', { type: 'button', class: 'link', 'data-test': 'policy-reload', onclick: () => { S.dirty = null; route(); } }, ' Reload'));
      } else if (!showFieldError(form, e, true)) {
        general.textContent = e.message;
        general.hidden = false;
      }
    };
    const refuse = (errors) => {
      status.textContent = 'Not saved: ' + errors.length + (errors.length === 1 ? ' field needs' : ' fields need') + ' fixing.';
      status.setAttribute('data-refused', String(errors.length));
    };
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      if (!editable) return;
      drawDiff();
      const { body, errors } = draft();
      if (!markErrors(errors)) { refuse(errors); return; }
      status.removeAttribute('data-refused');
      if (!policyDiff(state.saved, body).length && state.version) { status.textContent = 'Nothing changed.'; return; }
      saveBtn.disabled = true;
      status.textContent = 'Saving…';
      try {
        const headers = state.etag ? { 'If-Match': state.etag } : (state.version ? { 'If-Match': '"' + state.version + '"' } : {});
        const r = await api('PUT', path + query, body, headers);
        state.version = r.data.version;
        state.etag = r.headers.get('ETag') || '"' + r.data.version + '"';
        state.saved = r.data.policy || body;
        status.textContent = 'Saved version ' + r.data.version + '.';
        status.setAttribute('data-version', String(r.data.version));
        toast('Policy for ' + teamLabel(team, project) + ' saved (version ' + r.data.version + ')');
        $('[data-test="policy-version"]', form).textContent = 'version ' + r.data.version + ' · saved ' + dt(r.data.updated_at) + ' by ' + r.data.updated_by;
        saveBtn.textContent = 'Save new version';
        drawDiff();
        refreshAfterSave(team, project, r.data.version, form);
      } catch (e) {
        status.textContent = '';
        showError(e);
      } finally {
        saveBtn.disabled = false;
      }
    });
    whatIfBtn.addEventListener('click', async () => {
      drawDiff();
      const { body, errors } = draft();
      if (!markErrors(errors)) { refuse(errors); return; }
      status.textContent = '';
      whatIfBtn.disabled = true;
      clear(whatIfOut).appendChild(h('p', { class: 'muted' }, 'Replaying the team’s recorded jobs…'));
      try {
        const r = await api('POST', path + '/what-if' + query, body);
        clear(whatIfOut).appendChild(whatIfView(r.data, whatIfOut));
      } catch (e) {
        clear(whatIfOut);
        showError(e);
      } finally {
        whatIfBtn.disabled = false;
      }
    });
    return form;
  }

  /// After a save: the team list's version and this period's budget line catch up.
  async function refreshAfterSave(team, project, version, form) {
    for (const a of document.querySelectorAll('[data-test=policy-team]')) {
      if (a.getAttribute('data-team') === team && a.classList.contains('active')) {
        const tag = a.querySelector('span');
        if (tag) tag.textContent = ' v' + version;
      }
    }
    const budgets = await settle(get('/api/v1/budgets'));
    if (budgets instanceof ApiError) return;
    const b = budgets.budgets.find((x) => x.team === team && (x.project || null) === (project || null));
    let line = $('[data-test=policy-budget-now]', form);
    let alerts = $('[data-test=policy-budget-alerts]', form);
    if (!b) { if (line) line.remove(); if (alerts) alerts.remove(); return; }
    if (!line) {
      line = h('p', { class: 'small', 'data-test': 'policy-budget-now' });
      $('[data-test=policy-error]', form).before(line);
    }
    line.textContent = budgetLine(b);
    if (!alertText(b)) { if (alerts) alerts.remove(); return; }
    if (!alerts) {
      alerts = h('p', { class: 'small alert-text', role: 'status', 'data-test': 'policy-budget-alerts' });
      $('[data-test=policy-error]', form).before(alerts);
    }
    alerts.textContent = alertText(b) + ' this period.';
  }

  function budgetLine(b) {
    return 'This period: ' + usd(b.spent_usd) + ' spent, ' + usd(b.committed_usd) + ' committed, ' + usd(b.remaining_usd) + ' left of ' + usd(b.amount_usd) + '.';
  }

  function whatIfTable(r) {
    const rows = [
      ['Total cost', (o) => o.total_cost_usd, usd, true, 'total_cost_usd'],
      ['Deadlines met', (o) => o.deadline_met_fraction, pct, false, 'deadline_met_fraction'],
      ['Queue delay p50', (o) => o.queue_delay_s && o.queue_delay_s.p50, duration, true, 'queue_delay_p50'],
      ['Queue delay p99', (o) => o.queue_delay_s && o.queue_delay_s.p99, duration, true, 'queue_delay_p99'],
      ['Jobs held', (o) => o.held_jobs, String, true, 'held_jobs'],
    ];
    return h('div', { class: 'whatif' },
      h('h3', null, 'What-if: ' + r.jobs + ' recorded job' + (r.jobs === 1 ? '' : 's') + ' replayed'),
      table(['', ['Current policy', 'num'], ['Draft', 'num'], ['Change', 'num']],
        rows.map(([label, pick, fmt, lowerIsBetter, metric]) => {
          const a = Number(pick(r.current));
          const b = Number(pick(r.draft));
          const d = b - a;
          const better = lowerIsBetter ? d < 0 : d > 0;
          const cls = Math.abs(d) < 1e-9 ? '' : (better ? 'better' : 'worse');
          const change = Math.abs(d) < 1e-9 ? 'same' : (d > 0 ? '+' : '−') + (fmt === pct ? pct(Math.abs(d)) : fmt === usd ? usd(Math.abs(d)) : fmt(Math.abs(d)));
          return h('tr', { 'data-test': 'whatif-row', 'data-metric': metric },
            h('td', null, label), h('td', { class: 'num', 'data-test': 'whatif-current' }, fmt(a)),
            h('td', { class: 'num', 'data-test': 'whatif-draft' }, fmt(b)), h('td', { class: 'num ' + cls }, change));
        }),
        { test: 'whatif-table' }),
      h('p', { class: 'muted small' }, 'The simulator replays the team’s jobs of the last 30 days on today’s pools and prices. Nothing is saved until you save the policy.'));
  }

  const CHANGE_WORDS = { held: 'would be held', released: 'would run (held now)', moved: 'would move', cost: 'would cost more or less' };
  const CHANGE_ORDER = ['held', 'moved', 'released', 'cost'];

  /// The what-if: the summary table, cost per day under each policy as a chart, and the jobs
  /// the draft treats differently.
  function whatIfView(r, holder) {
    const out = h('div', { class: 'whatif' }, whatIfTable(r));
    const cur = (r.current && r.current.cost_per_day) || [];
    const dra = (r.draft && r.draft.cost_per_day) || [];
    const panel = h('div', { 'data-test': 'whatif-chart-panel' }, h('h3', null, 'Cost per day'));
    out.appendChild(panel);
    if (cur.length || dra.length) {
      const days = [...new Set([...cur.map((d) => d.day), ...dra.map((d) => d.day)])].sort();
      const series = [
        { label: 'current policy', color: '#7f8c8d', values: days.map((d) => Number((cur.find((x) => x.day === d) || {}).cost_usd || 0)), dash: '5 4', test: 'whatif-line-current' },
        { label: 'draft', color: '#2f7dd1', values: days.map((d) => Number((dra.find((x) => x.day === d) || {}).cost_usd || 0)), test: 'whatif-line-draft' },
      ];
      panel.appendChild(multiLineChart(days, series, 'whatif-chart', Math.max(280, Math.min(1400, (holder.clientWidth || 800) - 8))));
    } else {
      panel.appendChild(h('p', { class: 'muted small', 'data-test': 'whatif-chart-none' }, 'This broker does not report cost per day for a what-if.'));
    }
    const changes = (r.changes || []).slice().sort((a, b) => CHANGE_ORDER.indexOf(a.change) - CHANGE_ORDER.indexOf(b.change)
      || Math.abs(b.draft_cost_usd - b.current_cost_usd) - Math.abs(a.draft_cost_usd - a.current_cost_usd));
    out.appendChild(h('h3', null, 'Jobs the draft treats differently'));
    out.appendChild(table(['Job', 'Change', 'Current policy', 'Draft', ['Cost now', 'num'], ['Cost under draft', 'num']],
      changes.map((c) => h('tr', { 'data-test': 'whatif-change', 'data-job-id': c.job_id, 'data-change': c.change },
        h('td', null, h('a', { href: '#/jobs/' + c.job_id }, c.name || short(c.job_id)), c.project ? h('div', { class: 'small muted' }, c.project) : null),
        h('td', null, badge(c.change === 'held' ? 'held' : c.change), h('div', { class: 'small muted' }, CHANGE_WORDS[c.change] || c.change)),
        h('td', { class: 'small mono' }, c.current_pool || 'never starts'),
        h('td', { class: 'small mono' }, c.draft_pool || 'never starts'),
        h('td', { class: 'num' }, usd(c.current_cost_usd)),
        h('td', { class: 'num' }, usd(c.draft_cost_usd)))),
      { test: 'whatif-changes', empty: r.changes ? 'None: every replayed job starts in the same pool at the same cost.' : 'This broker does not list the jobs a what-if changes.' }));
    if (r.waste) out.appendChild(whatIfWasteView(r.waste));
    return out;
  }

  /// What the draft's utilization rule would have done to the recorded attempts (issue 28).
  function whatIfWasteView(w) {
    const acted = w.would_act || [];
    const gpuHours = (x) => (Number(x) || 0).toFixed(2);
    const box = h('div', { 'data-test': 'whatif-waste' }, h('h3', null, 'Idle GPUs: what the draft’s rule would have done'));
    box.appendChild(h('p', { class: 'small', 'data-test': 'whatif-waste-summary' },
      acted.length + ' of ' + w.attempts_recorded + ' recorded attempt' + (w.attempts_recorded === 1 ? '' : 's') + ' would have been acted on (' + w.action + '), freeing at least '
      + gpuHours(w.gpu_hours_freed) + ' GPU-hours (' + usd(w.usd_freed) + ')'
      + (w.judged_at_pct ? '; judged from idle stretches under ' + w.judged_at_pct + ' %, the nearest recorded threshold at or under the rule’s.' : '.')));
    box.appendChild(table(['Job', 'Priority', ['GPUs', 'num'], ['Longest idle', 'num'], ['GPU-hours freed', 'num'], ['Freed', 'num']],
      acted.map((j) => h('tr', { 'data-test': 'whatif-waste-job', 'data-job-id': j.job_id },
        h('td', null, h('a', { href: '#/jobs/' + j.job_id }, j.name || short(j.job_id)), j.project ? h('div', { class: 'small muted' }, j.project) : null),
        h('td', null, j.priority),
        h('td', { class: 'num' }, String(j.gpus)),
        h('td', { class: 'num' }, duration(j.longest_idle_s)),
        h('td', { class: 'num' }, gpuHours(j.gpu_hours_freed)),
        h('td', { class: 'num' }, usd(j.usd_freed)))),
      { test: 'whatif-waste-jobs', empty: 'None: no recorded attempt stayed idle that long.' }));
    return box;
  }

  /// Several series over the same days, as lines; each point has its value as a tooltip.
  function multiLineChart(days, series, test, CW) {
    const svgEl = s('svg', { class: 'chart', viewBox: '0 0 ' + CW + ' ' + CH, width: CW, height: CH, role: 'img', 'aria-label': series.map((x) => x.label).join(' and '), 'data-test': test });
    const opts = arguments[4] || {};
    const max = opts.max || niceMax(Math.max(0, ...series.flatMap((x) => x.values.filter((v) => v !== null))));
    axes(svgEl, days, max, CW, opts.yFmt, opts.xFmt);
    const iw = CW - PAD.l - PAD.r;
    const ih = CH - PAD.t - PAD.b;
    for (const ser of series) {
      // A missing value (not reported) breaks the line; it is never drawn as a zero.
      const pts = ser.values.map((v, i) => (v === null || v === undefined ? null : [PAD.l + (iw * (i + 0.5)) / days.length, PAD.t + ih - (ih * v) / max, i]));
      if (!pts.some(Boolean)) continue;
      let d = '';
      let pen = false;
      for (const p of pts) {
        if (!p) { pen = false; continue; }
        d += (pen ? 'L' : 'M') + p[0].toFixed(1) + ' ' + p[1].toFixed(1) + ' ';
        pen = true;
      }
      svgEl.appendChild(s('path', { d: d.trim(), fill: 'none', stroke: ser.color, 'stroke-width': 2, 'stroke-dasharray': ser.dash || null, 'data-test': ser.test || null }));
      if (pts.length <= 120) {
        pts.filter(Boolean).forEach((p) => svgEl.appendChild(s('circle', { cx: p[0].toFixed(1), cy: p[1].toFixed(1), r: 2.5, fill: ser.color }, s('title', null, ser.label + ' · ' + (opts.xTitle ? opts.xTitle(days[p[2]]) : days[p[2]]) + ': ' + (ser.fmt || usd)(ser.values[p[2]])))));
      }
    }
    const legend = h('div', { class: 'legend' }, series.map((x) => {
      const sw = h('span', { class: 'sw' });
      sw.style.background = x.color;
      return h('span', null, sw, x.label);
    }));
    return h('div', null, svgEl, legend);
  }


  function selectOf(values, current, disabled, labels) {
    return h('select', { disabled }, values.map((v) => h('option', { value: v, selected: String(current) === String(v) }, (labels && labels[v]) || v)));
  }

  function localInput(iso) {
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? '' : d.toISOString().slice(0, 16);
  }

  // ---- Spend -------------------------------------------------------------------------------

  async function spendPage(root, _args, params, seq) {
    const days = Number(params.days) || 30;
    const rangeSel = h('select', { 'data-test': 'spend-range' }, [7, 30, 90].map((d) => h('option', { value: d, selected: d === days }, 'Last ' + d + ' days')));
    rangeSel.addEventListener('change', () => { location.hash = '#/spend?days=' + rangeSel.value; });
    const csvGroup = selectOf(['team', 'project', 'region', 'provider', 'pool'], 'team', false);
    csvGroup.setAttribute('data-test', 'spend-csv-group');
    const csvBtn = h('button', { type: 'button', class: 'secondary', 'data-test': 'spend-csv' }, 'Download CSV');
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Spend'),
      h('span', { class: 'muted small' }, 'From the ledger: accrued while work runs, settled when it ends.')));
    root.appendChild(h('div', { class: 'filters' }, field('Range', rangeSel, 'spend-range-sel'), field('CSV by', csvGroup, 'spend-csv-sel'), h('div', { class: 'actions' }, csvBtn)));
    const now = new Date();
    const start = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() - (days - 1)));
    const range = { from: start.toISOString(), to: new Date(now.getTime() + 60000).toISOString() };
    csvBtn.addEventListener('click', () => downloadCsv(csvGroup.value, range));
    const groups = ['team', 'region', 'provider'];
    const [results, usage] = await Promise.all([
      Promise.all(groups.map((g) => settle(get('/api/v1/spend' + qs({ group_by: g, bucket: 'day', from: range.from, to: range.to }))))),
      // What jobs cost apart from the boot and idle time of burst instances (team overhead).
      settle(get('/api/v1/spend' + qs({ group_by: 'usage', from: range.from, to: range.to }))),
    ]);
    if (!live(seq)) return;
    const dayList = [];
    for (let d = new Date(start); d <= now; d = new Date(d.getTime() + 86400000)) dayList.push(d.toISOString().slice(0, 10));
    const first = results.find((r) => !(r instanceof ApiError));
    // Two costs (issue 29): what teams are billed, what the company paid in cash, and what
    // owned GPUs cost standing idle (shown to those who see every team).
    const idle = first && first.owned_idle ? first.owned_idle : null;
    root.appendChild(h('div', { class: 'cards' },
      card('Billed to teams, last ' + days + ' days', first ? usd(first.total_usd) : '—', 'spend-total'),
      card('Paid in cash', first && first.total_cash_usd !== undefined ? usd(first.total_cash_usd) : '—', 'spend-cash'),
      card('Per day billed (average)', first ? usd(Number(first.total_usd) / days) : '—', 'spend-daily'),
      idle ? card('Owned GPUs idle', usd(idle.usd) + ' · ' + Number(idle.gpu_hours).toFixed(1) + ' GPU-h', 'spend-owned-idle') : null));
    root.appendChild(h('p', { class: 'muted small', 'data-test': 'spend-costs-words' },
      'Billed: the ledger’s chargeback, owned GPUs at the internal rate. Cash: cloud spend plus owned GPUs at their marginal cost (power and wear).'
      + (idle ? ' Idle owned GPUs are a cost of ownership, worth the internal rate, in neither total.' : '')));
    if (first) {
      const perDay = new Map();
      for (const r of first.rows) {
        const k = String(r.bucket_start || '').slice(0, 10);
        perDay.set(k, (perDay.get(k) || 0) + Number(r.amount_usd));
      }
      let acc = 0;
      const cumulative = dayList.map((d) => { acc += perDay.get(d) || 0; return acc; });
      const panel = h('div', { class: 'panel', 'data-test': 'spend-cumulative' }, h('h2', null, 'Cumulative spend'));
      root.appendChild(panel);
      panel.appendChild(lineChart(dayList, cumulative, 'chart-cumulative', chartWidth(panel)));
    }
    const up = h('div', { class: 'panel', 'data-test': 'spend-usage' }, h('h2', null, 'Jobs and instance overhead'),
      h('p', { class: 'muted small' }, 'A burst instance’s boot and idle time is charged to its team as its own line, never to a job that has finished.'));
    root.appendChild(up);
    if (usage === null) {
      up.appendChild(h('p', { class: 'muted', 'data-test': 'spend-usage-none' }, 'This broker does not split spend by usage.'));
    } else if (usage instanceof ApiError) {
      up.appendChild(notice('Spend by usage is not available: ' + usage.message, usage.status !== 404));
    } else {
      const totals = new Map([['job', 0], ['instance_boot', 0], ['instance_idle', 0]]);
      for (const row of usage.rows) {
        const k = row.usage === null || row.usage === undefined ? '(none)' : String(row.usage);
        totals.set(k, (totals.get(k) || 0) + Number(row.amount_usd));
      }
      const all = [...totals.values()].reduce((a, b) => a + b, 0);
      up.appendChild(table(['Usage', ['Spend', 'num'], ['Share', 'num']], [...totals.keys()].map((k) => h('tr', { 'data-test': 'usage-row', 'data-key': k },
        h('td', null, USAGE_WORDS[k] || k.replace(/_/g, ' ')),
        h('td', { class: 'num', 'data-test': 'usage-amount' }, usd(totals.get(k))),
        h('td', { class: 'num' }, pct(all > 0 ? totals.get(k) / all : 0)))),
      { test: 'spend-table-usage' }));
    }
    const grid = h('div', { class: 'grid charts' });
    root.appendChild(grid);
    // Lay out every panel before drawing, so each chart is drawn at its final width.
    const panels = groups.map((g) => {
      const panel = h('div', { class: 'panel', 'data-test': 'spend-by-' + g }, h('h2', null, 'By ' + g + ' per day'));
      grid.appendChild(panel);
      return panel;
    });
    groups.forEach((g, i) => {
      const r = results[i];
      const panel = panels[i];
      if (r instanceof ApiError) {
        panel.appendChild(notice('Spend is not available: ' + r.message, r.status !== 404));
      } else {
        const totals = new Map();
        for (const row of r.rows) {
          const k = row[g] === null || row[g] === undefined ? '(none)' : String(row[g]);
          totals.set(k, (totals.get(k) || 0) + Number(row.amount_usd));
        }
        const keys = [...totals.keys()].sort((a, b) => totals.get(b) - totals.get(a));
        const colors = new Map(keys.map((k, j) => [k, PALETTE[j % PALETTE.length]]));
        panel.appendChild(stackedBars(dayList, r.rows, g, keys, colors, 'chart-' + g, chartWidth(panel)));
        panel.appendChild(h('div', { class: 'legend' }, keys.map((k) => {
          const sw = h('span', { class: 'sw' });
          sw.style.background = colors.get(k);
          return h('span', null, sw, k);
        })));
        panel.appendChild(table([g, ['Total', 'num'], ['Share', 'num']], keys.map((k) => h('tr', { 'data-test': 'spend-row', 'data-key': k },
          h('td', null, k), h('td', { class: 'num' }, usd(totals.get(k))),
          h('td', { class: 'num' }, pct(Number(r.total_usd) > 0 ? totals.get(k) / Number(r.total_usd) : 0)))),
        { test: 'spend-table-' + g, empty: 'No spend in this range.' }));
      }
    });
  }

  const USAGE_WORDS = { job: 'jobs', instance_boot: 'instance boot', instance_idle: 'instance idle' };

  async function downloadCsv(groupBy, range) {
    try {
      const res = await fetch('/api/v1/spend' + qs({ group_by: groupBy, bucket: 'day', from: range.from, to: range.to }), {
        headers: { Accept: 'text/csv' }, credentials: 'same-origin', cache: 'no-store',
      });
      if (!res.ok) throw new Error('HTTP ' + res.status);
      const blob = await res.blob();
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: 'switchyard-spend-by-' + groupBy + '.csv', 'data-test': 'spend-csv-link' });
      document.body.appendChild(a);
      a.click();
      setTimeout(() => { URL.revokeObjectURL(url); a.remove(); }, 1000);
      toast('CSV downloaded');
    } catch (e) {
      toast('CSV download failed: ' + e.message, true);
    }
  }

  // Charts: inline SVG drawn at the panel's width in pixels (so text stays legible on a
  // phone), with a viewBox so they still scale if the window is resized afterwards.
  const CH = 220;
  const PAD = { l: 58, r: 12, t: 12, b: 26 };

  function chartWidth(panel) {
    return Math.max(280, Math.min(1400, Math.floor(panel.clientWidth - 2 * 16)));
  }

  /// A maximum for the y axis whose quarter is a round number.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const q = v / 4;
    const p = Math.pow(10, Math.floor(Math.log10(q)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= q) return 4 * m * p;
    return 40 * p;
  }

  function axes(svgEl, days, max, cw, yFmt, xFmt) {
    const ih = CH - PAD.t - PAD.b;
    for (let i = 0; i <= 4; i++) {
      const y = PAD.t + ih - (ih * i) / 4;
      svgEl.appendChild(s('line', { class: i ? 'grid-line' : 'axis', x1: PAD.l, x2: cw - PAD.r, y1: y, y2: y }));
      svgEl.appendChild(s('text', { x: PAD.l - 6, y: y + 4, 'text-anchor': 'end' }, yFmt ? yFmt((max * i) / 4) : usd((max * i) / 4).replace(/\.00$/, '')));
    }
    const iw = cw - PAD.l - PAD.r;
    const labels = Math.max(2, Math.floor(iw / 56));
    const step = Math.max(1, Math.ceil(days.length / labels));
    days.forEach((d, i) => {
      // Label every step-th day counted back from today, so the last day always has one.
      if ((days.length - 1 - i) % step !== 0) return;
      const x = PAD.l + (iw * (i + 0.5)) / days.length;
      svgEl.appendChild(s('text', { x, y: CH - 8, 'text-anchor': 'middle' }, xFmt ? xFmt(d) : d.slice(5)));
    });
  }

  function stackedBars(days, rows, g, keys, colors, test, CW) {
    const svgEl = s('svg', { class: 'chart', viewBox: '0 0 ' + CW + ' ' + CH, width: CW, height: CH, role: 'img', 'aria-label': 'spend by ' + g + ' per day', 'data-test': test });
    const byDay = new Map(days.map((d) => [d, new Map()]));
    for (const r of rows) {
      const d = String(r.bucket_start || '').slice(0, 10);
      const k = r[g] === null || r[g] === undefined ? '(none)' : String(r[g]);
      if (!byDay.has(d)) continue;
      const m = byDay.get(d);
      m.set(k, (m.get(k) || 0) + Number(r.amount_usd));
    }
    const max = niceMax(Math.max(0, ...[...byDay.values()].map((m) => [...m.values()].reduce((a, b) => a + b, 0))));
    axes(svgEl, days, max, CW);
    const iw = CW - PAD.l - PAD.r;
    const ih = CH - PAD.t - PAD.b;
    const bw = iw / days.length;
    days.forEach((d, i) => {
      let y = PAD.t + ih;
      for (const k of keys) {
        const v = byDay.get(d).get(k) || 0;
        if (v <= 0) continue;
        const hgt = (ih * v) / max;
        y -= hgt;
        svgEl.appendChild(s('rect', { x: (PAD.l + i * bw + bw * 0.15).toFixed(1), y: y.toFixed(1), width: Math.max(1, bw * 0.7).toFixed(1), height: Math.max(0.5, hgt).toFixed(1), fill: colors.get(k), 'data-test': 'bar' },
          s('title', null, k + ' · ' + d + ': ' + usd(v))));
      }
    });
    return svgEl;
  }

  function lineChart(days, values, test, CW) {
    const svgEl = s('svg', { class: 'chart', viewBox: '0 0 ' + CW + ' ' + CH, width: CW, height: CH, role: 'img', 'aria-label': 'cumulative spend', 'data-test': test });
    const max = niceMax(Math.max(0, ...values));
    axes(svgEl, days, max, CW);
    const iw = CW - PAD.l - PAD.r;
    const ih = CH - PAD.t - PAD.b;
    const pts = values.map((v, i) => [PAD.l + (iw * (i + 0.5)) / days.length, PAD.t + ih - (ih * v) / max]);
    if (pts.length) {
      svgEl.appendChild(s('path', {
        d: pts.map((p, i) => (i ? 'L' : 'M') + p[0].toFixed(1) + ' ' + p[1].toFixed(1)).join(' '),
        fill: 'none', stroke: '#2f7dd1', 'stroke-width': 2,
      }));
      pts.forEach((p, i) => svgEl.appendChild(s('circle', { cx: p[0].toFixed(1), cy: p[1].toFixed(1), r: 2.5, fill: '#2f7dd1' },
        s('title', null, days[i] + ': ' + usd(values[i])))));
    }
    return svgEl;
  }

  // ---- Instances ---------------------------------------------------------------------------

  async function instancesPage(root, _args, params, seq) {
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Instances'),
      h('span', { class: 'muted small' }, 'Cloud machines the broker launched for bursts, with what they cost.')));
    const showEnded = h('input', { type: 'checkbox', checked: params.ended === '1', 'data-test': 'instances-show-ended' });
    root.appendChild(h('div', { class: 'filters' }, h('label', { class: 'check' }, showEnded, 'Show terminated')));
    const holder = h('div', { class: 'panel' });
    root.appendChild(holder);
    let data = await get('/api/v1/instances');
    if (!live(seq)) return;
    const emptyText = () => {
      if (!data.instances.length) return 'No cloud instances: the broker has not launched any. Bursts to the cloud show here; on-prem nodes are on the Catalogue page.';
      return 'No live cloud instance (tick “Show terminated” for past ones).';
    };
    const draw = () => {
      const rows = data.instances.filter((i) => showEnded.checked || i.state !== 'terminated');
      const running = data.instances.filter((i) => i.state !== 'terminated');
      clear(holder);
      holder.appendChild(h('p', { class: 'muted small', 'data-test': 'instances-summary' },
        running.length + ' live · ' + usd(running.reduce((a, i) => a + Number(i.hourly_price_usd), 0)) + '/h · ' +
        usd(data.instances.reduce((a, i) => a + Number(i.cost_usd), 0)) + ' spent in all'));
      holder.appendChild(table(['Instance', 'Provider id', 'Pool', 'State', 'Market', ['$/h', 'num'], ['Uptime', 'num'], ['Cost to date', 'num'], 'For job', 'Node', 'Launched', 'Ended', 'Note'],
        rows.map((i) => {
          const up = between(i.launched_at || i.requested_at, i.ended_at);
          return h('tr', { 'data-test': 'instance-row', 'data-instance': i.id, 'data-state': i.state },
            h('td', null, h('div', { class: 'mono small', title: i.id }, short(i.id))),
            h('td', { class: 'mono small', 'data-test': 'instance-provider-id' }, i.provider_id || '—'),
            h('td', { class: 'small' }, i.pool),
            h('td', null, badge(i.state)),
            h('td', null, String(i.market).replace(/_/g, '-')),
            h('td', { class: 'num' }, usd(i.hourly_price_usd)),
            h('td', { class: 'num', 'data-test': 'instance-uptime', title: (i.launched_at ? 'launched ' + dt(i.launched_at) : 'requested ' + dt(i.requested_at)) + (i.ended_at ? ', ended ' + dt(i.ended_at) : ', running') },
              up === null ? '—' : duration(up) + (i.ended_at ? '' : ' so far')),
            h('td', { class: 'num', 'data-test': 'instance-cost' }, usd(i.cost_usd)),
            h('td', null, i.for_job ? h('a', { href: '#/jobs/' + i.for_job }, short(i.for_job)) : '—'),
            h('td', { class: 'small' }, i.node ? nodeRef(i.node) : '—'),
            h('td', { class: 'small', title: dt(i.launched_at || i.requested_at) }, ago(i.launched_at || i.requested_at)),
            h('td', { class: 'small', title: dt(i.ended_at) }, i.ended_at ? ago(i.ended_at) : '—'),
            h('td', { class: 'small' }, i.last_error && i.last_error !== 'idle' ? i.last_error : (i.state === 'terminated' && i.last_error === 'idle' ? 'released when idle' : '')));
        }),
        { test: 'instances-table', stack: true, empty: emptyText() }));
    };
    showEnded.addEventListener('change', draw);
    draw();
    // Uptime and cost to date of live instances move: read them again every 5 s.
    every(5000, async () => {
      const next = await settle(get('/api/v1/instances'));
      if (!live(seq) || next instanceof ApiError) return;
      data = next;
      draw();
    });
  }

  // ---- Nodes -------------------------------------------------------------------------------

  const GPU_METRICS = [
    { key: 'utilization_pct', title: 'Utilisation', fmt: (v) => Math.round(v) + '%', max: 100 },
    { key: 'memory_used_mb', title: 'Memory used', fmt: (v) => (v >= 1024 ? (v / 1024).toFixed(1) + ' GB' : Math.round(v) + ' MB') },
    { key: 'temperature_c', title: 'Temperature', fmt: (v) => Math.round(v) + ' °C' },
    { key: 'power_w', title: 'Power', fmt: (v) => Math.round(v) + ' W' },
  ];

  async function nodePage(root, args, _params, seq) {
    const id = args[0];
    root.appendChild(h('p', null, h('a', { href: '#/catalogue', 'data-test': 'back-to-catalogue' }, '← Catalogue')));
    const body = h('div', { 'data-test': 'node-detail', 'data-node': id || '' });
    root.appendChild(body);
    if (!id) { body.appendChild(notice('No node named: open one from the catalogue’s node list.', false)); return; }
    const load = async () => {
      const n = await settle(get('/api/v1/nodes/' + encodeURIComponent(id)));
      if (!live(seq)) return;
      clear(body);
      if (n instanceof ApiError) {
        body.appendChild(notice(n.status === 404 ? 'No node ' + id + ' (it may have been retired).' : n.message, n.status !== 404, 'node-error'));
        return;
      }
      body.appendChild(h('div', { class: 'page-head' },
        h('h1', null, n.hostname || short(n.id), ' ',
          h('span', { class: 'badge ' + (n.healthy ? 'ready' : 'failed'), 'data-test': 'node-health' }, n.healthy ? 'healthy' : 'unhealthy'), n.draining ? [' ', badge('draining')] : null),
        h('span', { class: 'muted small' }, 'last heartbeat ', h('span', { title: dt(n.last_heartbeat), 'data-test': 'node-heartbeat' }, ago(n.last_heartbeat)))));
      // Infra and admin drain a node by hand (no new work; running work finishes), or undrain it:
      // it takes work again and its GPUs' health marks are cleared (issue 28).
      if (can.editPools() && !n.revoked) {
        const verb = n.draining ? 'undrain' : 'drain';
        body.appendChild(h('p', null, h('button', {
          type: 'button', class: n.draining ? '' : 'danger', 'data-test': 'node-' + verb,
          onclick: async () => {
            try {
              await api('POST', '/api/v1/nodes/' + encodeURIComponent(id) + '/' + verb);
              toast(n.draining ? 'Node takes work again' : 'Node draining: no new work');
              load();
            } catch (e) { toast(e.message, true); }
          },
        }, n.draining ? 'Undrain: take work again, clear GPU health marks' : 'Drain: no new work')));
      }
      body.appendChild(h('div', { class: 'panel' }, kv([
        ['Id', nodeRefFull(n.id)],
        ['Pool', h('a', { href: '#/catalogue', 'data-test': 'node-pool' }, n.pool)],
        ['Health', n.healthy ? 'healthy' : 'unhealthy'],
        ['Isolation', n.isolation ? 'each job runs as its own uid' : 'jobs run as the agent’s user (not isolated)'],
        ['GPUs', n.simulated ? 'simulated (declared with --fake-gpus, not read from NVML)' : 'read from NVML'],
        ['Registered', dt(n.registered_at)],
      ])));
      const gpus = n.gpus || [];
      const reported = (g, k) => g[k] !== null && g[k] !== undefined;
      const anyFigure = gpus.some((g) => GPU_METRICS.some((m) => reported(g, m.key)));
      const gp = h('div', { class: 'panel', 'data-test': 'node-gpus' }, h('h2', null, 'GPUs'));
      if (!anyFigure) {
        gp.appendChild(h('p', { class: 'muted', 'data-test': 'node-not-reported' }, n.simulated
          ? 'These simulated GPUs report no utilisation, memory, temperature or power.'
          : 'The agent has not reported utilisation, memory, temperature or power for these GPUs.'));
      }
      const runningOn = (idx) => (n.running || []).filter((r) => (r.gpus || []).includes(idx));
      // Health (issue 28): a GPU a health rule marked takes no new work; its reasons say why.
      const sick = gpus.filter((g) => g.healthy === false);
      if (sick.length) {
        gp.appendChild(notice(sick.length + ' of ' + gpus.length + ' GPU' + (gpus.length === 1 ? '' : 's') +
          ' unhealthy: ' + sick.flatMap((g) => g.reasons || []).join('; ') +
          (sick.length === gpus.length ? '. The node takes no new work.' : '. The others still take work.'), true, 'node-gpu-sick'));
      }
      gp.appendChild(table(['GPU', 'Model', 'Health', ['Memory', 'num'], ...GPU_METRICS.map((m) => [m.title, 'num']), 'Running'],
        gpus.map((g) => h('tr', { 'data-test': 'node-gpu-row', 'data-index': g.index },
          h('td', null, String(g.index)),
          h('td', null, g.model, g.vendor ? h('div', { class: 'small muted' }, g.vendor) : null),
          h('td', { 'data-test': 'node-gpu-health' }, g.healthy === false
            ? [h('span', { class: 'badge failed' }, 'unhealthy'), ...(g.reasons || []).map((r) => h('div', { class: 'small' }, r))]
            : h('span', { class: 'badge ready' }, 'healthy')),
          h('td', { class: 'num' }, GPU_METRICS[1].fmt(g.memory_total_mb)),
          GPU_METRICS.map((m) => h('td', { class: 'num' + (reported(g, m.key) ? '' : ' muted small'), 'data-metric': m.key }, reported(g, m.key) ? m.fmt(g[m.key]) : 'not reported')),
          h('td', { class: 'small' }, runningOn(g.index).map((r) => h('div', null, jobRef(r))))),
        ), { test: 'node-gpus-table', empty: 'No GPUs reported.' }));
      body.appendChild(gp);
      const rp = h('div', { class: 'panel', 'data-test': 'node-running' }, h('h2', null, 'Running now'));
      rp.appendChild(table(['Job', 'Team', 'GPUs', 'Started'],
        (n.running || []).map((r) => h('tr', { 'data-test': 'node-job-row', 'data-job-id': r.job_id },
          h('td', null, jobRef(r)), h('td', null, r.team), h('td', null, (r.gpus || []).join(', ')),
          h('td', { class: 'small', title: dt(r.started_at) }, r.started_at ? ago(r.started_at) : '—'))),
        { test: 'node-jobs-table', empty: 'Nothing runs on this node now.' }));
      body.appendChild(rp);
      const hp = h('div', { class: 'panel', 'data-test': 'node-history' }, h('h2', null, 'History'),
        h('p', { class: 'muted small' }, 'From the agent’s heartbeats since this broker started (at most the last hour).'));
      body.appendChild(hp);
      const hist = n.history || [];
      const grid = h('div', { class: 'grid charts' });
      hp.appendChild(grid);
      const times = hist.map((x) => x.at);
      const indexes = [...new Set([...gpus.map((g) => g.index), ...hist.flatMap((x) => (x.gpus || []).map((g) => g.index))])].sort((a, b) => a - b);
      for (const m of GPU_METRICS) {
        const cp = h('div', { 'data-test': 'node-chart-panel', 'data-metric': m.key }, h('h3', null, m.title));
        grid.appendChild(cp);
        const series = indexes.map((idx, j) => ({
          label: 'GPU ' + idx, color: PALETTE[j % PALETTE.length], fmt: m.fmt,
          values: hist.map((x) => { const g = (x.gpus || []).find((y) => y.index === idx); return g && reported(g, m.key) ? Number(g[m.key]) : null; }),
        }));
        if (!series.some((x) => x.values.some((v) => v !== null))) {
          cp.appendChild(h('p', { class: 'muted small', 'data-test': 'node-chart-none' }, hist.length
            ? 'Not reported' + (n.simulated ? ' by simulated GPUs.' : ' by this node’s agent.')
            : 'No heartbeats recorded yet.'));
          continue;
        }
        cp.appendChild(multiLineChart(times, series, 'node-chart-' + m.key, Math.max(280, Math.min(700, Math.floor((hp.clientWidth - 48) / 2))),
          { max: m.max || null, yFmt: m.fmt, xFmt: (t) => dt(t).slice(11, 16), xTitle: (t) => dt(t) }));
      }
    };
    await load();
    every(5000, () => { load().catch(() => {}); });
  }

  function jobRef(r) {
    return r.name ? h('a', { href: '#/jobs/' + r.job_id, 'data-test': 'node-job-link' }, r.name) : h('span', { class: 'muted' }, 'another team’s job');
  }

  function nodeRefFull(id) {
    return h('span', null, h('span', { class: 'mono small', 'data-test': 'node-id' }, id), ' ',
      h('button', { type: 'button', class: 'link small', 'data-test': 'node-copy', 'data-node': id, onclick: () => copyText(id) }, 'copy'));
  }

  // ---- Audit -------------------------------------------------------------------------------

  const AUDIT_ACTIONS = ['policy.put', 'pool.patch', 'token.create', 'token.revoke', 'budget.alert', 'enrolment.create', 'agent.revoke'];

  async function auditPage(root, _args, params, seq) {
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Audit log'),
      h('span', { class: 'muted small' }, 'Every change to policies, pools and tokens, and budget alerts. Append-only, newest first.')));
    const target = h('input', { type: 'text', value: params.target || '', placeholder: 'e.g. policy:ml', 'data-test': 'audit-target-filter' });
    const actor = h('input', { type: 'text', value: params.actor || '', placeholder: 'e.g. finance:alice', list: 'audit-actors', 'data-test': 'audit-actor-filter' });
    const actors = h('datalist', { id: 'audit-actors' });
    const action = h('select', { 'data-test': 'audit-action-filter' }, h('option', { value: '' }, 'Any action'),
      [...new Set([...AUDIT_ACTIONS, params.action].filter(Boolean))].map((x) => h('option', { value: x, selected: params.action === x }, x)));
    const from = h('input', { type: 'datetime-local', step: '1', value: params.from ? localInput(params.from) : '', 'data-test': 'audit-from-filter' });
    const to = h('input', { type: 'datetime-local', step: '1', value: params.to ? localInput(params.to) : '', 'data-test': 'audit-to-filter' });
    const go = h('button', { type: 'submit', class: 'secondary', 'data-test': 'audit-filter' }, 'Filter');
    const iso = (v) => (v ? new Date(v + (v.length === 16 ? ':00' : '') + 'Z').toISOString() : '');
    root.appendChild(h('form', {
      class: 'filters', 'data-test': 'audit-filters',
      onsubmit: (ev) => {
        ev.preventDefault();
        location.hash = '#/audit' + qs({ target: target.value.trim(), actor: actor.value.trim(), action: action.value, from: iso(from.value), to: iso(to.value) });
      },
    }, field('Target', target, 'audit-target'), field('Actor', actor, 'audit-actor'), actors, field('Action', action, 'audit-action'),
    field('From (UTC)', from, 'audit-from'), field('To (UTC)', to, 'audit-to'), h('div', { class: 'actions' }, go)));
    const AUDIT_COLUMNS = ['When', 'Actor', 'Action', 'Target', 'Change'];
    const body = h('tbody', { 'data-test': 'audit-body' });
    const more = h('button', { type: 'button', class: 'secondary', 'data-test': 'audit-more', hidden: true }, 'Older entries');
    const empty = h('p', { class: 'empty', hidden: true, 'data-test': 'audit-empty' }, 'No entries.');
    root.appendChild(h('div', { class: 'panel' },
      h('div', { class: 'table-wrap' }, h('table', { 'data-test': 'audit-table', class: 'stack' },
        h('thead', null, h('tr', null, AUDIT_COLUMNS.map((x) => h('th', null, x)))), body)),
      empty, h('div', { class: 'actions' }, more)));
    // The broker filters (GET /audit takes actor, action, from and to).
    const f = { actor: params.actor || '', action: params.action || '', from: params.from || '', to: params.to || '' };
    const seenActors = new Set();
    let cursor = null;
    const load = async () => {
      const data = await get('/api/v1/audit' + qs(Object.assign({ limit: 50, cursor, target: params.target }, f)));
      if (!live(seq)) return;
      for (const e of data.entries) {
        if (!seenActors.has(e.actor)) { seenActors.add(e.actor); actors.appendChild(h('option', { value: e.actor })); }
        if (!action.querySelector('option[value="' + CSS.escape(e.action) + '"]')) action.appendChild(h('option', { value: e.action }, e.action));
        const tr = body.appendChild(h('tr', { 'data-test': 'audit-row', 'data-action': e.action, 'data-target': e.target, 'data-actor': e.actor, 'data-at': e.at },
          h('td', { class: 'small', title: e.at }, dt(e.at)),
          h('td', { 'data-test': 'audit-actor' }, e.actor),
          h('td', { 'data-test': 'audit-action' }, e.action),
          h('td', { class: 'mono small', 'data-test': 'audit-target' }, e.target),
          h('td', { class: 'small' }, changeSummary(e.before, e.after))));
        labelCells(tr, AUDIT_COLUMNS);
      }
      cursor = data.next_cursor;
      empty.hidden = body.children.length > 0;
      more.hidden = !cursor;
    };
    more.addEventListener('click', () => { load().catch((e) => toast(e.message, true)); });
    await load();
  }

  function changeSummary(before, after) {
    const flat = (v, prefix, out) => {
      if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
        for (const [k, x] of Object.entries(v)) flat(x, prefix ? prefix + '.' + k : k, out);
      } else if (prefix) {
        out.set(prefix, JSON.stringify(v));
      }
      return out;
    };
    const a = flat(before, '', new Map());
    const b = flat(after, '', new Map());
    const changed = [];
    for (const k of new Set([...a.keys(), ...b.keys()])) {
      if (a.get(k) !== b.get(k)) changed.push(k + ': ' + (a.has(k) ? a.get(k) : '∅') + ' → ' + (b.has(k) ? b.get(k) : '∅'));
    }
    const lines = changed.slice(0, 6).map((c) => h('div', { 'data-test': 'audit-change' }, c));
    if (changed.length > 6) lines.push(h('div', { class: 'muted' }, '… ' + (changed.length - 6) + ' more'));
    return [lines.length ? lines : h('span', { class: 'muted' }, before === null && after === null ? '' : 'no field changed'),
      h('details', null, h('summary', null, 'JSON'),
        h('pre', null, 'before: ' + JSON.stringify(before, null, 2) + '\nafter: ' + JSON.stringify(after, null, 2)))];
  }

  // ---- Start -------------------------------------------------------------------------------

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', boot);
  } else {
    boot();
  }
}());
