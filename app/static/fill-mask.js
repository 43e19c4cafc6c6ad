// Fill-mask: debounced POST /fill-mask while typing, top-k bars per mask, click to fill.
"use strict";

(() => {
  const text = document.getElementById("fm-text");
  const topk = document.getElementById("fm-topk");
  const status = document.getElementById("fm-status");
  const results = document.getElementById("fm-results");
  const modelLine = document.getElementById("fm-model");
  const state = { mask: "[MASK]", maxTokens: null, retry: null };

  function maskCount(value) {
    return value.split(state.mask).length - 1;
  }

  const predict = latest(async (signal) => {
    clearTimeout(state.retry);
    const sentence = text.value;
    if (!sentence.trim() || maskCount(sentence) === 0) {
      results.replaceChildren();
      setStatus(status, `No ${state.mask} in the sentence: press "Insert ${state.mask}" where a word is missing.`);
      return;
    }
    setStatus(status, "Predicting…");
    const started = performance.now();
    let answer;
    try {
      answer = await api("/fill-mask", { method: "POST", body: { inputs: sentence, parameters: { top_k: Number(topk.value) } }, signal });
    } catch (error) {
      if (error.name === "AbortError") return;
      showError(error);
      return;
    }
    // The Hugging Face pipeline's shape: one mask, a flat list of predictions; several, a list per mask.
    const masks = answer.length && Array.isArray(answer[0]) ? answer : [answer];
    render(sentence, masks);
    const ms = Math.round(performance.now() - started);
    setStatus(status, `${masks.length} mask${masks.length === 1 ? "" : "s"} answered in ${ms} ms.`);
  });

  function showError(error) {
    if (error.status === 429 || (error.status === 503 && error.retryAfter)) {
      setStatus(status, error.message, "busy");
      state.retry = setTimeout(() => predict(), (error.retryAfter || 1) * 1000);
      return;
    }
    if (error.status === 422 && /window|too long|characters/.test(error.message)) {
      const window = state.maxTokens ? ` (the model reads ${state.maxTokens} tokens)` : "";
      setStatus(status, `Too long${window}: ${error.message}. Shorten the sentence or move the mask earlier.`, "error");
    } else {
      setStatus(status, error.message, "error");
    }
    results.replaceChildren();
  }

  function render(sentence, masks) {
    const sections = masks.map((predictions, position) => {
      const items = predictions.map((prediction) => {
        const percent = (prediction.score * 100).toFixed(1);
        const width = prediction.score * 100; // the probability itself: a flat, unsure model shows short bars
        return el(
          "li",
          {},
          el(
            "button",
            {
              type: "button",
              class: "prediction",
              "data-token": prediction.token_str,
              "aria-label": `Use "${prediction.token_str}" for mask ${position + 1} (${percent}%)`,
              onclick: () => fill(position, prediction.token_str),
            },
            el("span", { class: "token" }, prediction.token_str),
            el("span", { class: "bar", "aria-hidden": "true" }, el("span", { class: "bar-fill", style: `width:${width.toFixed(2)}%` })),
            el("span", { class: "prob" }, `${percent}%`),
          ),
        );
      });
      const top = predictions[0];
      return el(
        "article",
        { class: "panel mask-result", "data-mask": position },
        el("h2", {}, masks.length > 1 ? `Mask ${position + 1}` : "Predictions"),
        el("ol", { class: "predictions" }, items),
        top ? el("p", { class: "preview-sentence" }, filled(sentence, position, top.token_str).text) : null,
      );
    });
    results.replaceChildren(...sections);
  }

  // The sentence with a prediction in place of the n-th mask (the other masks stay); a "##piece"
  // continuation joins the word before it. The preview under each mask is this with its top prediction.
  function filled(value, position, token) {
    const parts = value.split(state.mask);
    if (position >= parts.length - 1) return { text: value, caret: value.length };
    let before = parts.slice(0, position + 1).join(state.mask);
    let word = token.trim();
    if (word.startsWith("##")) {
      word = word.slice(2);
      before = before.replace(/\s+$/, "");
    }
    const after = parts.slice(position + 1).join(state.mask);
    return { text: before + word + after, caret: before.length + word.length };
  }

  function fill(position, token) {
    if (position >= maskCount(text.value)) return;
    const { text: value, caret } = filled(text.value, position, token);
    text.value = value;
    text.focus();
    text.setSelectionRange(caret, caret);
    predict();
  }

  function insertMask() {
    const start = text.selectionStart ?? text.value.length;
    const end = text.selectionEnd ?? start;
    const left = text.value.slice(0, start);
    const pad = left && !/\s$/.test(left) ? " " : "";
    text.value = left + pad + state.mask + text.value.slice(end);
    const caret = start + pad.length + state.mask.length;
    text.focus();
    text.setSelectionRange(caret, caret);
    predict();
  }

  async function loadModel() {
    const info = await models();
    if (info.error) {
      modelLine.textContent = info.error.message;
      return;
    }
    if (!info.fill_mask) {
      setStatus(status, info.fill_mask_error || "This server has no fill-mask model.", "error");
      return;
    }
    const previous = state.mask;
    state.mask = info.fill_mask.mask_token;
    state.maxTokens = info.fill_mask.max_tokens;
    if (previous !== state.mask) text.value = text.value.split(previous).join(state.mask);
    for (const node of document.querySelectorAll(".mask-name")) node.textContent = state.mask;
    modelLine.textContent = `Model: ${info.fill_mask.model_id} · ${info.fill_mask.backend} · window ${state.maxTokens} tokens`;
  }

  const typed = debounce(() => predict(), 250);
  text.addEventListener("input", typed);
  topk.addEventListener("change", () => predict());
  document.getElementById("fm-insert").addEventListener("click", insertMask);
  document.addEventListener("cloze:key-changed", () => loadModel().then(() => predict()));
  loadModel().then(() => predict());
})();
