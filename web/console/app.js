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
  };

  const ROLES_ALL = ['admin', 'finance', 'infra', 'developer'];
  const PAGES = [
    { id: 'overview', title: 'Overview', roles: ROLES_ALL, render: overviewPage },
    { id: 'catalogue', title: 'Catalogue', roles: ROLES_ALL, render: cataloguePage },
    { id: 'jobs', title: 'Jobs', roles: ROLES_ALL, render: jobsPage },
    { id: 'policies', title: 'Policies', roles: ROLES_ALL, render: policiesPage },
    { id: 'spend', title: 'Spend', roles: ROLES_ALL, render: spendPage },
    { id: 'instances', title: 'Instances', roles: ['admin', 'infra', 'finance'], render: instancesPage },
    { id: 'audit', title: 'Audit', roles: ['admin', 'finance', 'infra'], render: auditPage },
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

  function usd(x) {
    const n = Number(x);
    if (!Number.isFinite(n)) return '—';
    const abs = Math.abs(n);
    const digits = abs !== 0 && abs < 1 ? 4 : 2;
    return (n < 0 ? '-$' : '$') + abs.toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: digits });
  }

  function pct(f) {
    const n = Number(f);
    return Number.isFinite(n) ? (n * 100).toFixed(n < 0.1 && n > 0 ? 1 : 0) + '%' : '—';
  }

  function dt(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return d.toISOString().slice(0, 16).replace('T', ' ') + ' UTC';
  }

  function dtShort(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return d.toISOString().slice(5, 16).replace('T', ' ');
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
    if (v < 5400) return Math.round(v / 60) + ' min';
    if (v < 172800) return (v / 3600).toFixed(1) + ' h';
    return Math.round(v / 86400) + ' d';
  }

  // Ids are UUIDv7: their first digits are a timestamp shared by jobs submitted together.
  function short(id) { return String(id || '').slice(-8); }

  function describe(v) {
    if (v === null || v === undefined) return '—';
    if (typeof v !== 'object') return String(v).replace(/_/g, ' ');
    const tag = v.code || v.decision || v.kind;
    const rest = Object.entries(v)
      .filter(([k]) => !['code', 'decision', 'kind'].includes(k))
      .map(([k, x]) => k.replace(/_/g, ' ') + ' ' + (typeof x === 'object' ? JSON.stringify(x) : x));
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
    window.addEventListener('hashchange', route);
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

  function route() {
    stopTimers();
    S.seq += 1;
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
    let def = PAGES.find((p) => p.id === id && p.roles.includes(S.me.role));
    if (!def) {
      if (id !== 'overview' && id !== 'login') toast('No such page here: ' + id, true);
      def = PAGES[0];
    }
    for (const a of document.querySelectorAll('#nav a')) {
      a.classList.toggle('active', a.getAttribute('data-page') === def.id);
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
    const spent = budgetRows.reduce((a, b) => a + Number(b.spent_usd || 0), 0);

    root.appendChild(h('div', { class: 'cards', 'data-test': 'overview-cards' },
      card('Running jobs', count('running'), 'card-running'),
      card('Waiting', count('queued') + count('provisioning') + count('placed'), 'card-waiting'),
      card('Held', count('held'), 'card-held'),
      card('GPUs in use', (gpusTotal - gpusFree) + ' / ' + gpusTotal, 'card-gpus'),
      card('Spent this period', usd(spent), 'card-spent')));

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
            h('td', { class: 'small hide-narrow' }, dt(b.period_start).slice(0, 10) + ' → ' + dt(b.period_end).slice(0, 10)),
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
    const held = jobs.filter((j) => j.state === 'held');
    if (held.length) {
      qp.appendChild(h('h3', null, 'Held jobs'));
      qp.appendChild(h('ul', { 'data-test': 'held-list' }, held.slice(0, 8).map((j) => h('li', null,
        h('a', { href: '#/jobs/' + j.id }, j.name), ' (' + j.team + '): ', h('span', { class: 'muted' }, j.reason || 'held')))));
    }
    grid.appendChild(qp);
  }

  /// The budget's `alert_at` thresholds its spend has crossed this period, as words
  /// ("50%, 90% alerts crossed"); '' when none.
  function alertText(b) {
    const crossed = (b.alerts_crossed || []).map(Number).filter(Number.isFinite).sort((x, y) => x - y);
    if (!crossed.length) return '';
    return crossed.map(pct).join(', ') + (crossed.length === 1 ? ' alert' : ' alerts') + ' crossed';
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
          h('td', { class: 'num hide-narrow' }, p.spot_price_per_gpu_hour === null || p.spot_price_per_gpu_hour === undefined ? '—' : usd(p.spot_price_per_gpu_hour)),
          h('td', { class: 'num' }, p.latency_ms + ' ms'),
          h('td', { class: 'num hide-narrow' }, p.nodes + ' / ' + p.node_limit, h('div', { class: 'small muted' }, p.launchable ? 'launchable' : 'fixed')),
          h('td', { class: 'num' }, p.gpus_free + ' / ' + p.gpus_total),
          h('td', null, bar(util), h('div', { class: 'small muted' }, pct(util))),
          h('td', { class: 'num', title: dt(p.price_updated_at), 'data-test': 'pool-price-age' }, ago(p.price_updated_at)),
          can.editPools() ? h('td', null, h('button', {
            type: 'button', class: 'secondary', 'data-test': 'pool-edit',
            onclick: () => togglePoolEditor(tr, p),
          }, 'Edit')) : null);
        trs.push(tr);
      }
      holder.appendChild(table(['Pool', ['Provider', 'hide-narrow'], ['Region', 'hide-narrow'], 'GPU', ['$/GPU-h', 'num'], ['Spot', 'num hide-narrow'], ['Latency', 'num'],
        ['Nodes', 'num hide-narrow'], ['GPUs free', 'num'], 'Utilisation', ['Price age', 'num'], can.editPools() ? '' : null].filter((x) => x !== null),
      trs, { test: 'pools-table', empty: 'No pool matches.', stack: true }));
    };
    [provSel, modelSel, sortSel].forEach((el) => el.addEventListener('change', draw));
    search.addEventListener('input', draw);
    draw();
  }

  function togglePoolEditor(tr, pool) {
    const next = tr.nextElementSibling;
    if (next && next.classList.contains('editor-row')) { next.remove(); return; }
    const limit = h('input', { type: 'number', min: '0', step: '1', value: pool.node_limit, 'data-test': 'pool-node-limit' });
    const price = h('input', { type: 'number', min: '0', step: '0.01', value: pool.price_per_gpu_hour, 'data-test': 'pool-price-input' });
    const launch = h('input', { type: 'checkbox', checked: pool.launchable, 'data-test': 'pool-launchable' });
    const errors = {};
    const f = (label, input, key) => {
      const fe = field(label, input, null, key);
      errors[key] = fe;
      return fe;
    };
    const status = h('span', { class: 'small', 'data-test': 'pool-edit-status' });
    const form = h('form', { class: 'form-grid', 'data-test': 'pool-editor' },
      f('Node limit', limit, 'node_limit'),
      f('Price per GPU-hour (USD)', price, 'price_per_gpu_hour'),
      h('div', { class: 'field', 'data-field': 'launchable' }, h('label', { class: 'check' }, launch, 'Launchable (burst allowed)')),
      h('div', { class: 'actions' }, h('button', { type: 'submit', 'data-test': 'pool-save' }, 'Save'), status));
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      clearFieldErrors(form);
      const body = {};
      if (String(limit.value) !== String(pool.node_limit)) body.node_limit = numOrRaw(limit.value);
      if (String(price.value) !== String(pool.price_per_gpu_hour)) body.price_per_gpu_hour = numOrRaw(price.value);
      if (launch.checked !== pool.launchable) body.launchable = launch.checked;
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
  function showFieldError(form, e) {
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
      slot.textContent = e.message.startsWith(prefix) ? e.message.slice(prefix.length) : e.message;
      if (path !== e.field) slot.textContent = e.field + ': ' + slot.textContent;
      slot.hidden = false;
    }
    const input = target.querySelector('input, select, textarea');
    if (input) input.focus();
    return true;
  }

  function setFieldError(form, path, message) {
    return showFieldError(form, { field: path, message });
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
    const load = async () => {
      const [job, placement, logs] = await Promise.all([
        get('/api/v1/jobs/' + encodeURIComponent(id)),
        settle(get('/api/v1/jobs/' + encodeURIComponent(id) + '/placement')),
        settle(get('/api/v1/jobs/' + encodeURIComponent(id) + '/logs?limit=1000')),
      ]);
      if (!live(seq)) return null;
      clear(body);
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
      body.appendChild(head);
      if (job.reason) body.appendChild(notice('Reason: ' + job.reason, job.state === 'failed', 'detail-reason'));
      const spec = job.spec || {};
      const res = spec.resources || {};
      const grid = h('div', { class: 'grid two' });
      body.appendChild(grid);
      grid.appendChild(h('div', { class: 'panel' }, h('h2', null, 'Job'), kv([
        ['Id', h('span', { class: 'mono small' }, job.id)],
        ['Team', teamLabel(job.team, job.project)],
        ['Priority', job.priority + (job.kind ? ' · ' + job.kind : '')],
        ['Resources', res.gpus + ' GPU' + (res.gpus === 1 ? '' : 's') + (res.gpu_models && res.gpu_models.length ? ' (' + res.gpu_models.join(', ') + ')' : '') + (res.nodes > 1 ? ' × ' + res.nodes + ' nodes' : '')],
        ['Command', h('span', { class: 'mono small' }, (spec.command || []).join(' '))],
        ['Estimated runtime', spec.estimated_runtime_s ? duration(spec.estimated_runtime_s) : '—'],
        ['Deadline', dt(spec.deadline)],
        ['Submitted', dt(job.submitted_at)],
        ['Started', dt(job.started_at)],
        ['Finished', dt(job.finished_at)],
        ['Attempts', String(job.attempts)],
        ['Exit code', job.exit_code === null || job.exit_code === undefined ? '—' : String(job.exit_code)],
        ['Cost to date', h('span', { 'data-test': 'detail-cost' }, job.cost_usd === undefined ? '—' : usd(job.cost_usd))],
        ['Runs on', job.placement ? job.placement.pool + ' · ' + job.placement.node.slice(0, 12) + ' · GPUs ' + job.placement.gpus.join(',') + ' · ' + job.placement.market : '—'],
      ])));
      const pp = h('div', { class: 'panel wide', 'data-test': 'detail-placement' }, h('h2', null, 'Placement explanation'));
      if (placement instanceof ApiError) {
        pp.appendChild(h('p', { class: 'muted' }, placement.status === 404 ? 'Not planned yet.' : placement.message));
      } else {
        pp.appendChild(h('p', null, h('strong', null, 'Decision: '), h('span', { 'data-test': 'placement-outcome' }, describe(placement.outcome)),
          h('span', { class: 'muted small' }, ' · planned ' + ago(placement.planned_at))));
        pp.appendChild(table(['Pool', 'Verdict', ['Cost', 'num'], 'Start', 'Finish', 'Kind', 'Market'],
          placement.candidates.map((c) => h('tr', { 'data-test': 'candidate-row' },
            h('td', null, h('div', { class: 'mono small' }, c.pool), c.node ? h('div', { class: 'small muted' }, 'node ' + c.node.slice(0, 12)) : null),
            h('td', { class: 'small' }, c.rejected ? describe(c.rejected) : h('strong', { class: 'ok' }, 'chosen')),
            h('td', { class: 'num' }, usd(c.cost_usd)),
            h('td', { class: 'small nowrap' }, dtShort(c.start)), h('td', { class: 'small nowrap' }, dtShort(c.finish)),
            h('td', null, c.kind), h('td', null, c.market))),
          { test: 'candidates-table', empty: 'No candidate pool.' }));
      }
      const lp = h('div', { class: 'panel', 'data-test': 'detail-logs' }, h('h2', null, 'Logs'));
      if (logs instanceof ApiError) {
        lp.appendChild(h('p', { class: 'muted' }, logs.message));
      } else if (!logs.entries.length) {
        lp.appendChild(h('p', { class: 'muted' }, TERMINAL.includes(job.state) ? 'No output.' : 'No output yet.'));
      } else {
        lp.appendChild(h('pre', { 'data-test': 'log-text' }, logs.entries.map((e) => (e.stream === 'stdout' ? '' : '[' + e.stream + '] ') + e.text).join('')));
      }
      grid.appendChild(lp);
      grid.appendChild(pp);
      return job;
    };
    const job = await load();
    if (job && !TERMINAL.includes(job.state)) {
      every(3000, () => { load().catch(() => {}); });
    }
  }

  function kv(pairs) {
    return h('dl', { class: 'kv' }, pairs.map(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
  }

  // ---- Policies ----------------------------------------------------------------------------

  async function policiesPage(root, args, params, seq) {
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Policies'),
      h('span', { class: 'muted small' }, can.editPolicies()
        ? 'Budgets and placement rules per team. Every save is a new version, recorded in the audit log.'
        : 'Read only: finance and admin edit policies.')));
    const [list, budgets, jobs] = await Promise.all([
      get('/api/v1/policies'),
      settle(get('/api/v1/budgets')),
      settle(get('/api/v1/jobs?limit=500')),
    ]);
    if (!live(seq)) return;
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
    if (selTeam) add(selTeam, selProject);
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
      budgets instanceof ApiError ? null : budgets.budgets.find((b) => b.team === selTeam && (b.project || null) === (selProject || null))));
  }

  function policyForm(team, project, view, etag, budgetNow) {
    const policy = (view && view.policy) || {};
    const editable = can.editPolicies();
    const b = policy.budget || null;
    const dis = !editable;
    const state = { version: view ? view.version : null, etag };

    const hasBudget = h('input', { type: 'checkbox', checked: Boolean(b), disabled: dis, 'data-test': 'field-budget.enabled' });
    const amount = h('input', { type: 'number', step: 'any', min: '0', value: b ? b.amount_usd : '', disabled: dis });
    const period = selectOf(['month', 'week', 'custom'], b ? b.period : 'month', dis);
    const from = h('input', { type: 'datetime-local', value: b && b.from ? localInput(b.from) : '', disabled: dis });
    const to = h('input', { type: 'datetime-local', value: b && b.to ? localInput(b.to) : '', disabled: dis });
    const enforcement = selectOf(['hard', 'soft'], b ? b.enforcement : 'hard', dis);
    const alertAt = h('input', { type: 'text', value: b && b.alert_at ? b.alert_at.join(', ') : '0.5, 0.9', disabled: dis, placeholder: '0.5, 0.9' });
    const fromF = field('From (UTC)', from, null, 'budget.from');
    const toF = field('To (UTC)', to, null, 'budget.to');
    const budgetFields = h('div', { class: 'form-grid' },
      field('Amount (USD)', amount, null, 'budget.amount_usd'),
      field('Period', period, null, 'budget.period', 'Calendar month or ISO week, UTC'),
      fromF, toF,
      field('Enforcement', enforcement, null, 'budget.enforcement', 'hard: hold jobs that do not fit; soft: alert only'),
      field('Alert at (fractions)', alertAt, null, 'budget.alert_at', 'e.g. 0.5, 0.9'));
    const syncBudget = () => {
      budgetFields.hidden = !hasBudget.checked;
      const custom = period.value === 'custom';
      fromF.hidden = !custom;
      toF.hidden = !custom;
    };
    hasBudget.addEventListener('change', syncBudget);
    period.addEventListener('change', syncBudget);

    const maxPrice = h('input', { type: 'number', step: 'any', min: '0', value: policy.max_price_per_gpu_hour ?? '', disabled: dis, placeholder: 'no limit' });
    const providers = h('input', { type: 'text', value: (policy.allowed_providers || []).join(', '), disabled: dis, placeholder: 'any (e.g. onprem, aws)' });
    const regions = h('input', { type: 'text', value: (policy.allowed_regions || []).join(', '), disabled: dis, placeholder: 'any (e.g. aws:us-east-1)' });
    const spot = selectOf(['', 'never', 'allowed', 'preferred'], policy.spot || '', dis, { '': 'no rule' });
    const burst = selectOf(['', 'true', 'false'], policy.burst === undefined || policy.burst === null ? '' : String(policy.burst), dis, { '': 'no rule', true: 'allowed', false: 'not allowed' });
    const ceiling = selectOf(['', ...PRIORITIES], policy.priority_ceiling || '', dis, { '': 'no ceiling' });

    // Windows and on-prem rates: editable rows.
    const windows = (policy.windows || []).map((w) => Object.assign({}, w));
    const rates = Object.entries(policy.onprem_rates || {}).map(([model, rate]) => ({ model, rate }));
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
          field('From', f, null, 'windows[' + i + '].from'),
          field('To', t, null, 'windows[' + i + '].to'),
          field('Time zone', tz, null, 'windows[' + i + '].tz'),
          editable ? h('button', { type: 'button', class: 'secondary', 'data-test': 'window-remove', onclick: () => { windows.splice(i, 1); drawWindows(); } }, 'Remove') : h('span'),
          h('div', { class: 'field-error', hidden: true })));
      });
      if (!windows.length) windowsBox.appendChild(h('p', { class: 'muted small' }, 'No windows: jobs may start at any time.'));
    };
    const drawRates = () => {
      clear(ratesBox);
      rates.forEach((r, i) => {
        const m = h('input', { type: 'text', value: r.model, placeholder: 'H100', disabled: dis });
        m.addEventListener('input', () => { r.model = m.value; });
        const v = h('input', { type: 'number', step: 'any', min: '0', value: r.rate, disabled: dis });
        v.addEventListener('input', () => { r.rate = v.value; });
        ratesBox.appendChild(h('div', { class: 'row-editor two', 'data-field': 'onprem_rates.' + r.model, 'data-test': 'rate-row' },
          field('GPU model', m, null, 'onprem_rates[' + i + '].model'),
          field('USD per GPU-hour', v, null, 'onprem_rates[' + i + '].rate'),
          editable ? h('button', { type: 'button', class: 'secondary', onclick: () => { rates.splice(i, 1); drawRates(); } }, 'Remove') : h('span'),
          h('div', { class: 'field-error', hidden: true })));
      });
      if (!rates.length) ratesBox.appendChild(h('p', { class: 'muted small' }, 'No internal rates: on-prem pools use their configured price.'));
    };
    drawWindows();
    drawRates();

    const status = h('div', { class: 'small', 'data-test': 'policy-status', role: 'status' });
    const general = h('div', { class: 'field-error', 'data-test': 'policy-error', hidden: true, role: 'alert' });
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
          field('Max price per GPU-hour (USD)', maxPrice, null, 'max_price_per_gpu_hour'),
          field('Allowed providers', providers, null, 'allowed_providers', 'Comma-separated; empty: any'),
          field('Allowed regions', regions, null, 'allowed_regions', 'Comma-separated; empty: any'),
          field('Spot', spot, null, 'spot'),
          field('Burst to the cloud', burst, null, 'burst'),
          field('Priority ceiling', ceiling, null, 'priority_ceiling'))),
      h('fieldset', { 'data-field': 'windows' }, h('legend', null, 'Time windows'), windowsBox,
        h('div', { class: 'field-error', hidden: true }),
        editable ? h('button', {
          type: 'button', class: 'secondary', 'data-test': 'window-add',
          onclick: () => { windows.push({ priority: 'low', from: '20:00', to: '08:00', tz: 'UTC' }); drawWindows(); },
        }, 'Add window') : null),
      h('fieldset', { 'data-field': 'onprem_rates' }, h('legend', null, 'On-prem internal rates'), ratesBox,
        h('div', { class: 'field-error', hidden: true }),
        editable ? h('button', {
          type: 'button', class: 'secondary', 'data-test': 'rate-add',
          onclick: () => { rates.push({ model: 'H100', rate: '' }); drawRates(); },
        }, 'Add rate') : null),
      editable ? h('div', { class: 'actions' }, saveBtn, whatIfBtn, status) : null,
      whatIfOut);
    syncBudget();

    const list = (v) => v.split(',').map((x) => x.trim()).filter(Boolean);
    /// The draft body, or null after marking the fields that cannot be sent.
    const collect = () => {
      clearFieldErrors(form);
      general.hidden = true;
      let ok = true;
      const body = {};
      if (hasBudget.checked) {
        const budget = { period: period.value, enforcement: enforcement.value };
        if (amount.value.trim() === '') { setFieldError(form, 'budget.amount_usd', 'enter an amount in USD'); ok = false; } else budget.amount_usd = numOrRaw(amount.value);
        const alerts = list(alertAt.value).map(Number);
        if (alerts.some((x) => !Number.isFinite(x))) { setFieldError(form, 'budget.alert_at', 'fractions such as 0.5, 0.9'); ok = false; }
        budget.alert_at = alerts;
        if (period.value === 'custom') {
          if (from.value) budget.from = new Date(from.value + 'Z').toISOString();
          if (to.value) budget.to = new Date(to.value + 'Z').toISOString();
        }
        body.budget = budget;
      }
      if (maxPrice.value.trim() !== '') body.max_price_per_gpu_hour = numOrRaw(maxPrice.value);
      if (list(providers.value).length) body.allowed_providers = list(providers.value);
      if (list(regions.value).length) body.allowed_regions = list(regions.value);
      if (spot.value) body.spot = spot.value;
      if (burst.value) body.burst = burst.value === 'true';
      if (ceiling.value) body.priority_ceiling = ceiling.value;
      if (windows.length) {
        body.windows = windows.map((w) => {
          const o = { from: (w.from || '').trim(), to: (w.to || '').trim() };
          if (w.priority) o.priority = w.priority;
          if (w.tz && w.tz.trim()) o.tz = w.tz.trim();
          return o;
        });
      }
      if (rates.length) {
        body.onprem_rates = {};
        rates.forEach((r, i) => {
          if (!r.model.trim()) { setFieldError(form, 'onprem_rates[' + i + '].model', 'name a GPU model'); ok = false; return; }
          body.onprem_rates[r.model.trim()] = numOrRaw(r.rate);
        });
      }
      return ok ? body : null;
    };
    const path = '/api/v1/policies/' + encodeURIComponent(team);
    const query = qs({ project });
    const showError = (e) => {
      if (e.status === 409) {
        general.textContent = 'Someone saved a newer version while you edited. Reload to see it, then apply your change again.';
        general.hidden = false;
        general.appendChild(h('button', { type: 'button', class: 'link', 'data-test': 'policy-reload', onclick: () => route() }, ' Reload'));
      } else if (!showFieldError(form, e)) {
        general.textContent = e.message;
        general.hidden = false;
      }
    };
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      if (!editable) return;
      const body = collect();
      if (!body) return;
      saveBtn.disabled = true;
      status.textContent = 'Saving…';
      try {
        const headers = state.etag ? { 'If-Match': state.etag } : (state.version ? { 'If-Match': '"' + state.version + '"' } : {});
        const r = await api('PUT', path + query, body, headers);
        state.version = r.data.version;
        state.etag = r.headers.get('ETag') || '"' + r.data.version + '"';
        status.textContent = 'Saved version ' + r.data.version + '.';
        status.setAttribute('data-version', String(r.data.version));
        toast('Policy for ' + teamLabel(team, project) + ' saved (version ' + r.data.version + ')');
        $('[data-test="policy-version"]', form).textContent = 'version ' + r.data.version + ' · saved ' + dt(r.data.updated_at) + ' by ' + r.data.updated_by;
        saveBtn.textContent = 'Save new version';
        refreshAfterSave(team, project, r.data.version, form);
      } catch (e) {
        status.textContent = '';
        showError(e);
      } finally {
        saveBtn.disabled = false;
      }
    });
    whatIfBtn.addEventListener('click', async () => {
      const body = collect();
      if (!body) return;
      whatIfBtn.disabled = true;
      clear(whatIfOut).appendChild(h('p', { class: 'muted' }, 'Replaying the team’s recorded jobs…'));
      try {
        const r = await api('POST', path + '/what-if' + query, body);
        clear(whatIfOut).appendChild(whatIfTable(r.data));
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
    const results = await Promise.all(groups.map((g) => settle(get('/api/v1/spend' + qs({ group_by: g, bucket: 'day', from: range.from, to: range.to })))));
    if (!live(seq)) return;
    const dayList = [];
    for (let d = new Date(start); d <= now; d = new Date(d.getTime() + 86400000)) dayList.push(d.toISOString().slice(0, 10));
    const first = results.find((r) => !(r instanceof ApiError));
    root.appendChild(h('div', { class: 'cards' },
      card('Total, last ' + days + ' days', first ? usd(first.total_usd) : '—', 'spend-total'),
      card('Per day (average)', first ? usd(Number(first.total_usd) / days) : '—', 'spend-daily')));
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

  function axes(svgEl, days, max, cw) {
    const ih = CH - PAD.t - PAD.b;
    for (let i = 0; i <= 4; i++) {
      const y = PAD.t + ih - (ih * i) / 4;
      svgEl.appendChild(s('line', { class: i ? 'grid-line' : 'axis', x1: PAD.l, x2: cw - PAD.r, y1: y, y2: y }));
      svgEl.appendChild(s('text', { x: PAD.l - 6, y: y + 4, 'text-anchor': 'end' }, usd((max * i) / 4).replace(/\.00$/, '')));
    }
    const iw = cw - PAD.l - PAD.r;
    const labels = Math.max(2, Math.floor(iw / 56));
    const step = Math.max(1, Math.ceil(days.length / labels));
    days.forEach((d, i) => {
      // Label every step-th day counted back from today, so the last day always has one.
      if ((days.length - 1 - i) % step !== 0) return;
      const x = PAD.l + (iw * (i + 0.5)) / days.length;
      svgEl.appendChild(s('text', { x, y: CH - 8, 'text-anchor': 'middle' }, d.slice(5)));
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
    const data = await get('/api/v1/instances');
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
      holder.appendChild(table(['Instance', 'Pool', 'State', 'Market', ['$/h', 'num'], ['Cost', 'num'], 'For job', 'Requested', 'Ready', 'Ended', 'Last error'],
        rows.map((i) => h('tr', { 'data-test': 'instance-row', 'data-instance': i.id },
          h('td', null, h('div', { class: 'mono small' }, short(i.id)), h('div', { class: 'small muted' }, i.provider_id || '')),
          h('td', { class: 'small' }, i.pool),
          h('td', null, badge(i.state)),
          h('td', null, i.market),
          h('td', { class: 'num' }, usd(i.hourly_price_usd)),
          h('td', { class: 'num' }, usd(i.cost_usd)),
          h('td', null, i.for_job ? h('a', { href: '#/jobs/' + i.for_job }, short(i.for_job)) : '—'),
          h('td', { class: 'small' }, ago(i.requested_at)),
          h('td', { class: 'small' }, i.ready_at ? ago(i.ready_at) : '—'),
          h('td', { class: 'small' }, i.ended_at ? ago(i.ended_at) : '—'),
          h('td', { class: 'small' }, i.last_error || ''))),
        { test: 'instances-table', stack: true, empty: emptyText() }));
    };
    showEnded.addEventListener('change', draw);
    draw();
  }

  // ---- Audit -------------------------------------------------------------------------------

  async function auditPage(root, _args, params, seq) {
    root.appendChild(h('div', { class: 'page-head' }, h('h1', null, 'Audit log'),
      h('span', { class: 'muted small' }, 'Every change to policies, pools and tokens, and budget alerts. Append-only, newest first.')));
    const target = h('input', { type: 'text', value: params.target || '', placeholder: 'e.g. policy:ml', 'data-test': 'audit-target-filter' });
    const go = h('button', { type: 'submit', class: 'secondary', 'data-test': 'audit-filter' }, 'Filter');
    root.appendChild(h('form', {
      class: 'filters',
      onsubmit: (ev) => { ev.preventDefault(); location.hash = '#/audit' + qs({ target: target.value.trim() }); },
    }, field('Target', target, 'audit-target'), h('div', { class: 'actions' }, go)));
    const AUDIT_COLUMNS = ['When', 'Actor', 'Action', 'Target', 'Change'];
    const body = h('tbody', { 'data-test': 'audit-body' });
    const more = h('button', { type: 'button', class: 'secondary', 'data-test': 'audit-more', hidden: true }, 'Older entries');
    const empty = h('p', { class: 'empty', hidden: true, 'data-test': 'audit-empty' }, 'No entries.');
    root.appendChild(h('div', { class: 'panel' },
      h('div', { class: 'table-wrap' }, h('table', { 'data-test': 'audit-table', class: 'stack' },
        h('thead', null, h('tr', null, AUDIT_COLUMNS.map((x) => h('th', null, x)))), body)),
      empty, h('div', { class: 'actions' }, more)));
    let cursor = null;
    const load = async () => {
      const data = await get('/api/v1/audit' + qs({ limit: 50, cursor, target: params.target }));
      if (!live(seq)) return;
      for (const e of data.entries) {
        const tr = body.appendChild(h('tr', { 'data-test': 'audit-row', 'data-action': e.action, 'data-target': e.target },
          h('td', { class: 'small', title: dt(e.at) }, dt(e.at)),
          h('td', { 'data-test': 'audit-actor' }, e.actor),
          h('td', { 'data-test': 'audit-action' }, e.action),
          h('td', { class: 'mono small', 'data-test': 'audit-target' }, e.target),
          h('td', { class: 'small' }, changeSummary(e.before, e.after))));
        labelCells(tr, AUDIT_COLUMNS);
      }
      empty.hidden = body.children.length > 0;
      cursor = data.next_cursor;
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
