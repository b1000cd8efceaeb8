// Live progress of a run, without reloading the page: polls the run until it has a verdict and
// shows its status, counters and verdict in the elements `run-status`, `run-completed`,
// `run-total`, `run-progress` and `live-verdict`. The run page follows its run when it is not
// finalised; the upload page calls `skillevalFollowRun` for the run it started.
(function () {
  "use strict";
  function text(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = String(value); }
  }
  function follow(runId, verdictNote) {
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
            v.textContent = "Verdict: " + run.verdict + verdictNote;
            v.className = "verdict " + run.verdict;
            v.hidden = false;
          } else {
            setTimeout(poll, 1000);
          }
        })
        .catch(function () { setTimeout(poll, 3000); });
    }
    poll();
  }
  window.skillevalFollowRun = follow;
  var section = document.getElementById("progress");
  if (section && section.getAttribute("data-finalised") !== "true") {
    follow(section.getAttribute("data-run"), " (reload for the results)");
  }
})();
