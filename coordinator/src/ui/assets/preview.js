// The preview page: grade a pasted output for one case (nothing stored) and show the result.
(function () {
  "use strict";
  var form = document.getElementById("preview-form");
  if (!form) { return; }
  form.addEventListener("submit", function (e) {
    e.preventDefault();
    var body = {
      version: form.getAttribute("data-version"),
      test_case_id: document.getElementById("preview-case").value,
      output: document.getElementById("preview-output").value
    };
    fetch("/v1/skills/" + form.getAttribute("data-skill") + "/preview", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify(body)
    }).then(function (r) {
      return r.json().then(function (b) { return { ok: r.ok, body: b }; });
    }).then(function (res) {
      var section = document.getElementById("preview-result");
      section.hidden = false;
      var status = document.getElementById("preview-status");
      if (!res.ok) {
        status.textContent = "refused: " + ((res.body.error || {}).message || "error");
        status.className = "status errored";
        return;
      }
      status.textContent = res.body.status;
      status.className = "status " + res.body.status;
      document.getElementById("preview-score").textContent =
        res.body.score === null || res.body.score === undefined ? "—" : res.body.score.toFixed(3);
      document.getElementById("preview-details").textContent = JSON.stringify({
        details: res.body.details, rubric_scores: res.body.rubric_scores,
        schema_errors: res.body.schema_errors, feedback: res.body.feedback, error: res.body.error
      }, null, 2);
    });
  });
})();
