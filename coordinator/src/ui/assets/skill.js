// The skill page's production quality chart: pass rate per bucket from the monitor's quality
// report, with alert transitions marked. Hidden when the skill has no monitor.
(function () {
  "use strict";
  var section = document.getElementById("quality");
  if (!section) { return; }
  var skill = section.getAttribute("data-skill");
  var NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  Promise.all([
    fetch("/v1/skills/" + skill + "/quality?format=json", { credentials: "same-origin" }),
    fetch("/v1/skills/" + skill + "/alerts", { credentials: "same-origin" })
  ]).then(function (rs) {
    if (!rs[0].ok) { return null; }
    return Promise.all([rs[0].json(), rs[1].ok ? rs[1].json() : { alerts: [] }]);
  }).then(function (data) {
    if (!data) { return; }
    var report = data[0], alerts = data[1].alerts || [];
    var buckets = report.buckets || [];
    if (!buckets.length) { return; }
    var w = 520, h = 180, pad = 28;
    var t0 = Date.parse(report.from), t1 = Date.parse(report.to);
    function x(t) { return pad + (w - 2 * pad) * (t - t0) / Math.max(t1 - t0, 1); }
    function y(v) { return h - pad - (h - 2 * pad) * v; }
    var svg = el("svg", { viewBox: "0 0 " + w + " " + h, width: w, height: h, role: "img", "aria-label": "pass rate over time" });
    svg.appendChild(el("line", { "class": "axis", x1: pad, y1: y(0), x2: w - pad, y2: y(0) }));
    svg.appendChild(el("line", { "class": "axis", x1: pad, y1: y(1), x2: w - pad, y2: y(1) }));
    var d = "";
    buckets.forEach(function (b) {
      if (b.pass_rate === undefined || b.pass_rate === null) { return; }
      var px = x((Date.parse(b.start) + Date.parse(b.end)) / 2), py = y(b.pass_rate);
      d += (d ? " L" : "M") + px.toFixed(1) + "," + py.toFixed(1);
      var c = el("circle", { "class": "bar", cx: px.toFixed(1), cy: py.toFixed(1), r: 3 });
      c.appendChild(el("title", {}, b.start + ": " + (b.pass_rate * 100).toFixed(1) + " % of " + b.n));
      svg.appendChild(c);
    });
    if (d) { svg.appendChild(el("path", { "class": "line", d: d })); }
    alerts.forEach(function (a) {
      var t = Date.parse(a.at);
      if (t < t0 || t > t1) { return; }
      var m = el("rect", { "class": "alert", x: (x(t) - 2).toFixed(1), y: pad, width: 4, height: h - 2 * pad });
      m.appendChild(el("title", {}, a.rule + ": " + a.from_state + " → " + a.to_state + " at " + a.at));
      svg.appendChild(m);
    });
    document.getElementById("quality-chart").appendChild(svg);
    section.hidden = false;
  }).catch(function () { /* no monitor: the section stays hidden */ });
})();
