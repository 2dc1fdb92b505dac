/* The Chinese edition's search splits the query into words, as the index was split.
 *
 * Sphinx indexes a Chinese page with jieba (sphinx.search.zh: cut_for_search), so 混合精度 in
 * a page is indexed as the words 混合 and 精度; its searchtools.js splits a query only at
 * spaces and punctuation, so a reader typing 混合精度 (as Chinese is typed: no spaces) asked for
 * the one "word" 混合精度, which the index does not hold. This splitter (Sphinx's
 * `js_splitter_code`, put into the Chinese edition's language_data.js by website/conf.py) cuts
 * each run of Chinese characters into words of the index itself: the dictionary is the index's
 * own Chinese terms (page text and titles), so a query is cut only into words jieba made from
 * the pages. Of the ways to cut a run, it takes the one that leaves the fewest characters outside
 * an index word, then the one with the most words: a page with a longer word has its shorter
 * words indexed too (cut_for_search indexes 混合 and 精度 within 混合精度), so the query finds
 * what the same words typed with spaces find (混合 精度), the longer word's pages among them; a
 * character that is in no index word is dropped where the run has words (jieba's index keeps
 * no single characters), and a run without any index word is kept whole (Sphinx then matches it
 * as part of a longer term). Latin words, numbers and a pasted error message split as before.
 * Before the index has loaded (it has, whenever searchtools.js queries), it splits as Sphinx does.
 */
var splitQuery = (function () {
  "use strict";
  var WORD = /[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/u;
  var HAN = /(\p{Script=Han}+)/u;
  var IS_HAN = /^\p{Script=Han}+$/u;
  var cache = { index: null, words: null, longest: 1 };

  function dictionary() {
    var search = typeof Search !== "undefined" ? Search : window.Search;
    var index = search && search._index;
    if (!index) return null;
    if (cache.index !== index) {
      var words = new Set(), longest = 1;
      [index.terms || {}, index.titleterms || {}].forEach(function (terms) {
        Object.keys(terms).forEach(function (term) {
          if (term.length > 1 && IS_HAN.test(term)) {
            words.add(term);
            if (term.length > longest) longest = term.length;
          }
        });
      });
      cache = { index: index, words: words, longest: longest };
    }
    return cache;
  }

  // The best cut of one run of Chinese characters into index words (see above).
  function cut(run, dict) {
    var chars = Array.from(run), n = chars.length;
    // best[i]: [characters left outside a word, words, previous position, a word?] for chars[0..i)
    var best = [[0, 0, -1, false]];
    for (var i = 1; i <= n; i++) {
      best[i] = null;
      for (var len = 1; len <= Math.min(dict.longest, i); len++) {
        var from = best[i - len], piece = chars.slice(i - len, i).join("");
        var word = len > 1 && dict.words.has(piece);
        if (len > 1 && !word) continue;
        var cand = [from[0] + (word ? 0 : 1), from[1] + 1, i - len, word];
        var b = best[i];
        if (!b || cand[0] < b[0] || (cand[0] === b[0] && cand[1] > b[1])) best[i] = cand;
      }
    }
    var words = [], at = n;
    while (at > 0) {
      var step = best[at];
      if (step[3]) words.unshift(chars.slice(step[2], at).join(""));
      at = step[2];
    }
    return words.length ? words : [run];
  }

  return function (query) {
    var dict = dictionary();
    var out = [];
    query.split(WORD).forEach(function (token) {
      if (!token) return;
      if (!dict || !dict.words.size) { out.push(token); return; }
      token.split(HAN).forEach(function (part) {
        if (!part) return;
        if (IS_HAN.test(part)) out.push.apply(out, cut(part, dict));
        else out.push(part);
      });
    });
    return out;
  };
})();
