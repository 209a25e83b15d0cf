// Pasted log lines in the site search: Material's query parser reads "word:" as a field name,
// and a query such as "kv-canary: write_offsets_len must be positive, got 0" (the shape of every
// SGLang message) then matches nothing. A colon before a space is turned into a space before
// the search reads the box; "title:verify" (no space) keeps its field meaning.
(function () {
  function clean(event) {
    var box = event.target;
    if (!box || !box.classList || !box.classList.contains("md-search__input")) return;
    var value = box.value.replace(/:(?=\s)/g, " ");  // same length: the cursor stays put
    if (value === box.value) return;
    var start = box.selectionStart, end = box.selectionEnd;
    box.value = value;
    box.setSelectionRange(start, end);
  }
  ["keydown", "input", "keyup"].forEach(function (type) {
    document.addEventListener(type, clean, true);  // capture: runs before the search's own listeners
  });
})();
