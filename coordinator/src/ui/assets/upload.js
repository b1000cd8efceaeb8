// The upload page: validate the dropped ZIP (nothing stored), list every problem with its
// file and JSON pointer, then store and run it and follow the run live.
(function () {
  "use strict";
  var input = document.getElementById("package-file");
  var zone = document.getElementById("dropzone");
  var statusLine = document.getElementById("validation-status");
  var list = document.getElementById("problems");
  var start = document.getElementById("start-run");
  var chosen = null;

  function clear(el) { while (el.firstChild) { el.removeChild(el.firstChild); } }
  function item(parent, file, pointer, message, severity) {
    var li = document.createElement("li");
    li.className = "problem " + (severity || "error");
    var where = document.createElement("code");
    where.textContent = (file || "(package)") + (pointer ? "#" + pointer : "");
    li.appendChild(where);
    li.appendChild(document.createTextNode(" " + (severity || "error") + ": " + message));
    parent.appendChild(li);
  }

  function validate(file) {
    chosen = file;
    start.disabled = true;
    clear(list);
    statusLine.textContent = "Validating " + file.name + "…";
    fetch("/v1/skills/validate", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/zip" }, body: file
    }).then(function (r) {
      return r.json().then(function (body) { return { ok: r.ok, body: body }; });
    }).then(function (res) {
      if (!res.ok) {
        var e = res.body.error || {};
        statusLine.textContent = "Not accepted: " + (e.message || "error");
        return;
      }
      var v = res.body;
      (v.problems || []).forEach(function (p) { item(list, p.file, p.pointer, p.message, p.severity); });
      if (v.valid) {
        statusLine.textContent = "Valid: " + v.name + ", " + v.test_cases + " cases, profile " + v.profile +
          ((v.problems || []).length ? " (with warnings)" : "");
        start.disabled = false;
      } else {
        statusLine.textContent = (v.problems || []).length + " problem(s): " + v.message;
      }
    }).catch(function () { statusLine.textContent = "Validation failed: the server did not answer."; });
  }

  function follow(runId) {
    var section = document.getElementById("upload-progress");
    section.hidden = false;
    var link = document.getElementById("run-link");
    link.href = "/ui/runs/" + encodeURIComponent(runId);
    link.textContent = runId;
    function set(id, value) { document.getElementById(id).textContent = String(value); }
    function poll() {
      fetch("/v1/runs/" + encodeURIComponent(runId), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (run) {
          set("run-status", run.status);
          set("run-completed", run.counters.completed);
          set("run-total", run.counters.total);
          var bar = document.getElementById("run-progress");
          bar.max = Math.max(run.counters.total, 1);
          bar.value = run.counters.completed;
          if (run.verdict) {
            var v = document.getElementById("live-verdict");
            v.textContent = "Verdict: " + run.verdict;
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

  start.addEventListener("click", function () {
    if (!chosen) { return; }
    start.disabled = true;
    statusLine.textContent = "Storing and starting the run…";
    fetch("/v1/skills", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/zip" }, body: chosen
    }).then(function (r) {
      return r.json().then(function (body) { return { ok: r.ok, body: body }; });
    }).then(function (res) {
      if (!res.ok) {
        var e = res.body.error || {};
        statusLine.textContent = "Upload refused: " + (e.message || "error");
        return;
      }
      statusLine.textContent = "Stored " + res.body.name + " version " + res.body.version + ".";
      if (res.body.run_id) { follow(res.body.run_id); }
    }).catch(function () { statusLine.textContent = "Upload failed: the server did not answer."; });
  });

  input.addEventListener("change", function () { if (input.files.length) { validate(input.files[0]); } });
  zone.addEventListener("dragover", function (e) { e.preventDefault(); zone.className = "dropzone over"; });
  zone.addEventListener("dragleave", function () { zone.className = "dropzone"; });
  zone.addEventListener("drop", function (e) {
    e.preventDefault();
    zone.className = "dropzone";
    if (e.dataTransfer.files.length) { validate(e.dataTransfer.files[0]); }
  });
})();
