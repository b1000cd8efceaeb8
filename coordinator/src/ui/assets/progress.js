// The run page's live progress: polls the run until it is finalised and shows its verdict,
// without reloading the page.
(function () {
  "use strict";
  var section = document.getElementById("progress");
  if (!section || section.getAttribute("data-finalised") === "true") { return; }
  var runId = section.getAttribute("data-run");
  function text(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = String(value); }
  }
  function poll() {
    fetch("/v1/runs/" + encodeURIComponent(runId), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (run) {
        text("run-status", run.status);
        text("run-completed", run.counters.completed);
        text("run-total", run.counters.total);
        var bar = document.getElementById("run-progress");
        bar.max = Math.max(run.counters.total, 1);
        bar.value = run.counters.completed;
        if (run.verdict) {
          var v = document.getElementById("live-verdict");
          v.textContent = "Verdict: " + run.verdict + " (reload for the results)";
          v.className = "verdict " + run.verdict;
          v.hidden = false;
        } else {
          setTimeout(poll, 1000);
        }
      })
      .catch(function () { setTimeout(poll, 3000); });
  }
  poll();
})();
