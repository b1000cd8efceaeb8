// The test-case editor: builds a form from the version's eval definition, checks the rubric's
// weight sum and every JSON field as the user types (a JSON Schema is also compiled by the
// server), previews one case's grade with the edited definition, and downloads the package
// rebuilt around it. Fields the form does not show are kept as they were.
(function () {
  "use strict";
  var root = document.getElementById("editor");
  if (!root) { return; }
  var skill = root.getAttribute("data-skill");
  var version = root.getAttribute("data-version");
  var versionLabel = root.getAttribute("data-version-label");
  var strategies = (root.getAttribute("data-strategies") || "").split(",").filter(Boolean);
  var casesBox = document.getElementById("editor-cases");
  var statusLine = document.getElementById("editor-status");
  var original = null;
  var editors = [];

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function labelled(text, input) {
    var l = el("label", {}, text + " ");
    l.appendChild(input);
    return l;
  }
  function para(child) { var p = el("p"); p.appendChild(child); return p; }
  function clear(e) { while (e.firstChild) { e.removeChild(e.firstChild); } }
  function copy(v) { return v === undefined ? undefined : JSON.parse(JSON.stringify(v)); }
  function api(method, path, body) {
    return fetch(path, {
      method: method, credentials: "same-origin",
      headers: body === undefined ? {} : { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body)
    });
  }

  // A JSON text field checked as typed: its note says whether it parses.
  function jsonField(cls, value, rows) {
    var area = el("textarea", { "class": cls, rows: String(rows || 4), cols: "70" });
    area.value = value === undefined ? "" : JSON.stringify(value, null, 2);
    var note = el("span", { "class": "json-status muted" });
    function check() {
      if (!area.value.trim()) { note.textContent = ""; note.className = "json-status muted"; return; }
      try { JSON.parse(area.value); note.textContent = "valid JSON"; note.className = "json-status ok"; }
      catch (e) { note.textContent = "JSON syntax: " + e.message; note.className = "json-status error"; }
    }
    area.addEventListener("input", check);
    check();
    return { area: area, note: note, check: check };
  }

  function criterionRow(table, c, onChange) {
    var tr = el("tr", { "class": "criterion" });
    var name = el("input", { type: "text", "class": "criterion-name", size: "14" });
    name.value = c.name || "";
    var desc = el("input", { type: "text", "class": "criterion-description", size: "36" });
    desc.value = c.description || "";
    var weight = el("input", { type: "number", "class": "criterion-weight", step: "0.01", min: "0", max: "1" });
    weight.value = c.weight === undefined ? "" : String(c.weight);
    var scale = el("input", { type: "text", "class": "criterion-scale", size: "10" });
    scale.value = c.scale === undefined ? "" : (typeof c.scale === "string" ? c.scale : JSON.stringify(c.scale));
    var remove = el("button", { type: "button", "class": "remove-criterion" }, "remove");
    [name, desc, weight, scale].forEach(function (input) {
      var td = el("td"); td.appendChild(input); tr.appendChild(td);
      input.addEventListener("input", onChange);
    });
    var td = el("td"); td.appendChild(remove); tr.appendChild(td);
    remove.addEventListener("click", function () { table.removeChild(tr); onChange(); });
    tr._orig = c;
    table.appendChild(tr);
  }

  function caseEditor(c) {
    var box = el("fieldset", { "class": "case-editor" });
    var legend = el("legend", {}, c.id || "new case");
    box.appendChild(legend);
    var input = c.input || {}, expected = c.expected || {}, evaluation = c.evaluation || {};
    var id = el("input", { type: "text", "class": "case-id", required: "" });
    id.value = c.id || "";
    id.addEventListener("input", function () { legend.textContent = id.value || "new case"; refreshCaseList(); });
    var name = el("input", { type: "text", "class": "case-name", size: "40" });
    name.value = c.name || "";
    var row = el("p");
    row.appendChild(labelled("id", id)); row.appendChild(document.createTextNode(" "));
    row.appendChild(labelled("name", name));
    box.appendChild(row);
    var prompt = el("textarea", { "class": "case-prompt", rows: "3", cols: "70" });
    prompt.value = typeof input === "string" ? input : (input.prompt || "");
    box.appendChild(para(labelled("input prompt", prompt)));
    var out = el("textarea", { "class": "case-expected", rows: "2", cols: "70" });
    out.value = expected.output === undefined ? "" : String(expected.output);
    box.appendChild(para(labelled("expected output", out)));
    var patterns = el("textarea", { "class": "case-patterns", rows: "2", cols: "70" });
    patterns.value = (expected.patterns || []).join("\n");
    box.appendChild(para(labelled("expected patterns (one regex a line)", patterns)));

    var strategy = el("select", { "class": "case-strategy" });
    strategy.appendChild(el("option", { value: "" }, "(the profile's)"));
    strategies.forEach(function (s) { strategy.appendChild(el("option", { value: s }, s)); });
    if (evaluation.strategy && strategies.indexOf(evaluation.strategy) < 0) {
      strategy.appendChild(el("option", { value: evaluation.strategy }, evaluation.strategy));
    }
    strategy.value = evaluation.strategy || "";
    var threshold = el("input", { type: "number", "class": "case-threshold", step: "0.01", min: "0", max: "1" });
    threshold.value = evaluation.passingThreshold === undefined ? "" : String(evaluation.passingThreshold);
    row = el("p");
    row.appendChild(labelled("strategy", strategy)); row.appendChild(document.createTextNode(" "));
    row.appendChild(labelled("passing threshold", threshold));
    box.appendChild(row);
    var options = jsonField("case-options", evaluation.options, 3);
    row = para(labelled("strategy options (JSON object)", options.area)); row.appendChild(options.note);
    box.appendChild(row);

    // JSON Schema: syntax checked as typed, then compiled by the server.
    var schema = jsonField("case-schema", expected.jsonSchema, 5);
    var compiled = el("span", { "class": "schema-status muted" });
    var timer = null;
    schema.area.addEventListener("input", function () {
      clearTimeout(timer);
      compiled.textContent = "";
      var text = schema.area.value.trim();
      if (!text) { return; }
      var parsed;
      try { parsed = JSON.parse(text); } catch (e) { return; }
      timer = setTimeout(function () {
        api("POST", "/v1/schemas/check", { schema: parsed })
          .then(function (r) { return r.json(); })
          .then(function (b) {
            if (b.valid) { compiled.textContent = "compiles (draft " + b.draft + ")"; compiled.className = "schema-status ok"; }
            else if (b.errors) { compiled.textContent = b.errors.join("; "); compiled.className = "schema-status error"; }
            else { compiled.textContent = (b.error || {}).message || "not checked"; compiled.className = "schema-status error"; }
          });
      }, 300);
    });
    row = para(labelled("expected JSON Schema", schema.area)); row.appendChild(schema.note);
    row.appendChild(document.createTextNode(" ")); row.appendChild(compiled);
    box.appendChild(row);

    // Rubric with its weight sum, checked as typed.
    var rubric = expected.rubric || {};
    var rubricBox = el("div", { "class": "rubric" });
    rubricBox.appendChild(el("p", {}, "Rubric criteria (weights must sum to 1.0)"));
    var table = el("table", { "class": "rubric-criteria" });
    var head = el("tr");
    ["name", "description", "weight", "scale", ""].forEach(function (h) { head.appendChild(el("th", {}, h)); });
    table.appendChild(head);
    var sum = el("p", { "class": "rubric-sum muted", "aria-live": "polite" });
    function checkSum() {
      var rows = table.querySelectorAll("tr.criterion");
      if (!rows.length) { sum.textContent = "no rubric"; sum.className = "rubric-sum muted"; return; }
      var total = 0;
      rows.forEach(function (r) { total += parseFloat(r.querySelector(".criterion-weight").value) || 0; });
      if (Math.abs(total - 1) > 0.001) {
        sum.textContent = "Weights sum to " + total.toFixed(3) + ": they must sum to 1.0 (± 0.001).";
        sum.className = "rubric-sum warning";
      } else {
        sum.textContent = "Weights sum to " + total.toFixed(3) + ".";
        sum.className = "rubric-sum ok";
      }
    }
    (rubric.criteria || []).forEach(function (cr) { criterionRow(table, cr, checkSum); });
    rubricBox.appendChild(table);
    var addCriterion = el("button", { type: "button", "class": "add-criterion" }, "Add a criterion");
    addCriterion.addEventListener("click", function () {
      criterionRow(table, { name: "", description: "", weight: 0, scale: "likert5" }, checkSum);
      checkSum();
    });
    rubricBox.appendChild(addCriterion);
    var rubricThreshold = el("input", { type: "number", "class": "rubric-threshold", step: "0.01", min: "0", max: "1" });
    rubricThreshold.value = rubric.passingThreshold === undefined ? "" : String(rubric.passingThreshold);
    rubricBox.appendChild(para(labelled("rubric passing threshold", rubricThreshold)));
    rubricBox.appendChild(sum);
    box.appendChild(rubricBox);
    checkSum();

    var remove = el("button", { type: "button", "class": "remove-case" }, "Remove this case");
    box.appendChild(para(remove));
    var editor = { box: box, orig: c };
    remove.addEventListener("click", function () {
      casesBox.removeChild(box);
      editors.splice(editors.indexOf(editor), 1);
      refreshCaseList();
    });

    // The case as edited: the original with the form's fields written over it.
    editor.value = function (problems) {
      var out2 = copy(c) || {};
      out2.id = id.value.trim();
      if (name.value.trim()) { out2.name = name.value; } else { delete out2.name; }
      var inp = (typeof out2.input === "object" && out2.input) || {};
      inp.prompt = prompt.value;
      out2.input = inp;
      var exp = (typeof out2.expected === "object" && out2.expected) || {};
      if (out.value !== "") { exp.output = out.value; } else { delete exp.output; }
      var pats = patterns.value.split("\n").filter(function (l) { return l.trim() !== ""; });
      if (pats.length) { exp.patterns = pats; } else { delete exp.patterns; }
      function parsed(field, what) {
        var text = field.area.value.trim();
        if (!text) { return undefined; }
        try { return JSON.parse(text); } catch (e) { problems.push(out2.id + ": " + what + " is not JSON: " + e.message); return undefined; }
      }
      var sch = parsed(schema, "the JSON Schema");
      if (sch !== undefined) { exp.jsonSchema = sch; } else { delete exp.jsonSchema; }
      var rows = table.querySelectorAll("tr.criterion");
      if (rows.length) {
        var rb = copy(rubric) || {};
        rb.criteria = [];
        rows.forEach(function (r) {
          var cr = copy(r._orig) || {};
          cr.name = r.querySelector(".criterion-name").value;
          cr.description = r.querySelector(".criterion-description").value;
          cr.weight = parseFloat(r.querySelector(".criterion-weight").value) || 0;
          var sc = r.querySelector(".criterion-scale").value.trim();
          if (!sc) { delete cr.scale; }
          else if (sc.charAt(0) === "{") { try { cr.scale = JSON.parse(sc); } catch (e) { problems.push(out2.id + ": scale is not JSON"); } }
          else { cr.scale = sc; }
          rb.criteria.push(cr);
        });
        if (rubricThreshold.value !== "") { rb.passingThreshold = parseFloat(rubricThreshold.value); } else { delete rb.passingThreshold; }
        exp.rubric = rb;
      } else { delete exp.rubric; }
      out2.expected = exp;
      var ev = (typeof out2.evaluation === "object" && out2.evaluation) || {};
      if (strategy.value) { ev.strategy = strategy.value; } else { delete ev.strategy; }
      if (threshold.value !== "") { ev.passingThreshold = parseFloat(threshold.value); } else { delete ev.passingThreshold; }
      var opts = parsed(options, "the strategy options");
      if (opts !== undefined) { ev.options = opts; } else { delete ev.options; }
      out2.evaluation = ev;
      return out2;
    };
    editor.id = function () { return id.value.trim(); };
    editors.push(editor);
    casesBox.appendChild(box);
    return editor;
  }

  function refreshCaseList() {
    var select = document.getElementById("editor-preview-case");
    var current = select.value;
    clear(select);
    editors.forEach(function (e) { var id = e.id(); select.appendChild(el("option", { value: id }, id)); });
    if (current) { select.value = current; }
  }

  // The whole definition as edited; `problems` collects fields that do not parse.
  function edited(problems) {
    var d = copy(original);
    d.profile = document.getElementById("editor-profile").value;
    d.testCases = editors.map(function (e) { return e.value(problems); });
    if (d.version === undefined || String(d.version).charAt(0) !== "2") { d.version = "2.0"; }
    return d;
  }

  function showProblems(list, problems) {
    clear(list);
    problems.forEach(function (p) {
      var li = el("li", { "class": "problem " + (p.severity || "error") });
      var where = el("code", {}, typeof p === "string" ? "(form)" : (p.file || "(package)") + (p.pointer ? "#" + p.pointer : ""));
      li.appendChild(where);
      li.appendChild(document.createTextNode(" " + (typeof p === "string" ? p : (p.severity || "error") + ": " + p.message)));
      list.appendChild(li);
    });
  }

  document.getElementById("add-case").addEventListener("click", function () {
    caseEditor({ id: "case-" + (editors.length + 1), input: { prompt: "" }, expected: {} });
    refreshCaseList();
  });

  document.getElementById("editor-preview-submit").addEventListener("click", function () {
    var problems = [];
    var body = {
      version: versionLabel,
      test_case_id: document.getElementById("editor-preview-case").value,
      output: document.getElementById("editor-preview-output").value,
      definition: edited(problems)
    };
    var status = document.getElementById("editor-preview-status");
    var details = document.getElementById("editor-preview-details");
    document.getElementById("editor-preview-result").hidden = false;
    details.hidden = false;
    if (problems.length) { status.textContent = "not sent: " + problems.join("; "); status.className = "status errored"; return; }
    status.textContent = "grading…";
    api("POST", "/v1/skills/" + skill + "/preview", body)
      .then(function (r) { return r.json().then(function (b) { return { ok: r.ok, body: b }; }); })
      .then(function (res) {
        if (!res.ok) {
          var e = res.body.error || {};
          status.textContent = "refused: " + (e.message || "error");
          status.className = "status errored";
          details.textContent = JSON.stringify(e.details || {}, null, 2);
          return;
        }
        status.textContent = res.body.status;
        status.className = "status " + res.body.status;
        document.getElementById("editor-preview-score").textContent =
          res.body.score === null || res.body.score === undefined ? "—" : res.body.score.toFixed(3);
        details.textContent = JSON.stringify({
          details: res.body.details, rubric_scores: res.body.rubric_scores,
          schema_errors: res.body.schema_errors, feedback: res.body.feedback, error: res.body.error
        }, null, 2);
      })
      .catch(function () { status.textContent = "the server did not answer"; });
  });

  document.getElementById("download-package").addEventListener("click", function () {
    var problems = [];
    var definition = edited(problems);
    var line = document.getElementById("download-status");
    var list = document.getElementById("download-problems");
    if (problems.length) { line.textContent = "Fix these fields first."; showProblems(list, problems); return; }
    clear(list);
    line.textContent = "Validating…";
    api("POST", "/v1/skills/" + skill + "/versions/" + version + "/package", { definition: definition })
      .then(function (r) {
        if (r.ok) {
          return r.blob().then(function (blob) {
            var a = el("a", { href: URL.createObjectURL(blob), download: decodeURIComponent(skill) + "-" + versionLabel + "-edited.zip" });
            document.body.appendChild(a);
            a.click();
            document.body.removeChild(a);
            line.textContent = "Valid: downloaded (" + blob.size + " bytes).";
            line.className = "ok";
          });
        }
        return r.json().then(function (b) {
          var e = b.error || {};
          line.textContent = "Not valid: " + (e.message || "error");
          line.className = "error";
          showProblems(list, (e.details || {}).problems || []);
        });
      })
      .catch(function () { line.textContent = "The server did not answer."; });
  });

  api("GET", "/v1/skills/" + skill + "/versions/" + version + "/definition")
    .then(function (r) { return r.json().then(function (b) { return { ok: r.ok, body: b }; }); })
    .then(function (res) {
      if (!res.ok) { statusLine.textContent = "Could not load the definition: " + ((res.body.error || {}).message || "error"); return; }
      original = res.body.definition;
      if (res.body.converted) {
        var note = document.getElementById("editor-converted");
        note.textContent = "This version's " + res.body.eval_file + " is shown converted into eval/tests.json v2; the download has it in that form.";
        note.hidden = false;
      }
      document.getElementById("editor-profile").value = original.profile || "deterministic";
      (original.testCases || []).forEach(caseEditor);
      refreshCaseList();
      statusLine.textContent = (original.testCases || []).length + " case(s) from " + res.body.eval_file + ".";
      root.setAttribute("data-loaded", "true");
    })
    .catch(function () { statusLine.textContent = "Could not load the definition."; });
})();
