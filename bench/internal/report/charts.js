// Draws the report's charts as inline SVG from DATA (the report JSON).
// No library, no network. Sets document.body.dataset.charts to the number of
// charts drawn, and data-chart-error on failure, so a headless browser test
// can tell.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = { "202": "#2e9e5b", "409 sold_out": "#3f7fd6", "429": "#e0a31a", "5xx": "#d64545", "other": "#8a94a3" };
  var W = 1000, M = { l: 64, r: 150, t: 34, b: 40 };

  function el(parent, name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= v) return steps[i] * p;
    return 10 * p;
  }
  function fmt(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (v >= 10 || v === 0) return v.toFixed(0);
    if (v >= 1) return v.toFixed(1);
    return v.toPrecision(2);
  }

  // frame draws axes, grid, phase markers and returns scale functions.
  function frame(svg, H, title, xMax, yMax, yLabel, log) {
    var pw = W - M.l - M.r, ph = H - M.t - M.b;
    el(svg, "text", { x: M.l, y: 20, "class": "title" }, title);
    var yMin = log ? Math.max(0.01, Math.pow(10, Math.floor(Math.log10(log)))) : 0;
    var yTop = log ? Math.pow(10, Math.ceil(Math.log10(Math.max(yMax, yMin * 10)))) : niceMax(yMax);
    function sx(x) { return M.l + (xMax > 0 ? x / xMax : 0) * pw; }
    function sy(y) {
      if (log) {
        var v = Math.max(y, yMin);
        return M.t + ph - (Math.log10(v) - Math.log10(yMin)) / (Math.log10(yTop) - Math.log10(yMin)) * ph;
      }
      return M.t + ph - (y / yTop) * ph;
    }
    var ticks = [];
    if (log) { for (var t = yMin; t <= yTop * 1.0001; t *= 10) ticks.push(t); }
    else { for (var i = 0; i <= 5; i++) ticks.push(yTop * i / 5); }
    ticks.forEach(function (t) {
      el(svg, "line", { x1: M.l, x2: M.l + pw, y1: sy(t), y2: sy(t), "class": "grid" });
      el(svg, "text", { x: M.l - 6, y: sy(t) + 4, "text-anchor": "end" }, fmt(t));
    });
    var xstep = niceMax(xMax / 8);
    for (var x = 0; x <= xMax + 1e-9; x += xstep) {
      el(svg, "line", { x1: sx(x), x2: sx(x), y1: M.t + ph, y2: M.t + ph + 4, "class": "axis" });
      el(svg, "text", { x: sx(x), y: M.t + ph + 16, "text-anchor": "middle" }, fmt(x) + " s");
    }
    el(svg, "line", { x1: M.l, x2: M.l + pw, y1: M.t + ph, y2: M.t + ph, "class": "axis" });
    el(svg, "line", { x1: M.l, x2: M.l, y1: M.t, y2: M.t + ph, "class": "axis" });
    el(svg, "text", { x: 14, y: M.t + ph / 2, transform: "rotate(-90 14 " + (M.t + ph / 2) + ")", "text-anchor": "middle" }, yLabel);
    var tl = DATA.timeline;
    [["rush", tl.rush_start], ["tail", tl.tail_start]].forEach(function (p) {
      if (p[1] > 0 && p[1] < xMax) {
        el(svg, "line", { x1: sx(p[1]), x2: sx(p[1]), y1: M.t, y2: M.t + ph, "class": "phase" });
        el(svg, "text", { x: sx(p[1]) + 4, y: M.t + 10 }, p[0]);
      }
    });
    return { sx: sx, sy: sy, pw: pw, ph: ph };
  }
  function legend(svg, items) {
    items.forEach(function (it, i) {
      var y = M.t + 8 + i * 18;
      el(svg, "rect", { x: W - M.r + 16, y: y - 9, width: 12, height: 12, fill: it[1] });
      el(svg, "text", { x: W - M.r + 34, y: y + 1 }, it[0]);
    });
  }
  function xEnd(points) {
    var tl = DATA.timeline, last = points.length ? points[points.length - 1].t + tl.bucket_seconds : 0;
    return Math.max(tl.end || 0, last, tl.bucket_seconds);
  }

  function latencyChart() {
    var svg = document.getElementById("chart-latency"), H = 320;
    var pts = DATA.timeline.points.filter(function (p) { return p.answers > 0; });
    var maxY = 0, minY = Infinity;
    pts.forEach(function (p) { maxY = Math.max(maxY, p.max_ms); if (p.p50_ms > 0) minY = Math.min(minY, p.p50_ms); });
    if (!isFinite(minY)) minY = 0.1;
    var f = frame(svg, H, "Purchase latency over time (ms, log scale; from the intended send time)", xEnd(DATA.timeline.points), Math.max(maxY, 1), "ms", minY);
    var lines = [["max", "max_ms", "#d64545"], ["p99", "p99_ms", "#e0a31a"], ["p50", "p50_ms", "#2e6fd6"]];
    lines.forEach(function (l) {
      var d = pts.map(function (p) { return f.sx(p.t + DATA.timeline.bucket_seconds / 2).toFixed(1) + "," + f.sy(p[l[1]]).toFixed(1); }).join(" ");
      if (d) el(svg, "polyline", { points: d, fill: "none", stroke: l[2], "stroke-width": 1.8, "class": "series series-" + l[0] });
    });
    legend(svg, lines.map(function (l) { return [l[0], l[2]]; }));
  }

  function throughputChart() {
    var svg = document.getElementById("chart-throughput"), H = 320;
    var tl = DATA.timeline, pts = tl.points, classes = tl.classes;
    var maxY = 0;
    pts.forEach(function (p) { var s = 0; p.per_s.forEach(function (v) { s += v; }); maxY = Math.max(maxY, s); });
    var f = frame(svg, H, "Answers per second over time, by outcome (stacked)", xEnd(pts), maxY, "answers/s");
    var base = pts.map(function () { return 0; });
    classes.forEach(function (c, ci) {
      var top = pts.map(function (p, i) { return base[i] + p.per_s[ci]; });
      if (top.every(function (v, i) { return v === base[i]; })) return;
      var up = [], down = [];
      pts.forEach(function (p, i) {
        var x0 = f.sx(p.t), x1 = f.sx(p.t + tl.bucket_seconds);
        up.push(x0.toFixed(1) + "," + f.sy(top[i]).toFixed(1), x1.toFixed(1) + "," + f.sy(top[i]).toFixed(1));
        down.unshift(x1.toFixed(1) + "," + f.sy(base[i]).toFixed(1), x0.toFixed(1) + "," + f.sy(base[i]).toFixed(1));
      });
      el(svg, "polygon", { points: up.concat(down).join(" "), fill: COLORS[c] || "#999", "fill-opacity": 0.85, "class": "series series-area" }).appendChild(
        (function () { var t = document.createElementNS(NS, "title"); t.textContent = c; return t; })());
      base = top;
    });
    legend(svg, classes.map(function (c) { return [c, COLORS[c] || "#999"]; }));
  }

  function mixChart() {
    var svg = document.getElementById("chart-mix");
    var mix = DATA.answers.slice(0, 10), total = 0;
    DATA.answers.forEach(function (m) { total += m.count; });
    var H = Math.max(120, 50 + mix.length * 24);
    svg.setAttribute("viewBox", "0 0 1000 " + H);
    el(svg, "text", { x: M.l, y: 20, "class": "title" }, "Outcome mix (" + total + " purchases)");
    var maxC = 1;
    mix.forEach(function (m) { maxC = Math.max(maxC, m.count); });
    var x0 = 230, pw = W - x0 - 120;
    mix.forEach(function (m, i) {
      var y = 38 + i * 24, w = Math.max(1, m.count / maxC * pw);
      var cls = classOf(m.answer);
      el(svg, "text", { x: x0 - 8, y: y + 13, "text-anchor": "end" }, m.answer);
      el(svg, "rect", { x: x0, y: y, width: w.toFixed(1), height: 17, fill: COLORS[cls] || "#999", "class": "bar" });
      el(svg, "text", { x: x0 + w + 6, y: y + 13 }, m.count + " (" + (100 * m.count / Math.max(total, 1)).toFixed(1) + "%)");
    });
  }
  function classOf(answer) {
    var s = parseInt(answer, 10);
    if (s === 202) return "202";
    if (s === 409 && answer.indexOf("sold_out") >= 0) return "409 sold_out";
    if (s === 429) return "429";
    if (s >= 500) return "5xx";
    return "other";
  }

  var drawn = 0;
  [latencyChart, throughputChart, mixChart].forEach(function (fn) {
    try { fn(); drawn++; } catch (e) { document.body.setAttribute("data-chart-error", String(e)); }
  });
  document.body.setAttribute("data-charts", String(drawn));
})();
