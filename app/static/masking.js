// Masking explorer: one POST /mask-preview per strategy, same sentence, seed and rate.
"use strict";

(() => {
  const STRATEGIES = [
    ["token", "Token (BERT)", "Each token is selected on its own."],
    ["whole_word", "Whole word", "All pieces of a word share one decision."],
    ["span", "Span (SpanBERT)", "Contiguous spans of geometric length, grown to whole words."],
  ];
  const form = document.getElementById("mk-form");
  const text = document.getElementById("mk-text");
  const rate = document.getElementById("mk-rate");
  const rateOut = document.getElementById("mk-rate-out");
  const seed = document.getElementById("mk-seed");
  const status = document.getElementById("mk-status");
  const results = document.getElementById("mk-results");

  const run = latest(async (signal) => {
    const sentence = text.value;
    if (!sentence.trim()) {
      results.replaceChildren();
      setStatus(status, "Type a sentence to mask.");
      return;
    }
    setStatus(status, "Masking…");
    const body = { text: sentence, rate: Number(rate.value), seed: Number(seed.value) || 0 };
    let answers;
    try {
      answers = await Promise.all(
        STRATEGIES.map(([strategy]) => api("/mask-preview", { method: "POST", body: { ...body, strategy }, signal })),
      );
    } catch (error) {
      if (error.name === "AbortError") return;
      setStatus(status, error.message, error.status === 429 ? "busy" : "error");
      results.replaceChildren();
      return;
    }
    results.replaceChildren(...answers.map((answer, i) => strategyPanel(STRATEGIES[i], answer)));
    const first = answers[0];
    const cut = first.truncated ? " The sentence was cut to the model's window." : "";
    setStatus(status, `${first.counts.tokens} tokens from ${first.model_id}'s tokenizer, seed ${first.seed}.${cut}`);
  });

  function strategyPanel([strategy, title, about], answer) {
    const c = answer.counts;
    const summary = `${c.selected} of ${c.candidates} selected: ${c.mask} masked, ${c.random} random, ${c.kept} kept`;
    return el(
      "section",
      { class: "panel strategy", "data-strategy": strategy, "aria-label": `${title} masking` },
      el(
        "div",
        { class: "strategy-head" },
        el("h2", {}, title),
        el("p", { class: "counts", "data-tokens": c.tokens, "data-selected": c.selected }, summary),
      ),
      el("p", { class: "hint", style: "margin:0 0 0.6rem" }, about),
      el("ol", { class: "tokens" }, answer.tokens.map(tokenChip)),
    );
  }

  function tokenChip(token) {
    const classes = ["tok"];
    if (token.special) classes.push("special");
    if (!token.word_start && !token.special) classes.push("cont");
    let now = null;
    let label = token.token;
    if (token.action === "mask") {
      now = token.replacement;
      label = `${token.token}: selected, replaced by the mask token`;
    } else if (token.action === "random") {
      now = `→ ${token.replacement}`;
      label = `${token.token}: selected, replaced by the random token ${token.replacement}`;
    } else if (token.action === "kept") {
      now = "kept";
      label = `${token.token}: selected, kept unchanged`;
    }
    return el(
      "li",
      { class: classes.join(" "), "data-action": token.action, "data-selected": token.selected ? "true" : "false", title: label, "aria-label": label },
      el("span", { class: "was" }, token.token),
      el("span", { class: "now", "aria-hidden": now ? null : "true" }, now || "\u00a0"),
    );
  }

  rate.addEventListener("input", () => {
    rateOut.textContent = `${Math.round(Number(rate.value) * 100)}%`;
  });
  rate.addEventListener("change", () => run());
  seed.addEventListener("change", () => run());
  text.addEventListener("input", debounce(() => run(), 350));
  document.getElementById("mk-reseed").addEventListener("click", () => {
    seed.value = String(Math.floor(Math.random() * 1_000_000));
    run();
  });
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    run();
  });
  document.addEventListener("cloze:key-changed", () => run());
  run();
})();
