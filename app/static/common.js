// Shared by every playground page: the header, the API key, and one fetch wrapper that turns the
// service's {"error", "field"} answers into sentences a person can act on.
"use strict";

const KEY_STORAGE = "cloze.apiKey";

const PAGES = [
  ["/", "Home"],
  ["/static/fill-mask.html", "Fill-mask"],
  ["/static/masking.html", "Masking explorer"],
  ["/static/search.html", "Search"],
];

function storedKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch (_) {
    return "";
  }
}

function saveKey(value) {
  try {
    if (value) localStorage.setItem(KEY_STORAGE, value);
    else localStorage.removeItem(KEY_STORAGE);
  } catch (_) {
    /* private mode: the key lives for this page only */
  }
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function renderHeader() {
  const here = location.pathname === "/index.html" || location.pathname === "/static/index.html" ? "/" : location.pathname;
  const links = PAGES.map(([href, label]) =>
    el("li", {}, el("a", { href, "aria-current": href === here ? "page" : null }, label)),
  );
  const input = el("input", {
    type: "password",
    id: "api-key",
    autocomplete: "off",
    placeholder: "paste a read key",
    value: storedKey(),
  });
  const state = el("p", { id: "api-key-state", "aria-live": "polite" });
  const describe = () => {
    state.textContent = storedKey()
      ? "A key is saved in this browser and sent as 'Authorization: Bearer'."
      : "No key: fine when the server's reads are open.";
  };
  describe();
  const apply = (event) => {
    if (event) event.preventDefault();
    if (input.value.trim() === storedKey()) return;
    saveKey(input.value.trim());
    describe();
    document.dispatchEvent(new CustomEvent("cloze:key-changed"));
  };
  input.addEventListener("change", () => apply());
  const user = el("input", { type: "text", autocomplete: "username", value: "api", hidden: true, "aria-hidden": "true" });
  const box = el(
    "details",
    { class: "key-box" },
    el("summary", {}, "API key"),
    el(
      "form",
      { class: "key-panel", onsubmit: apply },
      el("label", { for: "api-key" }, "API key"),
      user,
      input,
      state,
    ),
  );
  const header = el(
    "header",
    { class: "site" },
    el(
      "div",
      { class: "site-inner" },
      el("a", { class: "brand", href: "/" }, "cloze-search"),
      el("nav", { "aria-label": "Playground pages" }, el("ul", {}, links)),
      box,
    ),
  );
  document.body.prepend(el("a", { class: "skip", href: "#main" }, "Skip to content"), header);
}

class ApiError extends Error {
  constructor(status, message, field, retryAfter) {
    super(message);
    this.status = status;
    this.field = field;
    this.retryAfter = retryAfter;
  }
}

// A fetch to the service: JSON in, JSON out, the saved key attached, errors as ApiError.
async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json" };
  const key = storedKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "The server did not answer: is it running?", null, null);
  }
  // An abort can also land while the body is read: it must stay an abort, not become an empty answer.
  const data = await response.json().catch((error) => {
    if (error.name === "AbortError") throw error;
    return null;
  });
  if (response.ok) return data;
  const retryAfter = Number(response.headers.get("Retry-After")) || null;
  throw new ApiError(response.status, explain(response.status, data, retryAfter), data && data.field, retryAfter);
}

function explain(status, data, retryAfter) {
  const said = data && data.error ? data.error : `HTTP ${status}`;
  if (status === 401) return `This server needs an API key: open "API key" above and paste one (${said}).`;
  if (status === 403) return `This key may not do that (${said}).`;
  if (status === 429) return `The server is busy; trying again in ${retryAfter || 1} s.`;
  if (status === 503) return `Not ready yet: ${said}.`;
  if (status === 413) return "That text is too long for this server.";
  return said;
}

// Show a message in a status line: kind is "", "error" or "busy".
function setStatus(node, message, kind = "") {
  node.textContent = message;
  node.className = `status${kind ? ` ${kind}` : ""}`;
  node.setAttribute("role", kind === "error" ? "alert" : "status");
}

function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

// One request in flight per caller: a newer call aborts the older one, so stale answers never land.
function latest(fn) {
  let controller = null;
  return async (...args) => {
    if (controller) controller.abort();
    controller = new AbortController();
    const mine = controller;
    try {
      return await fn(mine.signal, ...args);
    } finally {
      if (controller === mine) controller = null;
    }
  };
}

const MODELS = { promise: null };

// GET /models once per page: the mask token and the window come from the serving model, not from here.
function models() {
  if (!MODELS.promise) MODELS.promise = api("/models").catch((error) => ({ error }));
  return MODELS.promise;
}

document.addEventListener("cloze:key-changed", () => {
  MODELS.promise = null;
});

renderHeader();
