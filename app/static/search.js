// Search: POST /collections/{name}/search (the chosen collection; /search is default's) with mode, top_k and
// metadata filters; chunks shown with the server's highlights marked; beside them the matches' facets
// (POST .../facets): each field's most frequent values, and its range of numbers or dates. A collection of
// the caller's own vectors has no model to embed a text query: there the page searches by words (BM25) and
// says so.
"use strict";

(() => {
  const form = document.getElementById("s-form");
  const query = document.getElementById("s-query");
  const mode = document.getElementById("s-mode");
  const collection = document.getElementById("s-collection");
  const topk = document.getElementById("s-topk");
  const status = document.getElementById("s-status");
  const list = document.getElementById("s-results");
  const filterBox = document.getElementById("s-filters");
  const filterFields = document.getElementById("s-filter-fields");
  const facetList = document.getElementById("s-facets");
  const seen = new Map(); // field -> Set of values met in results, offered as suggestions
  const modeNote = document.getElementById("s-mode-note");
  const models = new Map(); // collection -> its model, null for a collection of your own vectors
  let chosenMode = mode.value; // the reader's mode, given back on leaving a collection of own vectors

  // A collection's routes: /collections/{name}/..., or the old routes for default.
  function scoped(route) {
    const name = collection.value || "default";
    return name === "default" ? route : `/collections/${encodeURIComponent(name)}${route}`;
  }

  // The collections this key may read (GET /collections lists only those), default first.
  async function loadCollections() {
    let answer;
    try {
      answer = await api("/collections");
    } catch (error) {
      return; // an older service, or a key that may not list: default alone
    }
    const chosen = new URLSearchParams(location.search).get("collection") || collection.value;
    const names = answer.collections.map((entry) => entry.name);
    models.clear();
    for (const entry of answer.collections) models.set(entry.name, entry.model ?? null);
    collection.replaceChildren(...names.map((name) => el("option", { value: name }, name)));
    collection.value = names.includes(chosen) ? chosen : names[0] || "default";
    fitModeToCollection();
  }

  // Own vectors, no model: dense and hybrid would need the query's vector, which a text box cannot give; the
  // words still rank (BM25). The other modes are disabled there, and the note says why and where they work.
  function fitModeToCollection() {
    const name = collection.value;
    const own = models.has(name) && models.get(name) === null;
    for (const option of mode.options) option.disabled = own && option.value !== "bm25";
    mode.value = own ? "bm25" : chosenMode;
    modeNote.hidden = !own;
    modeNote.textContent = own
      ? `"${name}" holds your own vectors and no model to embed a text query: searching by words (BM25). ` +
        `Dense and hybrid search there take the query's vector: "vector" in POST /collections/${name}/search.`
      : "";
  }

  async function loadFields() {
    let answer;
    try {
      answer = await api(scoped("/index/fields"));
    } catch (error) {
      setStatus(status, error.message, "error");
      return;
    }
    const inputs = answer.fields.map((field) => {
      const id = `f-${field.replace(/[^a-z0-9_-]/gi, "_")}`;
      seen.set(field, new Set());
      return el(
        "div",
        { class: "field" },
        el("label", { for: id }, field),
        el("input", { type: "text", id, "data-field": field, list: `${id}-values`, placeholder: "any", autocomplete: "off" }),
        el("datalist", { id: `${id}-values` }),
      );
    });
    filterFields.replaceChildren(...inputs);
    filterBox.hidden = inputs.length === 0;
    const counts = answer.counts || {};
    if (!list.children.length) {
      setStatus(status, `${counts.documents ?? "?"} documents, ${counts.chunks ?? "?"} chunks in the index.`);
    }
  }

  // "1861" might be stored as a number or a string: send both, the filter is "any of".
  function filterValue(raw) {
    const values = raw.split(",").map((v) => v.trim()).filter(Boolean).flatMap((v) => {
      if (/^-?\d+(\.\d+)?$/.test(v)) return [Number(v), v];
      if (v === "true" || v === "false") return [v === "true", v];
      return [v];
    });
    return values.length === 1 ? values[0] : values;
  }

  function filters() {
    const chosen = {};
    for (const input of filterFields.querySelectorAll("input[data-field]")) {
      if (input.value.trim()) chosen[input.dataset.field] = filterValue(input.value);
    }
    return Object.keys(chosen).length ? chosen : null;
  }

  const run = latest(async (signal) => {
    const q = query.value.trim();
    if (!q) {
      setStatus(status, "Type a query first.");
      query.focus();
      return;
    }
    setStatus(status, "Searching…");
    const body = { query: q, mode: mode.value, top_k: Number(topk.value), highlight: true };
    const chosen = filters();
    if (chosen) body.filter = chosen;
    const started = performance.now();
    let answer;
    try {
      answer = await api(scoped("/search"), { method: "POST", body, signal });
    } catch (error) {
      if (error.name === "AbortError") return;
      setStatus(status, error.message, error.status === 429 ? "busy" : "error");
      list.replaceChildren();
      return;
    }
    const roundTrip = Math.round(performance.now() - started);
    list.replaceChildren(...answer.results.map((result, i) => resultCard(result, i)));
    remember(answer.results);
    const n = answer.results.length;
    const latency = el("span", { class: "latency", id: "s-latency" }, `${answer.took_ms.toFixed(1)} ms on the server, ${roundTrip} ms round trip`);
    status.replaceChildren(`${n} result${n === 1 ? "" : "s"} (${answer.mode}) · `, latency);
    status.className = "status";
    status.setAttribute("role", "status");
    showFacets(chosen, signal);
  });

  // The matches' facets for every filterable field: a value is a button that filters by it.
  async function showFacets(chosen, signal) {
    const fields = [...filterFields.querySelectorAll("input[data-field]")].map((input) => input.dataset.field);
    if (!fields.length) return facetList.replaceChildren();
    let answer;
    try {
      answer = await api(scoped("/facets"), { method: "POST", body: { filter: chosen, fields: fields.slice(0, 64), top: 5 }, signal });
    } catch (error) {
      return facetList.replaceChildren(); // facets are an extra: the results stand without them
    }
    const items = Object.entries(answer.fields).filter(([, facet]) => facet.type).map(([field, facet]) => {
      const span = facet.numbers || facet.dates;
      return el(
        "li",
        { class: "facet", "data-field": field },
        el("strong", {}, `${field}`),
        ` ${facet.type} · ${facet.documents} of ${answer.total}`,
        span ? el("span", { class: "facet-range" }, ` · ${span.min} – ${span.max}`) : "",
        el(
          "ul",
          { class: "facet-values" },
          facet.values.map((entry) =>
            el("li", {}, el("button", { type: "button", onclick: () => setFilter(field, entry.value) }, `${entry.value} (${entry.count})`)),
          ),
        ),
      );
    });
    facetList.replaceChildren(...items);
  }

  function resultCard(result, rank) {
    const meta = result.metadata || {};
    const title = meta.title ? `${meta.title}` : result.id;
    const chips = Object.entries(meta)
      .filter(([field]) => field !== "title")
      .map(([field, value]) =>
        el(
          "li",
          {},
          el("button", { type: "button", title: `Filter by ${field} = ${value}`, onclick: () => setFilter(field, value) }, `${field}: ${value}`),
        ),
      );
    return el(
      "li",
      { class: "result", "data-id": result.id },
      el(
        "div",
        { class: "result-head" },
        el("span", { class: "result-title" }, `${rank + 1}. ${title}`),
        el("span", { class: "score", title: "score" }, `score ${result.score.toFixed(4)}`),
      ),
      el("p", { class: "chunk" }, highlight(result.chunk, result.highlights)),
      el("ul", { class: "meta", "aria-label": "Metadata" }, chips, el("li", {}, `${result.id} · chunk ${result.chunk_index}`)),
    );
  }

  // The chunk as text nodes with <mark> around the server's highlights: the words BM25 matched (stems, no stop
  // words). Spans are [start, end) in code points, so the chunk is sliced as code points, not UTF-16 units.
  function highlight(chunk, spans) {
    if (!spans || !spans.length) return [chunk];
    const points = Array.from(chunk);
    const out = [];
    let last = 0;
    for (const [start, end] of spans) {
      if (start < last || start >= end || end > points.length) continue;
      out.push(points.slice(last, start).join(""), el("mark", {}, points.slice(start, end).join("")));
      last = end;
    }
    out.push(points.slice(last).join(""));
    return out;
  }

  function remember(results) {
    for (const result of results) {
      for (const [field, value] of Object.entries(result.metadata || {})) {
        const values = seen.get(field);
        if (values && values.size < 200 && typeof value !== "object") values.add(String(value));
      }
    }
    for (const input of filterFields.querySelectorAll("input[data-field]")) {
      const values = [...(seen.get(input.dataset.field) || [])].sort();
      document.getElementById(input.getAttribute("list")).replaceChildren(...values.map((v) => el("option", { value: v })));
    }
  }

  function setFilter(field, value) {
    const input = filterFields.querySelector(`input[data-field="${CSS.escape(field)}"]`);
    if (!input) return;
    input.value = String(value);
    run();
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    run();
  });
  mode.addEventListener("change", () => {
    if (!mode.options[mode.selectedIndex].disabled && modeNote.hidden) chosenMode = mode.value;
    return query.value.trim() && run();
  });
  collection.addEventListener("change", () => {
    list.replaceChildren();
    fitModeToCollection();
    loadFields().then(() => query.value.trim() && run());
  });
  document.addEventListener("cloze:key-changed", () => loadCollections().then(loadFields));
  const initial = new URLSearchParams(location.search).get("q");
  loadCollections().then(loadFields).then(() => {
    if (initial) {
      query.value = initial;
      run();
    }
  });
})();
