// Pasted log lines in the site search: Material's query parser reads "word:" as a field name,
// and a query such as "kv-canary: write_offsets_len must be positive, got 0" (the shape of every
// SGLang message) then matches nothing. A colon before a space is turned into a space before
// the search reads the box; "title:verify" (no space) keeps its field meaning. The "kv-canary: "
// prefix of a pasted message is dropped: every SGLang message has it, so it ranks nothing, and
// its "kv" matches every API heading (kvcanary_numba.*), burying the error page. A pasted
// message of ours names its code ("... got 0 [KVC-P001] Run 'kvcanary explain KVC-P001' ..."):
// the search is then for that code alone, whose page has it in its title.
(function () {
  var CODE = /\bKVC-[A-Z]\d{3}\b/i;

  function clean(event) {
    var box = event.target;
    if (!box || !box.classList || !box.classList.contains("md-search__input")) return;
    var code = box.value.match(CODE);
    if (code && box.value.trim().length > code[0].length) {
      box.value = code[0].toUpperCase();
      box.setSelectionRange(box.value.length, box.value.length);
      return;
    }
    var prefix = box.value.match(/^\s*kv-canary:?\s+(?=\S)/);  // ":" may already be a space
    var cut = prefix ? prefix[0].length : 0;
    var value = box.value.slice(cut).replace(/:(?=\s)/g, " ");  // colons: same length
    if (value === box.value) return;
    var start = Math.max(0, box.selectionStart - cut), end = Math.max(0, box.selectionEnd - cut);
    box.value = value;
    box.setSelectionRange(start, end);
  }
  ["keydown", "input", "keyup"].forEach(function (type) {
    document.addEventListener(type, clean, true);  // capture: runs before the search's own listeners
  });
})();
