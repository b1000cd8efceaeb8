// The report file's table filter: by status and by text, without a server.
(function () {
  "use strict";
  var status = document.getElementById("filter-status");
  var text = document.getElementById("filter-text");
  function apply() {
    var s = status.value;
    var t = text.value.toLowerCase();
    var rows = document.querySelectorAll("#cases tbody tr");
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i];
      var ok = (!s || r.getAttribute("data-status") === s) &&
        (!t || r.textContent.toLowerCase().indexOf(t) !== -1);
      r.hidden = !ok;
    }
  }
  status.addEventListener("change", apply);
  text.addEventListener("input", apply);
})();
