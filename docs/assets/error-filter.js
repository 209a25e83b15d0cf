// Filter box of the error catalogue index. Plain progressive enhancement: without JavaScript
// the full tables stay visible. What it shows, in this order of preference:
//  1. a code named in the box (every message of ours ends with "[KVC-P001] ..."): that row;
//  2. rows whose code, title or message template contains the text typed (as typed);
//  3. rows one of whose messages (ours or SGLang's) the text is, values included: the page's
//     patterns (#kvc-error-patterns, made by kvcanary_numba.errors.matching, which
//     `kvcanary explain` runs), each field matching any value, the most specific (most literal
//     text) winning;
//  4. else the three rows sharing the most words with the text, with a hint saying so.
(function () {
  var CODE = /\bKVC-[A-Z]\d{3}\b/gi;
  var WORD = /[a-z_][a-z0-9_+]*[a-z0-9_]|[a-z]/g;

  function words(text, common) {
    var found = {};
    (text.toLowerCase().replace(/\{[^{}]*\}/g, " ").match(WORD) || []).forEach(function (word) {
      [word].concat(word.split("_")).forEach(function (w) {
        if (w.length > 1 && !common[w] && !/^\d+$/.test(w)) found[w] = true;
      });
    });
    return found;
  }

  function rowsByCode() {
    var rows = {};
    document.querySelectorAll(".md-typeset table tbody tr").forEach(function (row) {
      var link = row.querySelector("a");
      if (link) rows[link.textContent.trim().toUpperCase()] = row;
    });
    return rows;
  }

  function chosen(needle, rows, data, common) {
    var named = (needle.match(CODE) || []).map(function (c) { return c.toUpperCase(); })
      .filter(function (c) { return rows[c]; });
    if (named.length) return { codes: named, hint: "" };
    var lower = needle.toLowerCase(), codes = [];
    Object.keys(rows).forEach(function (code) {
      if (rows[code].textContent.toLowerCase().indexOf(lower) !== -1) codes.push(code);
    });
    if (codes.length) return { codes: codes, hint: "" };
    var body = needle.replace(/\s*\[KVC-[A-Z]\d{3}\][\s\S]*$/i, "").trim(), best = 0;
    Object.keys(data.codes).forEach(function (code) {
      data.codes[code].patterns.forEach(function (pattern) {  // [source, literal length]
        if (!rows[code] || pattern[1] < best || !new RegExp(pattern[0] + "\\s*$").test(body)) return;
        if (pattern[1] > best) codes = [];
        best = pattern[1];
        if (codes.indexOf(code) === -1) codes.push(code);
      });
    });
    if (codes.length) return { codes: codes, hint: "Codes whose message this is:" };
    var pasted = words(body, common), ranked = [];
    Object.keys(data.codes).forEach(function (code) {
      var known = {}, shared = 0, union = 0;
      data.codes[code].words.forEach(function (w) { known[w] = true; });
      Object.keys(known).forEach(function (w) { if (pasted[w]) shared += 1; });
      union = Object.keys(known).length + Object.keys(pasted).length - shared;
      if (shared && rows[code]) ranked.push([shared / union, code]);
    });
    ranked.sort(function (a, b) { return b[0] - a[0] || (a[1] < b[1] ? -1 : 1); });
    codes = ranked.slice(0, 3).map(function (pair) { return pair[1]; });
    return {
      codes: codes,
      hint: codes.length
        ? "No code's message matches; the three sharing the most words with it:"
        : "No code matches. Paste the whole message, or search the site above.",
    };
  }

  function install() {
    var box = document.getElementById("kvc-error-filter");
    var script = document.getElementById("kvc-error-patterns");
    if (!box || box.dataset.installed) return;
    box.dataset.installed = "1";
    var data = script ? JSON.parse(script.textContent) : { codes: {}, common: [] };
    var common = {};
    data.common.forEach(function (w) { common[w] = true; });
    var hint = document.getElementById("kvc-error-filter-hint");
    box.addEventListener("input", function () {
      var rows = rowsByCode(), needle = box.value.trim();
      var shown = needle ? chosen(needle, rows, data, common) : { codes: Object.keys(rows), hint: "" };
      Object.keys(rows).forEach(function (code) {
        rows[code].style.display = shown.codes.indexOf(code) !== -1 ? "" : "none";
      });
      if (hint) hint.textContent = shown.hint;
    });
  }
  if (typeof document$ !== "undefined") {
    document$.subscribe(install);  // Material's instant navigation
  } else {
    document.addEventListener("DOMContentLoaded", install);
  }
})();
