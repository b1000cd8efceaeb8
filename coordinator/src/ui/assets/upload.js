// The upload page: validate the dropped ZIP or folder (nothing stored), list every problem with
// its file and JSON pointer, let the user choose the profile when the package leaves it open,
// then store and run it and follow the run live. A folder is sent as multipart parts `files`
// (file name = path in the folder), which the server zips.
(function () {
  "use strict";
  var input = document.getElementById("package-file");
  var folderInput = document.getElementById("package-folder");
  var zone = document.getElementById("dropzone");
  var statusLine = document.getElementById("validation-status");
  var list = document.getElementById("problems");
  var start = document.getElementById("start-run");
  var choice = document.getElementById("profile-choice");
  var profileSelect = document.getElementById("package-profile");
  // What was chosen: {zip: File} or {files: [{path, file}]}, and the name shown.
  var chosen = null;

  function clear(el) { while (el.firstChild) { el.removeChild(el.firstChild); } }
  // One problem: where, then its message as written (a regex error's lines and caret kept).
  function item(parent, file, pointer, message, severity) {
    var li = document.createElement("li");
    li.className = "problem " + (severity || "error");
    var where = document.createElement("code");
    where.textContent = (file || "(package)") + (pointer ? "#" + pointer : "");
    li.appendChild(where);
    li.appendChild(document.createTextNode(" " + (severity || "error") + ":"));
    var text = document.createElement("span");
    text.className = "message";
    text.textContent = message;
    li.appendChild(text);
    parent.appendChild(li);
  }
  function count(problems, severity) {
    return problems.filter(function (p) { return (p.severity || "error") === severity; }).length;
  }

  // The request body and headers for what was chosen.
  function body() {
    if (chosen.zip) { return { body: chosen.zip, headers: { "Content-Type": "application/zip" } }; }
    var form = new FormData();
    chosen.files.forEach(function (f) { form.append("files", f.file, f.path); });
    return { body: form, headers: {} };
  }
  function query() { return choice.hidden ? "" : "?profile=" + encodeURIComponent(profileSelect.value); }

  function validate() {
    start.disabled = true;
    clear(list);
    statusLine.textContent = "Validating " + chosen.name + "…";
    var b = body();
    fetch("/v1/skills/validate" + query(), {
      method: "POST", credentials: "same-origin", headers: b.headers, body: b.body
    }).then(function (r) {
      return r.json().then(function (body) { return { ok: r.ok, body: body }; });
    }).then(function (res) {
      if (!res.ok) {
        var e = res.body.error || {};
        statusLine.textContent = "Not accepted: " + (e.message || "error");
        return;
      }
      var v = res.body;
      var problems = v.problems || [];
      // Each problem is listed once, below; the status line only counts them.
      problems.forEach(function (p) { item(list, p.file, p.pointer, p.message, p.severity); });
      if (v.profile_open) { choice.hidden = false; }
      if (v.valid) {
        statusLine.textContent = "Valid: " + v.name + ", " + v.test_cases + " cases, profile " + v.profile +
          (problems.length ? " (" + problems.length + " warning(s) below)" : "");
        start.disabled = false;
      } else if (problems.length) {
        statusLine.textContent = count(problems, "error") + " problem(s) to fix" +
          (count(problems, "warning") ? " and " + count(problems, "warning") + " warning(s)" : "") +
          ", listed below; fix them and choose the package again.";
      } else {
        statusLine.textContent = "Not accepted: " + (v.message || "the package was refused");
      }
    }).catch(function () { statusLine.textContent = "Validation failed: the server did not answer."; });
  }
  function choose(c) { chosen = c; choice.hidden = true; validate(); }

  // The progress section of the page, followed by progress.js.
  function follow(runId) {
    document.getElementById("upload-progress").hidden = false;
    var link = document.getElementById("run-link");
    link.href = "/ui/runs/" + encodeURIComponent(runId);
    link.textContent = runId;
    window.skillevalFollowRun(runId, "");
  }

  start.addEventListener("click", function () {
    if (!chosen) { return; }
    start.disabled = true;
    statusLine.textContent = "Storing and starting the run…";
    var b = body();
    fetch("/v1/skills" + query(), {
      method: "POST", credentials: "same-origin", headers: b.headers, body: b.body
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

  // A dropped folder: every file under it, with its path.
  function readEntry(entry, prefix, out) {
    if (entry.isFile) {
      return new Promise(function (resolve, reject) {
        entry.file(function (f) { out.push({ path: prefix + entry.name, file: f }); resolve(); }, reject);
      });
    }
    var reader = entry.createReader();
    return new Promise(function (resolve, reject) {
      var all = [];
      (function more() {
        reader.readEntries(function (batch) {
          if (!batch.length) {
            Promise.all(all.map(function (e) { return readEntry(e, prefix + entry.name + "/", out); }))
              .then(resolve, reject);
            return;
          }
          all = all.concat(Array.prototype.slice.call(batch));
          more();
        }, reject);
      })();
    });
  }

  profileSelect.addEventListener("change", function () { if (chosen) { validate(); } });
  input.addEventListener("change", function () {
    if (input.files.length) { choose({ zip: input.files[0], name: input.files[0].name }); }
  });
  folderInput.addEventListener("change", function () {
    var files = Array.prototype.map.call(folderInput.files, function (f) {
      return { path: f.webkitRelativePath || f.name, file: f };
    });
    if (files.length) { choose({ files: files, name: "the folder (" + files.length + " files)" }); }
  });
  zone.addEventListener("dragover", function (e) { e.preventDefault(); zone.className = "dropzone over"; });
  zone.addEventListener("dragleave", function () { zone.className = "dropzone"; });
  zone.addEventListener("drop", function (e) {
    e.preventDefault();
    zone.className = "dropzone";
    var items = e.dataTransfer.items;
    var entry = items && items.length && items[0].webkitGetAsEntry ? items[0].webkitGetAsEntry() : null;
    if (entry && entry.isDirectory) {
      var out = [];
      readEntry(entry, "", out).then(function () {
        choose({ files: out, name: "the folder " + entry.name + " (" + out.length + " files)" });
      }, function () { statusLine.textContent = "The folder could not be read."; });
      return;
    }
    if (e.dataTransfer.files.length) { choose({ zip: e.dataTransfer.files[0], name: e.dataTransfer.files[0].name }); }
  });
})();
