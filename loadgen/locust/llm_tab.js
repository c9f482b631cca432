// loadgen's additions to Locust's web UI, loaded by the start page:
// - under the start form, the scenario the users will send (API, model, lengths);
// - on the LLM tab, live charts of the run from /llm/history (one point every 2 s): output
//   tokens/s, requests/s, TTFT p50/p99, TPOT p50, ITL p99 and users. Every y axis starts at 0;
//   each chart has a legend, time ticks, the values under the pointer, and says "stopped".
// Plain SVG, no library: the page stays usable offline.
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  const CHARTS = [
    {title: "Output tokens/s", unit: "tok/s", series: [["output_tok_s", "output tokens/s", "#1f77b4"]]},
    {title: "Requests/s (completed)", unit: "req/s", series: [["requests_s", "req/s", "#2ca02c"]]},
    {title: "TTFT", unit: "ms", series: [["ttft_p50_ms", "p50", "#1f77b4"], ["ttft_p99_ms", "p99", "#d62728"]]},
    {title: "TPOT p50", unit: "ms", series: [["tpot_p50_ms", "p50", "#9467bd"]]},
    {title: "ITL p99", unit: "ms", series: [["itl_p99_ms", "p99", "#d62728"]]},
    {title: "Users", unit: "users", series: [["users", "users", "#7f7f7f"]]},
  ];

  function el(name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function fmt(v) {
    if (v === null || v === undefined) return "-";
    return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2);
  }

  // time ticks: a round step giving at most 6 ticks, labelled in s, or m:ss past a minute
  function timeTicks(tMax) {
    const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
    const step = steps.find(s => tMax / s <= 6) || 7200;
    const out = [];
    for (let t = 0; t <= tMax + 1e-9; t += step) out.push(t);
    return out;
  }

  function timeText(t) {
    if (t < 60) return `${t.toFixed(0)} s`;
    const m = Math.floor(t / 60), sec = Math.round(t - 60 * m);
    return `${m}:${String(sec).padStart(2, "0")}`;
  }

  // one chart: time (s since the first point) against the series, y from 0; a legend, time
  // ticks, the values of the point under the pointer, and "stopped" once the test is
  function chart(spec, points, stopped) {
    const W = 380, H = 206, L = 48, R = 10, T = 42, B = 26;
    const svg = el("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "loadgen-chart"});
    const t0 = points.length ? points[0].t : 0;
    const tMax = Math.max(points.length ? points[points.length - 1].t - t0 : 0, 10);
    let vMax = 0;
    for (const [key] of spec.series) for (const p of points) if (p[key] !== null) vMax = Math.max(vMax, p[key]);
    const yMax = niceMax(vMax * 1.05);
    const x = t => L + (W - L - R) * (t - t0) / tMax;
    const y = v => H - B - (H - T - B) * v / yMax;
    const last = points.length ? points[points.length - 1] : {};
    const values = p => spec.series.length === 1 ? fmt(p[spec.series[0][0]])
      : spec.series.map(([key, name]) => `${name} ${fmt(p[key])}`).join(", ");
    svg.appendChild(el("text", {x: L, y: 14, "font-size": 13, "font-weight": 600}, `${spec.title}`));
    const status = !points.length ? "waiting for requests"
      : stopped ? `stopped; last: ${values(last)} ${spec.unit}` : `now: ${values(last)} ${spec.unit}`;
    svg.appendChild(el("text", {x: W - R, y: 14, "font-size": 11, "text-anchor": "end", fill: "#555",
                                class: "loadgen-status"}, status));
    // the legend: a swatch and a name per series
    let lx = L;
    for (const [, name, colour] of spec.series) {
      svg.appendChild(el("line", {x1: lx, x2: lx + 14, y1: 29, y2: 29, stroke: colour, "stroke-width": 2.5}));
      const label = el("text", {x: lx + 18, y: 33, "font-size": 11, class: "loadgen-legend"}, `${name} (${spec.unit})`);
      svg.appendChild(label);
      lx += 26 + 7 * (name.length + spec.unit.length + 3);
    }
    for (let i = 0; i <= 4; i++) {
      const v = yMax * i / 4;
      svg.appendChild(el("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#ddd"}));
      svg.appendChild(el("text", {x: L - 4, y: y(v) + 4, "font-size": 10, "text-anchor": "end"}, fmt(v)));
    }
    for (const t of timeTicks(tMax)) {
      svg.appendChild(el("line", {x1: x(t0 + t), x2: x(t0 + t), y1: H - B, y2: H - B + 4, stroke: "#999"}));
      svg.appendChild(el("text", {x: x(t0 + t), y: H - 8, "font-size": 10, "text-anchor": "middle",
                                  class: "loadgen-tick"}, timeText(t)));
    }
    for (const [key, , colour] of spec.series) {
      const pts = points.filter(p => p[key] !== null).map(p => `${x(p.t).toFixed(1)},${y(p[key]).toFixed(1)}`);
      if (pts.length) {
        svg.appendChild(el("polyline", {points: pts.join(" "), fill: "none", stroke: colour, "stroke-width": 1.8,
                                        class: "loadgen-series", "data-key": key}));
      }
    }
    // hover: the point nearest the pointer, its time and values
    const cursor = el("line", {y1: T, y2: H - B, stroke: "#888", "stroke-dasharray": "3 3", visibility: "hidden"});
    const tip = el("text", {x: L + 4, y: T + 10, "font-size": 11, fill: "#222", visibility: "hidden",
                            class: "loadgen-hover"});
    const area = el("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "transparent"});
    area.addEventListener("mousemove", ev => {
      if (!points.length) return;
      const box = svg.getBoundingClientRect();
      const sx = (ev.clientX - box.left) * W / box.width;  // the pointer in the chart's own units
      const t = t0 + (sx - L) / (W - L - R) * tMax;
      let best = points[0];
      for (const p of points) if (Math.abs(p.t - t) < Math.abs(best.t - t)) best = p;
      cursor.setAttribute("x1", x(best.t));
      cursor.setAttribute("x2", x(best.t));
      cursor.setAttribute("visibility", "visible");
      tip.textContent = `${timeText(best.t - t0)}: ${values(best)} ${spec.unit}`;
      tip.setAttribute("visibility", "visible");
    });
    area.addEventListener("mouseleave", () => {
      cursor.setAttribute("visibility", "hidden");
      tip.setAttribute("visibility", "hidden");
    });
    svg.append(cursor, tip, area);
    return svg;
  }

  function onLlmTab() {
    const selected = document.querySelector("[role=tab][aria-selected=true]");
    return selected !== null && selected.textContent.trim().toUpperCase() === "LLM";
  }

  async function drawCharts() {
    let box = document.getElementById("loadgen-llm-charts");
    if (!onLlmTab()) {
      if (box) box.remove();
      const quit = document.getElementById("loadgen-quit");
      if (quit) quit.remove();
      return;
    }
    if (!box) {
      const tables = document.querySelectorAll("table");
      if (!tables.length) return;
      const table = tables[tables.length - 1];
      const anchor = table.closest(".MuiTableContainer-root") || table.parentElement;
      box = document.createElement("div");
      box.id = "loadgen-llm-charts";
      box.style.cssText = "display:flex;flex-wrap:wrap;gap:12px;margin:16px 0;";
      anchor.insertAdjacentElement("afterend", box);
    }
    if (!document.getElementById("loadgen-quit")) {
      // the web UI's own way out: Locust stops and loadgen writes the run directory, as at the
      // end of a headless run (Ctrl-C labels the run interrupted)
      const quit = document.createElement("button");
      quit.id = "loadgen-quit";
      quit.type = "button";
      quit.textContent = "Quit Locust and write the run directory";
      quit.style.cssText = "margin:8px 0;padding:6px 12px;cursor:pointer;";
      quit.addEventListener("click", async () => {
        if (!window.confirm("Stop the test, write loadgen's run directory and quit Locust?")) return;
        await fetch("./llm/quit", { method: "POST" });
        quit.textContent = "Quitting: the run directory is being written";
        quit.disabled = true;
      });
      box.insertAdjacentElement("afterend", quit);
    }
    const data = await (await fetch("./llm/history")).json();
    const stopped = data.state === "stopped" || data.state === "ready";
    box.replaceChildren(...CHARTS.map(spec => chart(spec, data.points, stopped)));
    box.dataset.state = data.state;
    box.dataset.points = String(data.points.length);
    box.title = `each point: the last ${data.window_s} s of requests`;
  }

  async function describeScenario() {
    const form = document.querySelector("input[name=userCount]");
    if (!form || document.getElementById("loadgen-scenario")) return;
    const s = await (await fetch("./llm/scenario")).json();
    const box = document.createElement("div");
    box.id = "loadgen-scenario";
    box.style.cssText = "margin-top:16px;font-size:14px;line-height:1.6;";
    const rows = [
      ["Scenario", `${s.name} (${s.scenario})`], ["API", `${s.api} at ${s.host}`], ["Model", s.model],
      ["Input / output", `${s.input_tokens} / ${s.output_tokens} tokens, ${s.prompts} prompts`],
    ];
    if (s.steps && s.steps.length > 1) rows.push(["Shape steps", `${s.steps.join(", ")} users`]);
    if (s.arrivals) rows.push(["Arrivals", s.arrivals]);
    for (const [k, v] of rows) {
      const line = document.createElement("div");
      const key = document.createElement("strong");
      key.textContent = `${k}: `;
      line.append(key, document.createTextNode(v));
      box.appendChild(line);
    }
    const target = form.closest("form") || form.parentElement;
    target.insertAdjacentElement("afterend", box);
  }

  async function tick() {
    try {
      await describeScenario();
      await drawCharts();
    } catch (err) {
      // the server stopped or a page is changing: try again at the next tick
    }
  }
  setInterval(tick, 2000);
  document.addEventListener("click", () => setTimeout(tick, 100));
  tick();
})();
