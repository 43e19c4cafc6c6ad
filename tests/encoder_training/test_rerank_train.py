"""``cloze train reranker``: the mining guard, and the command's mechanics on a tiny BERT (a BEIR-shaped
folder in, a loadable CrossEncoder folder out, resume from a checkpoint).

Quality (does reranking beat hybrid search?) is measured by ``benchmarks/rerank.py``, not here.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from app.cli import main
from encoder_training.reranking.judged import JudgedQuery, Positive, read_beir, read_pairs
from encoder_training.reranking.mining import MiningSettings, mine_negatives, training_rows
from encoder_training.reranking.train import work_dir
from tests.conftest import TINY_WORDS


def _beir_folder(root: Path, documents: int = 40, queries: int = 12, seed: int = 0) -> Path:
    """Documents of random tiny-vocabulary words; each query is a few words of its one relevant document."""
    rng = random.Random(seed)
    (root / "qrels").mkdir(parents=True)
    texts = [" ".join(rng.choice(TINY_WORDS) for _ in range(12)) for _ in range(documents)]
    with (root / "corpus.jsonl").open("w") as handle:
        for number, text in enumerate(texts):
            handle.write(json.dumps({"_id": f"d{number}", "title": f"title {number}", "text": text}) + "\n")
    with (root / "queries.jsonl").open("w") as handle:
        for number in range(queries):
            handle.write(
                json.dumps({"_id": f"q{number}", "text": " ".join(texts[number].split()[:4])}) + "\n"
            )
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{n}\td{n}\t1" for n in range(queries)]
    (root / "qrels" / "train.tsv").write_text("\n".join(lines) + "\n")
    return root


class _FirstStage:
    """A stand-in index and encoder: fixed hybrid hits with dense scores, so the guard's arithmetic is exact."""

    def __init__(self, hits: list[tuple[str, str, float | None]], positive_score: float):
        self.hits, self.positive_score = hits, positive_score

    def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        return np.ones((len(texts), 1), dtype=np.float32) * (
            1.0 if texts[0].startswith("q") else self.positive_score
        )

    def search(self, vector, text, *, top_k, mode, explained):
        return [
            SimpleNamespace(id=i, text=t, explanation=SimpleNamespace(dense_score=s)) for i, t, s in self.hits
        ][:top_k]


def test_mining_excludes_positives_and_likely_false_negatives() -> None:
    query = JudgedQuery("q1", "q what causes rain", [Positive("rain comes from clouds", "pos")])
    stage = _FirstStage(
        [
            (
                "near",
                "clouds make rain",
                0.99,
            ),  # above 0.95 x the positive's 0.8 = 0.76: likely unjudged positive
            ("pos", "rain comes from clouds", 0.80),  # the judged positive, by id
            ("copy", "rain  comes from\nclouds", 0.80),  # the positive's text under another id
            ("hard", "rain in spain", 0.70),
            ("lexical", "what causes rust", None),  # BM25 only: no dense score, kept
            ("easy", "a recipe for soup", 0.20),
        ],
        positive_score=0.8,
    )
    settings = MiningSettings(num_negatives=2, range_max=10, relative_margin=0.05)
    mined, stats = mine_negatives([query], stage, stage, settings)  # type: ignore[arg-type]
    assert mined[0].negative_ids == ["hard", "lexical"]
    assert stats == {"candidates": 6, "positives": 2, "guarded": 1, "negatives": 2}
    unguarded, _ = mine_negatives([query], stage, stage, MiningSettings(2, 0, 10, 0.0))  # type: ignore[arg-type]
    assert unguarded[0].negative_ids == ["near", "hard"]
    skipped, _ = mine_negatives([query], stage, stage, MiningSettings(2, 4, 10, 0.05))  # type: ignore[arg-type]
    assert skipped[0].negative_ids == ["lexical", "easy"]  # range_min: the top 4 are never negatives
    rows = training_rows(mined, "bce", seed=0)
    assert sorted((r["passage"], r["label"]) for r in rows) == [
        ("rain comes from clouds", 1.0), ("rain in spain", 0.0), ("what causes rust", 0.0),
    ]  # fmt: skip
    (row,) = training_rows(mined, "mnrl", seed=0)
    assert row == {"query": query.text, "positive": "rain comes from clouds", "negative_1": "rain in spain",
                   "negative_2": "what causes rust"}  # fmt: skip


def test_judged_pairs_find_their_positives_in_the_corpus(tmp_path: Path) -> None:
    folder = _beir_folder(tmp_path / "beir")
    queries, corpus = read_beir(folder, "train")
    assert len(queries) == 12 and queries[0].positive_ids() == {"d0"}
    assert queries[0].positives[0].text.startswith("title 0\n\n")  # as the index stores it
    pairs = tmp_path / "pairs.jsonl"
    body = json.loads((folder / "corpus.jsonl").read_text().splitlines()[3])["text"]
    rows = [
        {"query": "first", "positive": f"title 3\n\n{body}"},  # matched by text
        {"query": "first", "positive": "not in the corpus"},
        {"query": "second", "positive": "anything", "positive_id": "d7"},
    ]
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    judged, _ = read_pairs(pairs, corpus, tmp_path / "work")
    assert [q.text for q in judged] == ["first", "second"]
    assert [p.doc_id for p in judged[0].positives] == ["d3", None] and judged[1].positive_ids() == {"d7"}
    alone, own_corpus = read_pairs(pairs, None, tmp_path / "work")
    assert own_corpus.is_file() and len(own_corpus.read_text().splitlines()) == 3
    assert all(p.doc_id for q in alone for p in q.positives)


def test_train_reranker_writes_a_cross_encoder_and_resumes(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = _beir_folder(tmp_path / "beir")
    out = tmp_path / "reranker"
    argv = [
        "train", "reranker", "--beir", str(folder), "--split", "train", "--out", str(out),
        "--model", str(tiny_bert), "--encoder", str(tiny_bert), "--backend", "torch",
        "--num-negatives", "3", "--relative-margin", "0", "--max-length", "48", "--batch-size", "4",
        "--max-time-minutes", "2", "--save-steps", "2", "--dev-queries", "2", "--dev-candidates", "5",
    ]  # fmt: skip
    # 2 steps of 4 rows are a fifth of an epoch of the 40 rows: refused before training, unless forced
    with pytest.raises(
        SystemExit, match=r"buys about 0.2 epochs of the 40 training rows.*too little to help"
    ):
        main([*argv, "--max-steps", "2"])
    assert not out.exists() and not (work_dir(out) / "checkpoints").exists()
    main([*argv, "--max-steps", "2", "--force"])
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["training"]["steps"] == 2 and first["training"]["resumed_from"] is None
    estimate = first["training"]["estimate"]
    assert estimate["steps"] == 2 and estimate["epochs"] == 0.2 and estimate["step_seconds"] > 0
    assert "likely too little" in estimate["warning"]
    record = json.loads((out / "training.json").read_text())
    assert record["data"]["train_queries"] == 10 and record["data"]["dev_queries"] == 2
    assert record["data"]["mining"]["negatives"] == 30  # 3 a query, none of them the judged positive
    assert record["rows"] == 10 + 30
    dev = record["dev"]
    assert dev["queries"] == 2 and 0.0 <= dev["reranked_ndcg@10"] <= 1.0
    assert "## Measured" in (out / "README.md").read_text()

    from sentence_transformers.cross_encoder import CrossEncoder

    model = CrossEncoder(str(out), local_files_only=True)
    pairs = [("cat sat", "the cat sat on the mat"), ("dog", "a dog plays music")]
    scores = model.predict(pairs)
    assert scores.shape == (2,) and np.isfinite(scores).all()
    assert np.allclose(scores, [model.predict([pair])[0] for pair in pairs], atol=1e-5)

    # a run killed after its step-2 checkpoint: the rerun continues from it, with the same mined rows
    shutil.rmtree(out)
    assert (work_dir(out) / "checkpoints" / "checkpoint-2").is_dir()
    main([*argv, "--max-steps", "4", "--force"])
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["training"]["steps"] == 4 and resumed["training"]["resumed_from"] == "checkpoint-2"
    assert CrossEncoder(str(out), local_files_only=True).predict(pairs).shape == (2,)
    # a finished folder is left as it is
    main([*argv, "--max-steps", "6", "--force"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["training"]["steps"] == 4


def test_a_reranker_that_loses_to_the_first_stage_on_dev_is_called_out(tmp_path: Path) -> None:
    from encoder_training.reranking.train import dev_warning, model_card

    worse = {"queries": 100, "candidates": 20, "first_stage_ndcg@10": 0.7433, "reranked_ndcg@10": 0.4053}
    better = worse | {"reranked_ndcg@10": 0.7612}
    tie = worse | {"reranked_ndcg@10": 0.7433}
    assert dev_warning(better) is None and dev_warning({}) is None
    for dev in (worse, tie):
        warning = dev_warning(dev)
        assert warning is not None and "0.7433" in warning and "does not beat the first stage" in warning
    record = {
        "recipe": {
            "beir": "beir", "pairs": None, "split": "train", "range_max": 30, "num_negatives": 4,
            "relative_margin": 0.05, "loss": "bce", "batch_size": 16, "learning_rate": 3e-5, "max_length": 256,
            "max_time_minutes": 60.0,
        },
        "base_model": "start", "base_fingerprint": "0" * 16, "rows": 10,
        "data": {
            "queries": 12, "train_queries": 10, "dev_queries": 2,
            "first_stage": {"encoder": "e", "backend": "torch"},
            "mining": {"positives": 1, "guarded": 2, "negatives": 3},
        },
        "training": {"steps": 5, "epochs": 1.0, "train_seconds": 9.0, "first_loss": 1.1, "final_loss": 1.0},
    }  # fmt: skip
    assert "Not an improvement" in model_card(tmp_path, record | {"dev": worse})
    assert "Not an improvement" not in model_card(tmp_path, record | {"dev": better})
