// The mmsparse search page: query box, the query's terms as removable chips, result grids.
// Talks to the JSON API (GET /info, GET /search); builds every element with textContent, so no
// text from the index or the query is ever parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { q: "", k: 20, exclude: [], add: [], terms: [], modes: [], seq: 0, allChips: false, last: {} };

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function setStatus(kind, text) {
  $("status").dataset.state = kind;
  $("status").textContent = text;
}

function params(mode) {
  const p = new URLSearchParams({ q: state.q, k: String(state.k) });
  if (mode) p.set("mode", mode);
  state.exclude.forEach((t) => p.append("exclude", t));
  state.add.forEach((t) => p.append("add", t));
  return p;
}

async function getJSON(url) {
  const r = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => ({ error: r.statusText, status: r.status }));
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}

const SHOWN_CHIPS = 30;     // the strongest terms; the rest behind "+N more" (they weigh little)

function renderChips(res) {
  const box = $("chips");
  box.replaceChildren();
  const terms = res ? res.terms : [];
  // dropped terms first, so the edit that made these results is in sight
  if (state.exclude.length) box.append(el("span", "chips-label", "dropped:"));
  for (const term of state.exclude) {
    const chip = el("button", "chip dropped", term.startsWith("##") ? "-" + term.slice(2) : term);
    chip.type = "button";
    chip.dataset.dropped = term;
    chip.title = "dropped; click to bring it back";
    chip.addEventListener("click", () => { state.exclude = state.exclude.filter((x) => x !== term); search(); });
    box.append(chip);
  }
  if (state.exclude.length) box.append(el("span", "chips-sep"));
  const maxW = Math.max(1e-9, ...terms.map((t) => t.weight));
  terms.forEach((t, n) => {
    const chip = el("span", "chip" + (state.add.length && isAdded(t) ? " added" : "") +
                    (n >= SHOWN_CHIPS ? " extra" : ""));
    chip.dataset.term = t.term;
    chip.title = `q = ${t.weight.toFixed(3)}`;
    chip.style.fontSize = (0.8 + 0.7 * (t.weight / maxW)).toFixed(2) + "em";
    chip.append(el("span", "label", t.display));
    const x = el("button", "x", "×");
    x.type = "button";
    x.title = `drop "${t.display}" and search again`;
    x.setAttribute("aria-label", `drop ${t.display}`);
    x.addEventListener("click", () => { state.exclude.push(t.term); search(); });
    chip.append(x);
    box.append(chip);
  });
  if (terms.length > SHOWN_CHIPS) {
    const more = el("button", "more", state.allChips ? "show fewer" : `+${terms.length - SHOWN_CHIPS} more`);
    more.type = "button";
    more.addEventListener("click", () => { state.allChips = !state.allChips; renderChips(res); });
    box.append(more);
  }
  box.classList.toggle("all", !!state.allChips);
  $("terms-count").textContent = res ? `${terms.length} terms` : "";
  $("terms-bar").hidden = !res;
}

function isAdded(t) {
  return state.add.some((w) => w.toLowerCase() === t.term.toLowerCase());
}

function renderHits(where, res, mode) {
  const grid = $(where + "-results");
  grid.replaceChildren();
  const edited = mode === "dense" && (state.exclude.length || state.add.length) ? " · term edits do not apply" : "";
  $(where + "-meta").textContent = res ? `${res.index}, ${res.results.length} results, ${res.took_ms} ms${edited}` : "";
  if (!res) return;
  if (!res.results.length) {
    grid.append(el("div", "empty", "No image shares a term with this query."));
    return;
  }
  // after an edit of the same query: how each image moved (new, up, down) since the last results
  const key = `${res.query}\u0000${res.k}`;
  const prev = state.last[mode] && state.last[mode].key === key ? state.last[mode].ranks : null;
  state.last[mode] = { key, ranks: new Map(res.results.map((h) => [h.id, h.rank])) };
  const maxC = Math.max(1e-9, ...res.results.flatMap((h) => h.shared.map((s) => s.contribution)));
  for (const h of res.results) {
    const card = el("figure", "hit");
    card.dataset.id = h.id;
    card.dataset.rank = String(h.rank);
    if (h.image) {
      const img = el("img");
      img.loading = "lazy";
      img.src = h.image;
      img.alt = h.id;
      card.append(img);
    } else {
      card.append(el("div", "noimg", h.id));
    }
    const meta = el("figcaption", "meta");
    meta.append(el("span", "id", `${h.rank}. ${h.id}`));
    if (prev) {
      const was = prev.get(h.id);
      const move = was === undefined ? ["new", "new", "not in the previous results"]
        : was > h.rank ? ["up", `▲${was - h.rank}`, `was ${was}`]
        : was < h.rank ? ["down", `▼${h.rank - was}`, `was ${was}`] : null;
      if (move) {
        const m = el("span", "move " + move[0], move[1]);
        m.title = move[2];
        meta.append(m);
      }
    }
    meta.append(el("span", "score", h.score.toFixed(3)));
    meta.title = h.id;
    card.append(meta);
    if (mode === "sparse") {
      const terms = el("div", "terms");
      for (const s of h.shared.slice(0, 8)) {
        const span = el("span", "", s.display);
        span.style.fontSize = (0.72 + 0.6 * (s.contribution / maxC)).toFixed(2) + "em";
        span.title = `q ${s.query_weight.toFixed(3)} × d ${s.doc_weight.toFixed(3)} = ${s.contribution.toFixed(3)}`;
        terms.append(span);
      }
      card.append(terms);
    }
    grid.append(card);
  }
}

async function search() {
  if (!state.q.trim()) return;
  const seq = ++state.seq;
  setStatus("loading", "searching…");
  history.replaceState(null, "", "?" + params().toString());
  try {
    const jobs = state.modes.map((m) => getJSON("search?" + params(m).toString()));
    const results = await Promise.all(jobs);
    if (seq !== state.seq) return;            // a newer search started meanwhile
    const by = {};
    state.modes.forEach((m, i) => { by[m] = results[i]; });
    renderChips(by.sparse);
    for (const m of state.modes) renderHits(m, by[m], m);
    const took = results.map((r, i) => `${state.modes[i]} ${r.took_ms} ms`).join(", ");
    setStatus("done", `${results[0].results.length} results for “${state.q}” (${took})`);
  } catch (e) {
    if (seq !== state.seq) return;
    setStatus("error", String(e.message || e));
  }
}

async function start() {
  try {
    const info = await getJSON("info");
    state.modes = info.modes;
    $("q").maxLength = info.max_query_chars;
    const main = info.indexes[info.default_mode];
    $("info").textContent = `${main.documents} images · ${main.kind}` +
      (main.method ? ` · ${main.method} head, ${main.vocab_size} terms` : "") +
      ` · query encoder: ${main.query_encoder}`;
    $("info").dataset.modelLoaded = String(main.model_loaded);
    for (const m of info.modes) $(m + "-col").hidden = false;
    for (const opt of $("k").options) if (Number(opt.value) > info.max_k) opt.disabled = true;
  } catch (e) {
    setStatus("error", "cannot reach the server: " + e.message);
    return;
  }
  $("search-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.q = $("q").value.trim();
    state.k = Number($("k").value);
    state.exclude = [];
    state.add = [];
    search();
  });
  $("k").addEventListener("change", () => { state.k = Number($("k").value); search(); });
  $("add-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const w = $("add-word").value.trim();
    if (w && !state.add.includes(w)) { state.add.push(w); $("add-word").value = ""; search(); }
  });
  const u = new URLSearchParams(location.search);
  if (u.get("q")) {
    state.q = u.get("q");
    $("q").value = state.q;
    state.k = Number(u.get("k")) || state.k;
    $("k").value = String(state.k);
    state.exclude = u.getAll("exclude");
    state.add = u.getAll("add");
    search();
  } else {
    setStatus("idle", "Type what you are looking for.");
  }
}

start();
