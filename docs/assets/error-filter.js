// Filter box of the error catalogue index: hides table rows that match neither
// the code nor the title nor the message text. Plain progressive enhancement:
// without JavaScript the full tables stay visible.
(function () {
  function install() {
    var box = document.getElementById("kvc-error-filter");
    if (!box || box.dataset.installed) return;
    box.dataset.installed = "1";
    box.addEventListener("input", function () {
      var needle = box.value.trim().toLowerCase();
      document.querySelectorAll(".md-typeset table tbody tr").forEach(function (row) {
        var text = row.textContent.toLowerCase();
        row.style.display = !needle || text.indexOf(needle) !== -1 ? "" : "none";
      });
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(install);  // Material's instant navigation
  } else {
    document.addEventListener("DOMContentLoaded", install);
  }
})();
