// tollgate dashboard: polls this gateway's /stats and /stats/series and
// draws what they report. No library, no network but the gateway itself.
//
// Every drawn figure carries its raw value in a data attribute (data-v on a
// tile, data-values on a chart line, data-* on a table row), so a test can
// check the page shows exactly what /stats said.
'use strict';

(function () {
  const WINDOWS = ['1m', '5m', '1h'];
  const params = new URLSearchParams(location.search);
  let win = WINDOWS.includes(params.get('window')) ? params.get('window') : '5m';
  const refreshSeconds = Math.min(Math.max(Number(params.get('refresh')) || 5, 1), 3600);
  let timer = null;
  let generation = 0;

  const $ = (id) => document.getElementById(id);
  const SVG = 'http://www.w3.org/2000/svg';

  function el(tag, attrs, ...children) {
    const e = tag.startsWith('svg:') ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c !== undefined && c !== null) e.append(c);
    }
    return e;
  }

  // A fetch that hangs is abandoned after this long, so the status line
  // says so instead of keeping an old "updated" time.
  const fetchTimeoutMs = Math.max(refreshSeconds, 10) * 1000;

  // Paths are relative: /dashboard fetches /stats, and a gateway mounted
  // under a prefix keeps working.
  async function getJSON(path) {
    const name = path.split('?')[0];
    const ctl = new AbortController();
    const t = setTimeout(() => ctl.abort(), fetchTimeoutMs);
    try {
      const r = await fetch(path, { cache: 'no-store', signal: ctl.signal });
      if (!r.ok) {
        const body = (await r.text()).trim();
        throw new Error(name + ': HTTP ' + r.status + (body ? ' (' + body + ')' : ''));
      }
      return await r.json();
    } catch (e) {
      if (e.name === 'AbortError') throw new Error(name + ': no answer in ' + fetchTimeoutMs / 1000 + ' s');
      throw e;
    } finally {
      clearTimeout(t);
    }
  }

  function fmtMs(v) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    if (v >= 10000) return (v / 1000).toFixed(1) + ' s';
    if (v >= 1000) return (v / 1000).toFixed(2) + ' s';
    if (v >= 100) return v.toFixed(0) + ' ms';
    if (v >= 10) return v.toFixed(1) + ' ms';
    return v.toFixed(2) + ' ms';
  }
  function fmtNum(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    return v.toLocaleString('en-US', { maximumFractionDigits: digits === undefined ? 1 : digits });
  }
  function fmtUSD(v) {
    if (!isFinite(v)) return '–';
    return '$' + v.toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: v < 1 ? 4 : 2 });
  }
  function fmtPct(v) {
    return v === null || v === undefined || !isFinite(v) ? '–' : (v * 100).toFixed(1) + '%';
  }
  // fmtSeconds writes a duration in seconds: as fmtMs under a minute, in
  // minutes under an hour, else in hours.
  function fmtSeconds(v) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    if (v < 60) return fmtMs(v * 1000);
    if (v < 3600) return (v / 60).toFixed(2) + ' min';
    return (v / 3600).toFixed(2) + ' h';
  }
  function fmtTime(iso) {
    const d = new Date(iso);
    return isNaN(d) ? '' : d.toLocaleTimeString('en-GB', { hour12: false });
  }

  function firstGroup(report) {
    const w = report.windows && report.windows[0];
    return w && w.groups.length ? w.groups[0] : null;
  }
  // rejectedOf is the requests the gateway refused itself (population
  // "refused": a key missing or unknown, a limit, a bad body), which no
  // latency or goodput figure counts.
  function rejectedOf(g) { return g && g.populations ? (g.populations.refused || 0) : 0; }

  // topReason is the most frequent refusal reason, "" for none.
  function topReason(g) {
    const m = (g && g.rejections) || {};
    return Object.keys(m).sort((a, b) => m[b] - m[a] || a.localeCompare(b))[0] || '';
  }

  // Tiles: the window's figures for the whole gateway. A quantile of a
  // figure with no sample is shown as "–" and its data-v is empty.
  function renderTiles(g, seconds) {
    const tiles = [];
    const tile = (id, label, value, text) => tiles.push(
      el('div', { class: 'tile', id: 't-' + id, 'data-v': value === null ? '' : value },
        el('div', { class: 'k' }, label), el('div', { class: 'v' }, text)));
    const q = (name, f) => {
      const has = g && g[f].count > 0;
      for (const p of ['p50', 'p95', 'p99']) {
        const v = has ? g[f][p + '_ms'] : null;
        tile(f + '-' + p, name + ' ' + p.toUpperCase(), v, fmtMs(v));
      }
    };
    tile('requests', 'Requests (' + fmtNum(seconds, 0) + ' s)', g ? g.requests : 0, fmtNum(g ? g.requests : 0, 0));
    const gp = g && g.goodput.total > 0 ? g.goodput.ratio : null;
    tile('goodput', 'Goodput', gp, fmtPct(gp) + (g && g.goodput.total ? ' of ' + g.goodput.total : ''));
    tile('tokens-per-second', 'Output tokens/s', g ? g.output_tokens_per_second : 0, fmtNum(g ? g.output_tokens_per_second : 0));
    tile('cost', 'Spend', g ? g.cost_usd : 0, fmtUSD(g ? g.cost_usd : 0));
    const top = topReason(g);
    tile('rejected', 'Refused', rejectedOf(g), fmtNum(rejectedOf(g), 0) + (top ? ' · ' + top : ''));
    q('TTFT', 'ttft');
    q('TPOT', 'tpot');
    q('ITL', 'itl');
    q('E2E', 'e2e');
    const oh = g && g.overhead.count > 0;
    tile('overhead-p50', 'Overhead P50', oh ? g.overhead.p50_ms : null, fmtMs(oh ? g.overhead.p50_ms : null));
    tile('overhead-p99', 'Overhead P99', oh ? g.overhead.p99_ms : null, fmtMs(oh ? g.overhead.p99_ms : null));
    $('tiles').replaceChildren(...tiles);
  }

  // niceMax rounds v up to 1, 2 or 5 times a power of ten.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) {
      if (v <= m * p) return m * p;
    }
    return 10 * p;
  }

  // lineChart draws lines over the points of a series. lines is
  // [{name, color, values}], a value null where the slice had no sample
  // (the line breaks there).
  // The x axis spans the whole window (span.from to span.to, the starts of
  // its first and last slices), so a gateway that started a minute ago
  // fills the right end of a 5 min chart, not all of it.
  function lineChart(id, title, points, span, lines, fmt) {
    const W = 520, H = 170, L = 52, R = 8, T = 8, B = 20;
    const n = points.length;
    let max = 0;
    for (const ln of lines) for (const v of ln.values) if (v !== null && v > max) max = v;
    const top = niceMax(max);
    const width = Math.max(span.to - span.from, 1);
    const x = (i) => L + (W - L - R) * (Date.parse(points[i].start) - span.from) / width;
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const svg = el('svg:svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title, 'data-max': top,
      'data-seconds': points.map((p) => p.seconds).join(',') });
    for (const f of [0, 0.5, 1]) {
      const yy = y(top * f);
      svg.append(el('svg:line', { class: 'axis', x1: L, x2: W - R, y1: yy, y2: yy }));
      svg.append(el('svg:text', { x: L - 4, y: yy + 3, 'text-anchor': 'end' }, fmt(top * f)));
    }
    if (n > 0) {
      svg.append(el('svg:text', { x: L, y: H - 4 }, fmtTime(span.from)));
      svg.append(el('svg:text', { x: W - R, y: H - 4, 'text-anchor': 'end' }, fmtTime(span.to)));
    }
    for (const ln of lines) {
      const g = el('svg:g', { class: 'series', 'data-name': ln.name,
        'data-values': ln.values.map((v) => (v === null ? '' : String(v))).join(',') });
      let run = [];
      const flush = () => {
        if (run.length === 1) {
          const [px, py] = run[0];
          g.append(el('svg:circle', { cx: px, cy: py, r: 2, style: 'fill:' + ln.color }));
        } else if (run.length > 1) {
          g.append(el('svg:polyline', { style: 'stroke:' + ln.color, points: run.map((p) => p.join(',')).join(' ') }));
        }
        run = [];
      };
      ln.values.forEach((v, i) => {
        if (v === null) { flush(); return; }
        run.push([+x(i).toFixed(2), +y(v).toFixed(2)]);
      });
      flush();
      svg.append(g);
    }
    const legend = el('div', { class: 'legend' },
      ...lines.map((ln) => el('span', {}, el('i', { style: 'background:' + ln.color }), ln.name)));
    return el('div', { class: 'chart', id: 'c-' + id }, el('h2', {}, title), legend, svg);
  }

  const quantileLines = (pts, f) => [['p50', 'var(--p50)'], ['p95', 'var(--p95)'], ['p99', 'var(--p99)']].map(
    ([p, color]) => ({ name: p, color, values: pts.map((pt) => (pt[f].count > 0 ? pt[f][p + '_ms'] : null)) }));

  const SLICES = { '1m': 6, '5m': 30, '1h': 60 };

  function renderCharts(series) {
    const s = series.series.length ? series.series[0] : null;
    const pts = s ? s.points : [];
    // perSecond is a slice's count per second of the time it spans. The
    // current slice is charted as a rate only once half of it has passed:
    // a second into it, one request would be a spike that flattens the
    // rest of the chart.
    const settled = (p) => p.seconds >= series.slice_seconds / 2;
    const perSecond = (n, p) => (settled(p) ? n / p.seconds : null);
    const slice = series.slice_seconds * 1000;
    const to = pts.length ? Date.parse(pts[pts.length - 1].start) : Date.parse(series.generated);
    const span = { from: to - ((SLICES[series.window] || pts.length) - 1) * slice, to };
    const charts = [
      lineChart('ttft', 'TTFT (ms)', pts, span, quantileLines(pts, 'ttft'), fmtMs),
      lineChart('tpot', 'TPOT (ms)', pts, span, quantileLines(pts, 'tpot'), fmtMs),
      lineChart('itl', 'Inter-token latency (ms)', pts, span, quantileLines(pts, 'itl'), fmtMs),
      lineChart('e2e', 'End-to-end latency (ms)', pts, span, quantileLines(pts, 'e2e'), fmtMs),
      lineChart('tokens', 'Output tokens/s', pts, span,
        [{ name: 'tokens/s', color: 'var(--p50)', values: pts.map((p) => (settled(p) ? p.output_tokens_per_second : null)) }], (v) => fmtNum(v)),
      lineChart('goodput', 'Goodput (share of requests meeting every SLO)', pts, span,
        [{ name: 'goodput', color: 'var(--ok)', values: pts.map((p) => (p.goodput.total > 0 ? p.goodput.ratio : null)) }], fmtPct),
      lineChart('requests', 'Requests and rejections per second', pts, span, [
        { name: 'requests/s', color: 'var(--p50)', values: pts.map((p) => perSecond(p.requests, p)) },
        { name: 'rejected/s', color: 'var(--bad)', values: pts.map((p) => perSecond(rejectedOf(p), p)) }], (v) => fmtNum(v, 2)),
      lineChart('spend', 'Spend per minute (USD)', pts, span,
        [{ name: 'USD/min', color: 'var(--p95)', values: pts.map((p) => (settled(p) ? p.cost_usd / p.seconds * 60 : null)) }], fmtUSD),
    ];
    $('charts').replaceChildren(...charts);
  }

  function reasons(m) {
    return Object.keys(m || {}).sort().map((k) => k + ':' + m[k]).join(' ');
  }

  // renderTeams lists the teams by spend, with their requests, tokens and
  // rejections by reason. The team-less ITL group (team "") is not a team.
  function renderTeams(report) {
    const w = report.windows[0];
    const rows = w.groups.filter((g) => g.team !== '').sort((a, b) => b.cost_usd - a.cost_usd || a.team.localeCompare(b.team));
    if (!rows.length) {
      $('teams').replaceChildren(el('p', { class: 'empty' }, 'No requests in this window.'));
      return;
    }
    const top = Math.max(...rows.map((g) => g.cost_usd));
    const table = el('table', { id: 'team-table' },
      el('tr', {}, ...['Team', 'Spend', '', 'Requests', 'Tokens in/out', 'Rejected', 'Why'].map((h) => el('th', {}, h))));
    for (const g of rows) {
      const rej = rejectedOf(g);
      table.append(el('tr', { 'data-team': g.team, 'data-cost': g.cost_usd, 'data-requests': g.requests,
        'data-rejected': rej, 'data-reasons': reasons(g.rejections) },
      el('td', {}, g.team),
      el('td', {}, fmtUSD(g.cost_usd)),
      el('td', { class: 'bar' }, el('div', { style: `width:${top > 0 ? (100 * g.cost_usd / top).toFixed(1) : 0}%` })),
      el('td', {}, fmtNum(g.requests, 0)),
      el('td', {}, fmtNum(g.input_tokens, 0) + ' / ' + fmtNum(g.output_tokens, 0)),
      el('td', {}, fmtNum(rej, 0)),
      el('td', {}, reasons(g.rejections) || '–')));
    }
    $('teams').replaceChildren(table);
  }

  function renderModels(report) {
    const rows = report.windows[0].groups;
    if (!rows.length) {
      $('models').replaceChildren(el('p', { class: 'empty' }, 'No requests in this window.'));
      return;
    }
    const table = el('table', { id: 'model-table' },
      el('tr', {}, ...['Route / model', 'Requests', 'TTFT P50', 'TTFT P99', 'TPOT P50', 'E2E P99', 'Goodput'].map((h) => el('th', {}, h))));
    for (const g of rows) {
      const q = (f, p) => (g[f].count > 0 ? g[f][p + '_ms'] : null);
      table.append(el('tr', { 'data-route': g.route, 'data-model': g.model, 'data-requests': g.requests,
        'data-ttft-p50': q('ttft', 'p50') === null ? '' : q('ttft', 'p50') },
      el('td', {}, g.route + ' / ' + g.model),
      el('td', {}, fmtNum(g.requests, 0)),
      el('td', {}, fmtMs(q('ttft', 'p50'))),
      el('td', {}, fmtMs(q('ttft', 'p99'))),
      el('td', {}, fmtMs(q('tpot', 'p50'))),
      el('td', {}, fmtMs(q('e2e', 'p99'))),
      el('td', {}, g.goodput.total > 0 ? fmtPct(g.goodput.ratio) : '–')));
    }
    $('models').replaceChildren(table);
  }

  // renderConversations lists each team's conversations of the last hour:
  // ended, evicted, error share, turns and cost per conversation (mean and
  // percentiles), completion rate, mean score and cost per completed task.
  // A figure without a sample (no idle conversation, no outcome, no score,
  // nothing completed) is "–" and its data attribute empty.
  function renderConversations(report) {
    const rows = (report.conversations || []).filter((c) => c.last_hour.ended > 0 || c.last_hour.outcomes.posted > 0);
    if (!rows.length) {
      $('conversations').replaceChildren(el('p', { class: 'empty' }, 'No conversation ended in the last hour.'));
      return;
    }
    const table = el('table', { id: 'conversation-table' },
      el('tr', {}, ...['Team', 'Ended', 'Evicted', 'Errored', 'Turns mean', 'P50', 'P95', 'P99',
        'Cost mean', 'P50', 'P95', 'P99', 'Completed', 'Mean score', 'Cost per completed'].map((h) => el('th', {}, h))));
    for (const c of rows) {
      const f = c.last_hour;
      const o = f.outcomes;
      const idle = f.ended - f.evicted > 0;
      const has = f.sampled > 0;
      const v = (ok, x) => (ok ? x : null);
      const cells = {
        'ended': f.ended, 'evicted': f.evicted, 'error-share': v(f.ended > 0, f.error_share),
        'turns-mean': v(idle, f.turns.mean), 'turns-p50': v(has, f.turns.p50), 'turns-p95': v(has, f.turns.p95), 'turns-p99': v(has, f.turns.p99),
        'cost-mean': v(idle, f.cost_usd.mean), 'cost-p50': v(has, f.cost_usd.p50), 'cost-p95': v(has, f.cost_usd.p95), 'cost-p99': v(has, f.cost_usd.p99),
        'completion-rate': v(o.posted > 0, o.completion_rate), 'mean-score': v(o.scored > 0, o.mean_score),
        'cost-per-completed': v(o.completed > 0, o.cost_per_completed_usd),
      };
      const attrs = { 'data-conversation-team': c.team };
      for (const [k, x] of Object.entries(cells)) attrs['data-' + k] = x === null ? '' : x;
      const usd = (x) => (x === null ? '–' : fmtUSD(x));
      table.append(el('tr', attrs,
        el('td', {}, c.team),
        el('td', {}, fmtNum(f.ended, 0)),
        el('td', {}, fmtNum(f.evicted, 0)),
        el('td', {}, fmtPct(cells['error-share'])),
        ...['turns-mean', 'turns-p50', 'turns-p95', 'turns-p99'].map((k) => el('td', {}, fmtNum(cells[k]))),
        ...['cost-mean', 'cost-p50', 'cost-p95', 'cost-p99'].map((k) => el('td', {}, usd(cells[k]))),
        el('td', {}, fmtPct(cells['completion-rate']) + (o.posted > 0 ? ' of ' + o.posted : '')),
        el('td', {}, fmtNum(cells['mean-score'], 2)),
        el('td', {}, usd(cells['cost-per-completed']))));
    }
    $('conversations').replaceChildren(table);
  }

  // The session figures shown, by /stats field: their data attribute
  // prefix, column title and format.
  const SESSION_FIGURES = [
    ['cost_usd', 'cost', 'Cost', fmtUSD],
    ['calls', 'calls', 'Calls', (v) => fmtNum(v)],
    ['user_turns', 'user-turns', 'User turns', (v) => fmtNum(v)],
    ['duration_seconds', 'duration', 'Duration', fmtSeconds],
    ['model_share', 'model-share', 'Model share', fmtPct],
    ['tool_share', 'tool-share', 'Tool share', fmtPct],
    ['compactions', 'compactions', 'Compactions', (v) => fmtNum(v)],
    ['subagent_cost_share', 'subagent-share', 'Subagent cost', fmtPct],
  ];

  // renderSessions lists each team's coding agents' sessions of the last
  // hour: ended, evicted, and the P50 / P95 of each figure per session
  // ("–" and an empty data attribute without a sample); then the costliest
  // sessions of every team, costliest first, with the key that ran them.
  function renderSessions(report) {
    const rows = (report.sessions || []).filter((s) => s.last_hour.ended > 0);
    if (!rows.length) {
      $('sessions').replaceChildren(el('p', { class: 'empty' }, 'No agent session ended in the last hour.'));
      $('costliest').replaceChildren();
      return;
    }
    const table = el('table', { id: 'session-table' },
      el('tr', {}, ...['Team', 'Ended', 'Evicted', ...SESSION_FIGURES.map((f) => f[2] + ' P50 / P95')].map((h) => el('th', {}, h))));
    for (const s of rows) {
      const f = s.last_hour;
      const has = f.sampled > 0;
      const attrs = { 'data-session-team': s.team, 'data-ended': f.ended, 'data-evicted': f.evicted };
      const cells = [];
      for (const [field, name, , fmt] of SESSION_FIGURES) {
        const p50 = has ? f[field].p50 : null, p95 = has ? f[field].p95 : null;
        attrs['data-' + name + '-p50'] = p50 === null ? '' : p50;
        attrs['data-' + name + '-p95'] = p95 === null ? '' : p95;
        cells.push(el('td', {}, (has ? fmt(p50) : '–') + ' / ' + (has ? fmt(p95) : '–')));
      }
      table.append(el('tr', attrs, el('td', {}, s.team), el('td', {}, fmtNum(f.ended, 0)), el('td', {}, fmtNum(f.evicted, 0)), ...cells));
    }
    const costly = rows.flatMap((s) => s.last_hour.costliest || [])
      .sort((a, b) => b.cost_usd - a.cost_usd || a.team.localeCompare(b.team) || a.key.localeCompare(b.key));
    const top = el('table', { id: 'costliest-table' },
      el('tr', {}, ...['Team', 'Key', 'Session', 'Cost', 'Duration', 'Calls', 'User turns'].map((h) => el('th', {}, h))));
    for (const c of costly) {
      top.append(el('tr', { 'data-costly-key': c.key, 'data-costly-team': c.team, 'data-key-id': c.key_id, 'data-cost': c.cost_usd,
        'data-duration': c.duration_seconds, 'data-calls': c.calls, 'data-user-turns': c.user_turns },
      el('td', {}, c.team),
      el('td', {}, c.key_id || '–'),
      el('td', { title: c.key }, c.key.slice(0, 12)),
      el('td', {}, fmtUSD(c.cost_usd)),
      el('td', {}, fmtSeconds(c.duration_seconds)),
      el('td', {}, fmtNum(c.calls, 0)),
      el('td', {}, fmtNum(c.user_turns, 0))));
    }
    $('sessions').replaceChildren(table);
    $('costliest').replaceChildren(top);
  }

  function setStatus(kind, text) {
    const s = $('status');
    s.className = 'status' + (kind === 'error' ? ' error' : '');
    s.textContent = text;
  }

  // tick fetches one after another (the gateway serves few /stats requests
  // at once) and draws only when all four answered for the current window.
  async function tick() {
    const gen = ++generation;
    const w = win;
    try {
      const all = await getJSON(`stats?window=${w}&merge=route,model,team`);
      const series = await getJSON(`stats/series?window=${w}&merge=route,model,team`);
      const teams = await getJSON(`stats?window=${w}&merge=route,model`);
      const models = await getJSON(`stats?window=${w}&merge=team`);
      if (gen !== generation) return;
      $('sketch').textContent = all.sketch.kind + ', ±' + (all.sketch.relative_error * 100) + '%';
      renderTiles(firstGroup(all), all.windows[0].seconds);
      renderCharts(series);
      renderTeams(teams);
      renderModels(models);
      renderConversations(teams);
      renderSessions(teams);
      document.body.setAttribute('data-generated', all.generated);
      document.body.setAttribute('data-window', w);
      document.body.setAttribute('data-seconds', all.windows[0].seconds);
      setStatus('ok', 'updated ' + fmtTime(all.generated));
    } catch (e) {
      if (gen === generation) setStatus('error', 'refresh failed: ' + e.message);
    } finally {
      if (gen === generation) {
        clearTimeout(timer);
        timer = setTimeout(tick, refreshSeconds * 1000);
      }
    }
  }

  function choose(w) {
    win = w;
    for (const b of document.querySelectorAll('#windows button')) {
      b.setAttribute('aria-pressed', String(b.dataset.window === w));
    }
    const u = new URL(location.href);
    u.searchParams.set('window', w);
    history.replaceState(null, '', u);
    clearTimeout(timer);
    tick();
  }

  $('refresh').textContent = String(refreshSeconds);
  for (const b of document.querySelectorAll('#windows button')) {
    b.addEventListener('click', () => choose(b.dataset.window));
  }
  choose(win);
})();
