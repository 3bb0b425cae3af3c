// mb web: draws the view /events pushes (see minibatch/web/state.py for its fields).
// Every text from the cluster goes in with textContent, never as markup: job names
// are whatever their submitters chose.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
// The chart's future side: at least this, more to reach the last predicted
// start, at most the cap (seconds).
const FUTURE_MIN = 600;
const FUTURE_MAX = 3600;
const LABEL_WIDTH = 96;
const AXIS_HEIGHT = 18;

let view = null;
// Server clock minus ours (ms): "now" keeps moving between pushes.
let offset = 0;

function now() {
  return (Date.now() + offset) / 1000;
}

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props || {});
  for (const child of children) {
    node.append(child);
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) {
    node.setAttribute(name, value);
  }
  return node;
}

// The same colour for a job wherever it is drawn, and across reloads.
function colour(id) {
  let hash = 0;
  for (const ch of String(id)) {
    hash = (Math.imul(hash, 31) + ch.codePointAt(0)) >>> 0;
  }
  const hue = Math.round((hash * 137.508) % 360);
  return `hsl(${hue}, 62%, ${58 + (hash % 3) * 6}%)`;
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  const m = Math.floor(s / 60);
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

function where(alloc) {
  return Object.entries(alloc || {})
    .map(([node, cpus]) => `${node}:${cpus.join(",")}`)
    .join(" ");
}

function swatch(id) {
  const mark = el("span", { className: "swatch" });
  mark.style.background = colour(id);
  return mark;
}

// ------------------------------------------------------------------ header

function renderHeader(t) {
  const params = Object.entries(view.params || {})
    .map(([k, v]) => ` ${k}=${v}`)
    .join("");
  document.getElementById("policy").textContent = view.policy
    ? `policy ${view.policy}${params}`
    : "";
  let busy = 0;
  let total = 0;
  for (const node of view.nodes) {
    if (node.state === "down" || node.state === "offline") continue;
    total += node.cells.length;
    busy += node.cells.filter(([, job]) => job !== null).length;
  }
  document.getElementById("usage").textContent = `${busy}/${total} CPUs busy`;
  const last = view.last_pass;
  document.getElementById("pass").textContent = last
    ? `last pass ${duration(t - last.time)} ago: ${last.started} started` +
      (last.backfilled ? ` (${last.backfilled} backfilled)` : "") +
      `, ${last.pending} pending, ${last.duration_ms.toFixed(1)} ms`
    : "no scheduling pass seen yet";
  document.getElementById("clock").textContent = clock(t);
  const problem = document.getElementById("problem");
  problem.textContent = view.problem;
  problem.hidden = !view.problem;
}

// ------------------------------------------------------------------- chart

function ticks(t0, t1, t) {
  const step = [60, 120, 300, 600, 900, 1800].find((s) => (t1 - t0) / s <= 10) || 3600;
  const out = [];
  for (let k = Math.ceil((t0 - t) / step); t + k * step <= t1; k++) {
    const minutes = Math.abs(k * step) / 60;
    const size = minutes % 60 === 0 ? `${minutes / 60}h` : `${minutes}m`;
    out.push({ at: t + k * step, label: k === 0 ? "now" : `${k > 0 ? "+" : "-"}${size}` });
  }
  return out;
}

function renderChart(t) {
  const chart = document.getElementById("gantt");
  const width = Math.max(chart.clientWidth, 400);
  const rows = view.rows;
  const rowHeight = Math.max(4, Math.min(18, Math.floor(480 / Math.max(rows.length, 1))));
  const height = AXIS_HEIGHT + rows.length * rowHeight + 4;
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  chart.setAttribute("height", height);

  let future = FUTURE_MIN;
  for (const bar of view.bars) {
    if (bar.kind === "planned") future = Math.max(future, bar.start - t + 120);
  }
  const t0 = t - view.history;
  const t1 = t + Math.min(future, FUTURE_MAX);
  const x = (time) =>
    LABEL_WIDTH + ((Math.min(Math.max(time, t0), t1) - t0) / (t1 - t0)) * (width - LABEL_WIDTH - 8);
  const y = (row) => AXIS_HEIGHT + row * rowHeight;

  const grid = document.getElementById("gantt-grid");
  grid.replaceChildren();
  rows.forEach(([node, cpu], i) => {
    grid.append(svg("line", { class: "rowline", x1: LABEL_WIDTH, x2: width, y1: y(i + 1), y2: y(i + 1) }));
    if (rowHeight >= 10) {
      const label = svg("text", { x: 4, y: y(i) + rowHeight - 4 });
      label.textContent = `${node} ${cpu}`;
      grid.append(label);
    }
  });
  for (const mark of ticks(t0, t1, t)) {
    grid.append(svg("line", { class: "tick", x1: x(mark.at), x2: x(mark.at), y1: AXIS_HEIGHT - 4, y2: height }));
    const label = svg("text", { x: x(mark.at) + 3, y: 12 });
    label.textContent = mark.label;
    grid.append(label);
  }

  const jobs = new Map();
  for (const job of [...view.ended, ...view.running, ...view.queue]) jobs.set(job.id, job);
  const layer = document.getElementById("gantt-bars");
  layer.replaceChildren();
  for (const bar of view.bars) {
    const end = bar.end ?? (bar.kind === "running" ? t : t1);
    if (end < t0 || bar.start > t1) continue;
    const job = jobs.get(bar.job);
    const left = x(bar.start);
    const right = Math.max(x(end), left + 2);
    const top = y(bar.row) + 1;
    const attrs = { x: left, y: top, width: right - left, height: Math.max(rowHeight - 2, 2) };
    const group = svg("g", { "data-job": bar.job, "data-kind": bar.kind });
    if (bar.kind === "running" && bar.limit !== null && bar.limit > t) {
      group.append(svg("rect", { ...attrs, class: "limit", x: right, width: x(bar.limit) - right, fill: colour(bar.job) }));
    }
    group.append(svg("rect", { ...attrs, class: `bar ${bar.kind}`, fill: colour(bar.job) }));
    if (bar.kind === "planned") group.append(svg("rect", { ...attrs, fill: "url(#hatch)" }));
    if (right - left > 26 && rowHeight >= 10) {
      const label = svg("text", { class: "label", x: left + 3, y: top + rowHeight - 5 });
      label.textContent = bar.job;
      group.append(label);
    }
    const title = svg("title", {});
    const what = { ended: "ended", running: "running", planned: "predicted start" }[bar.kind];
    title.textContent = `job ${bar.job}${job ? ` (${job.name}, ${job.user})` : ""}: ${what} ${clock(bar.start)}`;
    group.append(title);
    layer.append(group);
  }
  const line = document.getElementById("gantt-now");
  line.replaceChildren(svg("line", { class: "now", x1: x(t), x2: x(t), y1: AXIS_HEIGHT - 6, y2: height }));
}

// ------------------------------------------------------------------ panels

function renderNodes() {
  const box = document.getElementById("nodes");
  box.replaceChildren(
    ...view.nodes.map((node) => {
      const cells = node.cells.map(([cpu, job]) => {
        const cell = el("div", { className: "cell", title: job ? `CPU ${cpu}: job ${job}` : `CPU ${cpu}: idle` });
        cell.dataset.cpu = cpu;
        if (job !== null) {
          cell.dataset.job = job;
          cell.style.background = colour(job);
          cell.textContent = job;
        }
        return cell;
      });
      const card = el(
        "div",
        { className: `node ${node.state}`, title: node.comment },
        el("span", { className: "node-name", textContent: node.name }),
        el("span", { className: "node-state", textContent: node.state }),
        el("div", { className: "cells" }, ...cells),
      );
      card.dataset.node = node.name;
      return card;
    }),
  );
}

function row(job, cells) {
  const tr = el("tr", {}, ...cells.map((c) => (c instanceof Node ? c : el("td", { textContent: String(c) }))));
  tr.dataset.job = job.id;
  tr.dataset.state = job.state;
  return tr;
}

function renderRunning(t) {
  const body = document.querySelector("#running tbody");
  body.replaceChildren(
    ...view.running.map((job) =>
      row(job, [
        el("td", {}, swatch(job.id), job.id),
        job.name,
        job.user,
        job.ncpus,
        where(job.alloc),
        job.start_time ? duration(t - job.start_time) : "",
        job.walltime ? duration(job.walltime) : "none",
      ]),
    ),
  );
  document.getElementById("running-count").textContent = `(${view.running.length})`;
}

function renderQueue(t) {
  const body = document.querySelector("#queue tbody");
  const rows = view.queue.map((job) => {
    const start = job.predicted_start;
    const when = start === null ? "" : start <= t ? "now" : `in ${duration(start - t)} (${clock(start)})`;
    return row(job, [
      job.rank === null ? "" : job.rank + 1,
      el("td", {}, swatch(job.id), job.id),
      job.name,
      job.user,
      job.ncpus,
      job.state,
      when,
      el("td", { className: "reason", textContent: job.reason }),
    ]);
  });
  if (view.queued > view.queue.length) {
    rows.push(el("tr", {}, el("td", { className: "more", colSpan: 8, textContent: `and ${view.queued - view.queue.length} more` })));
  }
  body.replaceChildren(...rows);
  document.getElementById("queue-count").textContent = `(${view.queued})`;
}

function renderLog() {
  const list = document.getElementById("log");
  list.replaceChildren(
    ...view.log
      .slice()
      .reverse()
      .map((line) =>
        el(
          "li",
          {},
          el("span", { className: "time", textContent: clock(line.time) }),
          el("span", { className: "kind", textContent: line.kind }),
          line.text,
        ),
      ),
  );
}

// ----------------------------------------------------------------- what if

function renderPolicies() {
  const panel = document.getElementById("whatif");
  const select = document.getElementById("whatif-policy");
  panel.hidden = view.policies.length === 0;
  // Filled once: rebuilding it would lose the reader's choice at every push.
  if (select.options.length === 0) {
    select.append(...view.policies.map((name) => el("option", { value: name, textContent: name })));
  }
}

function change(delta) {
  if (Math.abs(delta) < 0.5) return "same";
  return `${delta > 0 ? "+" : "-"}${duration(Math.abs(delta))}`;
}

function showWhatIf(result) {
  const when = (start) => (start <= result.now ? "now" : `in ${duration(start - result.now)}`);
  document.getElementById("whatif-current").textContent = `Start (${result.current}, current)`;
  document.getElementById("whatif-other").textContent = `Start (${result.policy})`;
  const body = document.querySelector("#whatif-table tbody");
  body.replaceChildren(
    ...result.rows.map((r) =>
      row({ id: String(r.job), state: "waiting" }, [
        el("td", {}, swatch(String(r.job)), String(r.job)),
        r.user,
        r.cpus,
        when(r.current),
        when(r.other),
        change(r.delta),
      ]),
    ),
  );
  document.getElementById("whatif-table").hidden = result.rows.length === 0;
  const means = document.getElementById("whatif-means");
  means.textContent =
    result.mean_wait === null
      ? "no waiting job to simulate"
      : `mean wait: ${duration(result.current_mean_wait)} under ${result.current}, ` +
        `${duration(result.mean_wait)} under ${result.policy} ` +
        `(${change(result.mean_wait - result.current_mean_wait)})`;
  document.getElementById("whatif-skipped").replaceChildren(
    ...Object.entries(result.skipped).map(([job, why]) => el("li", { textContent: `job ${job} left out: ${why}` })),
  );
}

async function simulate() {
  const name = document.getElementById("whatif-policy").value;
  const status = document.getElementById("whatif-status");
  status.textContent = `simulating under ${name}...`;
  try {
    const reply = await fetch(`/whatif?policy=${encodeURIComponent(name)}`);
    if (!reply.ok) {
      status.textContent = (await reply.text()).trim();
      return;
    }
    showWhatIf(await reply.json());
    status.textContent = `simulated at ${clock(now())}`;
  } catch (error) {
    status.textContent = `mb web did not answer (${error.message})`;
  }
}

// What moves with time alone: the now line, elapsed times, predicted starts.
function tick() {
  if (view === null) return;
  const t = now();
  renderHeader(t);
  renderChart(t);
  renderRunning(t);
  renderQueue(t);
}

function render() {
  tick();
  renderNodes();
  renderPolicies();
  renderLog();
}

// ------------------------------------------------------------------ stream

function connect() {
  const link = document.getElementById("link");
  link.hidden = false;
  const events = new EventSource("/events");
  events.addEventListener("state", (message) => {
    view = JSON.parse(message.data);
    offset = view.now * 1000 - Date.now();
    link.hidden = true;
    render();
  });
  // EventSource reconnects by itself (the server asks for 2 s): say so meanwhile.
  events.addEventListener("error", () => {
    link.textContent = "lost the connection to mb web; reconnecting...";
    link.hidden = false;
  });
}

document.getElementById("whatif-run").addEventListener("click", simulate);
connect();
setInterval(tick, 1000);
window.addEventListener("resize", tick);
