"""``cloze export --model DIR --out DIR``: one folder the runtime and the service load as it is.

It holds the sentence-transformers model (encoder + pooling + normalisation), the ONNX fp32 and
per-channel int8 files in the runtime's own cache layout (``onnx/embed*.onnx`` + ``embed.json``,
written by ``encoder_runtime.backends.onnx_export`` so there is one exporter), and a model card
(``card.json`` for programs, ``README.md`` for people) saying how the model was trained and what it
measured: each score comes from the evaluator behind its ``cloze eval`` command, called in-process. A
score that could not be measured says so instead of being left out.

A cross-encoder folder (a reranker, as ``CrossEncoder.save`` and ``cloze train reranker`` write it) is
exported by ``export_reranker``: the folder as sentence-transformers saves it, ``onnx/rerank*.onnx`` (fp32
and int8 calibrated on pairs, by the same exporter) and a card with the scores its trainer measured.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np

from encoder_runtime import is_reranker, load_encoder, load_reranker, sigmoid
from encoder_runtime.backends.onnx_export import export_all
from encoder_runtime.model_dir import ModelInfo, resolve_model_path
from encoder_training.finetuning.train import TRAINING_RECORD, build_model, stamp_legacy_pooling
from encoder_training.pretraining.heldout import evaluate_mlm
from evaluation.beir import default_index_dir, evaluate_beir
from evaluation.data_folder import default_data_dir
from evaluation.sts import evaluate_sts

log = logging.getLogger(__name__)
NOT_MEASURED = "not measured"
PROBE_SENTENCES = [
    "A man is playing a guitar.",
    "The capital of France is Paris.",
    "Search engines rank documents by relevance to a query.",
    "Two dogs run across a snowy field.",
]


def export_model(
    model: str | Path,
    out: str | Path,
    *,
    measure_scores: bool = True,
    model_id: str | None = None,
    data_dir: Path | None = None,
) -> Path:
    """Write the ST folder, ONNX files and card to ``out``; return ``out``. A cross-encoder goes to
    ``export_reranker``."""
    source, out = resolve_model_path(str(model)), Path(out)
    if is_reranker(source):
        return export_reranker(source, out, model_id=model_id)
    save_sentence_transformer(source, out)
    onnx_files = export_onnx(out)
    scores = measure(out, source, data_dir) if measure_scores else {}
    card = build_card(out, source, model_id or out.resolve().name, onnx_files, scores)
    (out / "card.json").write_text(json.dumps(card, indent=2))
    (out / "README.md").write_text(render_readme(card))
    log.info("exported %s -> %s", source, out)
    return out


def save_sentence_transformer(source: Path, out: Path) -> None:
    """Re-save through sentence-transformers, so a plain encoder gains its pooling modules too."""
    if out.resolve() != source.resolve():
        build_model(str(source)).save(str(out))
        if (source / TRAINING_RECORD).is_file():
            shutil.copy2(source / TRAINING_RECORD, out / TRAINING_RECORD)
    stamp_legacy_pooling(out)


def export_onnx(out: Path) -> dict[str, str]:
    fp32, int8 = export_all(str(out), "embed")
    return {"fp32": str(fp32.relative_to(out)), "int8": str(int8.relative_to(out))}


PROBE_PAIRS = [
    ("who plays the guitar", "A man is playing a guitar."),
    ("who plays the guitar", "Two dogs run across a snowy field."),
    ("capital of France", "The capital of France is Paris."),
    ("capital of France", "Search engines rank documents by relevance to a query."),
]


def export_reranker(
    model: str | Path,
    out: str | Path,
    *,
    model_id: str | None = None,
    scores: dict | None = None,
    training: dict | None = None,
) -> Path:
    """A cross-encoder folder ready to serve (``CLOZE_RERANK_MODELS``): saved by sentence-transformers,
    ``onnx/rerank.onnx`` and ``onnx/rerank_int8.onnx``, and a card (``card.json``, ``README.md``) with
    ``scores`` and ``training`` as its trainer measured and recorded them, beside int8's agreement with fp32."""
    source, out = resolve_model_path(str(model)), Path(out)
    if not is_reranker(source):
        raise ValueError(f"{source} is not a cross-encoder (a ...ForSequenceClassification with one label)")
    if out.resolve() != source.resolve():
        from sentence_transformers import CrossEncoder

        CrossEncoder(str(source), device="cpu").save(str(out))
        if (source / TRAINING_RECORD).is_file():
            shutil.copy2(source / TRAINING_RECORD, out / TRAINING_RECORD)
    fp32, int8 = export_all(str(out), "rerank")
    record_path = out / TRAINING_RECORD
    recorded = json.loads(record_path.read_text()) if record_path.is_file() else None
    info = ModelInfo.read(out)
    card = {
        "model_id": model_id or out.resolve().name,
        "kind": "rerank",
        "source": str(source),
        "fingerprint": info.fingerprint,
        "max_tokens": info.max_tokens,
        "onnx": {"fp32": str(fp32.relative_to(out)), "int8": str(int8.relative_to(out))},
        "training": training or recorded or NOT_MEASURED + " (no training record)",
        "scores": {
            "onnx_int8_max_score_difference": round(reranker_int8_difference(out), 4),
            **(scores or {}),
        },
    }
    (out / "card.json").write_text(json.dumps(card, indent=2))
    (out / "README.md").write_text(render_reranker_readme(card))
    log.info("exported reranker %s -> %s", source, out)
    return out


def reranker_int8_difference(out: Path) -> float:
    """Largest difference between int8 and fp32 ONNX relevance (sigmoid, 0..1) on a few pairs."""
    scores = []
    for backend in ("onnx", "onnx-int8"):
        runtime = load_reranker(str(out), backend=backend)
        scores.append(np.concatenate([runtime.score(q, [d]) for q, d in PROBE_PAIRS]))
    return float(np.abs(sigmoid(scores[0]) - sigmoid(scores[1])).max())


def render_reranker_readme(card: dict) -> str:
    return "\n".join(
        [
            f"# {card['model_id']}",
            "",
            "Cross-encoder reranker exported by `cloze export`: a sentence-transformers `CrossEncoder` folder with",
            "ONNX fp32 and int8 files under `onnx/`, served by `cloze serve` when listed in `CLOZE_RERANK_MODELS`.",
            "",
            f"- max tokens {card['max_tokens']} (query and document together; documents are cut to fit)",
            *scores_section(card),
            "## Training",
            "",
            f"`{json.dumps(card['training'])}`",
            "",
            "Full details: `card.json`.",
            "",
        ]
    )


def int8_agreement(out: Path) -> float:
    """Mean cosine between int8 and fp32 ONNX embeddings of a few sentences: the cost of quantising."""
    fp32 = load_encoder(str(out), backend="onnx").embed(PROBE_SENTENCES, normalize=True)
    int8 = load_encoder(str(out), backend="onnx-int8").embed(PROBE_SENTENCES, normalize=True)
    return float(np.mean(np.sum(fp32 * int8, axis=1)))


def measure(out: Path, source: Path, data_dir: Path | None) -> dict:
    """STS-B test here; SciFact and masked-token accuracy through the other stages' eval commands."""
    data = data_dir or default_data_dir()
    scores: dict = {"onnx_int8_cosine_to_fp32": round(int8_agreement(out), 4)}
    scores["stsb_test_spearman"] = _sts_score(out, data)
    scores["scifact_ndcg@10"] = _scifact_score(out, data)
    scores["masked_token_accuracy"] = _mlm_score(source, data)
    return scores


def _sts_score(out: Path, data: Path) -> float | str:
    if not (data / "stsbenchmark" / "sts-test.csv").is_file():
        return NOT_MEASURED + f" (no STS-B data in {data})"
    return round(evaluate_sts(out, data)["spearman"], 4)


def _scifact_score(out: Path, data: Path) -> float | str:
    scifact = data / "beir-scifact"
    if not scifact.is_dir():
        return NOT_MEASURED + f" (no SciFact data in {data})"
    started = time.perf_counter()
    encoder = load_encoder(str(out), backend="onnx")
    index_dir = default_index_dir(scifact, encoder, "onnx")
    result = evaluate_beir(scifact, encoder, "dense", "onnx", index_dir, show_progress=False)
    log.info("SciFact dense nDCG@10 %.4f (%.0f s)", result["ndcg@10"], time.perf_counter() - started)
    return round(result["ndcg@10"], 4)


def _mlm_score(source: Path, data: Path) -> float | str:
    """Held-out WikiText-2 test accuracy of the MLM the encoder came from (the ST folder has no head)."""
    mlm_model, heldout = _mlm_source(source), data / "wikitext-2-raw" / "wiki.test.raw"
    if mlm_model is None:
        return NOT_MEASURED + " (no MLM head in the model or its base)"
    if not heldout.is_file():
        return NOT_MEASURED + f" (no WikiText-2 test in {data})"
    return round(evaluate_mlm(mlm_model, [str(heldout)])["accuracy"], 4)


def _mlm_source(source: Path) -> Path | None:
    """The folder that still has an MLM head: the source itself, or a base model up its fine-tuning chain."""
    candidate: Path | None = source
    for _ in range(8):  # a chain of fine-tuning stages, each recording its base model
        if candidate is None or not candidate.is_dir():
            return None
        config = candidate / "config.json"
        architectures = json.loads(config.read_text()).get("architectures", []) if config.is_file() else []
        if any(name.endswith(("ForMaskedLM", "ForPreTraining")) for name in architectures):
            return candidate
        record = candidate / TRAINING_RECORD
        candidate = Path(json.loads(record.read_text())["base_model"]) if record.is_file() else None
    return None


def build_card(out: Path, source: Path, model_id: str, onnx_files: dict, scores: dict) -> dict:
    info = ModelInfo.read(out)
    record_path = out / TRAINING_RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    training = {
        k: record[k]
        for k in ("base_model", "data", "steps", "wall_time_s", "sts_dev", "guard")
        if k in record
    }  # guard: `cloze adapt`'s result check (held-out scores of the start and the blends, what it kept)
    if record:
        training["recipe"] = {k: v for k, v in record["recipe"].items() if k not in ("out", "data_dir")}
    return {
        "model_id": model_id,
        "source": str(source),
        "fingerprint": info.fingerprint,
        "pooling": info.pooling,
        "normalize": info.normalize,
        "max_tokens": info.max_tokens,
        "dimension": _dimension(out),
        "onnx": onnx_files,
        "training": training
        or NOT_MEASURED + " (no training.json: not fine-tuned by `cloze train finetune`)",
        "scores": scores or {"all": NOT_MEASURED + " (exported with --no-scores)"},
    }


def _dimension(out: Path) -> int | None:
    config = json.loads((out / "config.json").read_text())
    return config.get("hidden_size") or config.get("dim")


def guard_line(check: dict) -> str:
    """One line of the card for ``cloze adapt``'s result check."""
    if not check.get("decision"):
        return f"not run ({check.get('reason')})"
    return (
        f"on {check['held_out_pairs']} held-out pairs ({check['metric']}) the start scored "
        f"{check['start']['decision']}, the adapted blend {check['adapted']['decision']}; kept: "
        f"{check['decision']} (blend weight {check['alpha']})"
    )


def scores_section(card: dict) -> list[str]:
    """A card's provenance line and its scores as a table: the part every model card shares."""
    return [
        f"- fingerprint `{card['fingerprint']}`, exported from `{card['source']}`",
        "",
        "## Scores",
        "",
        "| measure | value |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in card["scores"].items()),
        "",
    ]


def render_readme(card: dict) -> str:
    training = card["training"]
    lines = [
        f"# {card['model_id']}",
        "",
        "Sentence encoder exported by `cloze export`: a sentence-transformers folder with ONNX fp32 and",
        "per-channel int8 files under `onnx/`, loadable by `cloze serve` and `encoder_runtime.load_encoder`.",
        "",
        f"- dimension {card['dimension']}, pooling `{card['pooling']}`, normalised: {card['normalize']}, "
        f"max tokens {card['max_tokens']}",
        *scores_section(card),
        "## Training",
        "",
    ]
    if isinstance(training, dict):
        recipe = training.get("recipe", {})
        lines += [
            f"- base model: `{training.get('base_model')}`",
            f"- loss `{recipe.get('loss')}`, batch {recipe.get('batch_size')}, lr {recipe.get('learning_rate')}, "
            f"pooling `{recipe.get('pooling')}`, matryoshka dims {recipe.get('matryoshka_dims') or 'none'}",
            f"- data (rows per source): {training.get('data')}",
            f"- steps {training.get('steps')}, wall time {training.get('wall_time_s')} s",
            f"- STS-B dev during training: {training.get('sts_dev')}",
        ]
        if isinstance(training.get("guard"), dict):
            lines.append(f"- adaptation check: {guard_line(training['guard'])}")
    else:
        lines.append(str(training))
    lines += ["", "Full details: `card.json`, `training.json`.", ""]
    return "\n".join(lines)
