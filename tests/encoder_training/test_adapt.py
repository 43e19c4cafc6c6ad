"""``cloze adapt``: pairs the corpus makes, the stages' mechanics on a tiny BERT, resume, interpolation.

Quality (does adaptation beat the bundled model?) is measured by ``benchmarks/adapt.py``, not here.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from app.cli import main
from encoder_training.adaptation import corpus
from encoder_training.adaptation.corpus import Passage, make_pairs, read_passages, split_sentences
from encoder_training.adaptation.run import interpolate, work_dir
from tests.conftest import TINY_WORDS

SENTENCES = [
    "The cat sat on the mat in Paris.",
    "A dog was playing music with a guitar.",
    "The king read a long book on the river.",
    "The queen of France plays the guitar.",
]


def _corpus(path: Path, documents: int = 24, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as handle:
        for number in range(documents):
            sentences = [
                " ".join(rng.choice(TINY_WORDS) for _ in range(7)).capitalize() + "." for _ in range(4)
            ]
            title = " ".join(rng.choice(TINY_WORDS) for _ in range(4))
            handle.write(
                json.dumps({"_id": f"d{number}", "title": title, "text": " ".join(sentences)}) + "\n"
            )
    return path


def test_sentences_split_at_sentence_ends_only() -> None:
    text = "Mice (n = 12) were used. Results differ, e.g. in 3 cases. 5 of them died! Why?"
    assert split_sentences(text) == [
        "Mice (n = 12) were used.",
        "Results differ, e.g. in 3 cases.",
        "5 of them died!",
        "Why?",
    ]


def test_ict_pair_takes_one_sentence_out_of_its_passage() -> None:
    passage = Passage("p", "A title", " ".join(SENTENCES))
    pair = corpus.ict_pair(passage, random.Random(1), keep_sentence=0.0)
    assert pair is not None and pair["anchor"] in SENTENCES
    assert pair["anchor"] not in pair["positive"] and pair["positive"].startswith("A title\n\n")
    assert sum(s in pair["positive"] for s in SENTENCES) == 3
    kept = corpus.ict_pair(passage, random.Random(1), keep_sentence=1.0)
    assert kept is not None and kept["anchor"] in kept["positive"]
    assert corpus.ict_pair(Passage("q", "", " ".join(SENTENCES[:2])), random.Random(0), 0.0) is None


def test_title_pairs_without_titles_are_the_ict_pairs() -> None:
    """``--pair-kinds title`` falls back to inverse cloze on a corpus without titles (docs/adapt.md): then
    both options must make the very same pairs (same fallback, same random draws)."""
    untitled = [Passage(str(i), "", " ".join(SENTENCES[i % 4 :] + SENTENCES[: i % 4])) for i in range(12)]
    assert corpus.make_pairs(untitled, ["title"]) == corpus.make_pairs(untitled, ["ict"])
    titled = [Passage(p.id, f"Title {p.id}", p.body) for p in untitled]
    assert corpus.make_pairs(titled, ["title"]) != corpus.make_pairs(titled, ["ict"])


def test_title_and_crop_pairs() -> None:
    passage = Passage("p", "A title", " ".join(SENTENCES))
    assert corpus.title_pair(passage) == {"anchor": "A title", "positive": passage.body}
    assert corpus.title_pair(Passage("p", "", passage.body)) is None
    crop = corpus.crop_pair(passage, random.Random(0))
    assert crop is not None
    words = passage.text.split()
    for side in crop.values():
        span = side.split()
        assert len(span) >= corpus.MIN_SENTENCE_WORDS
        assert any(words[i : i + len(span)] == span for i in range(len(words)))


def test_at_most_one_pair_per_passage_per_round() -> None:
    passages = [
        Passage(str(i), f"title {i}", " ".join(f"{s[:-1]} number {i}." for s in SENTENCES)) for i in range(30)
    ]
    assert len(make_pairs(passages, ["ict", "title", "crop"], rounds=2, seed=3)) == 60
    pairs = make_pairs(passages, ["ict", "title"], rounds=2, seed=3)
    assert {"title 7"} < {p["anchor"] for p in pairs}  # both kinds were drawn
    for round_pairs in (pairs[:30], pairs[30:]):
        owners = [
            int(re.findall(r"(?:number|title) (\d+)", p["anchor"] + " " + p["positive"])[0])
            for p in round_pairs
        ]
        assert sorted(owners) == list(range(30))
    assert make_pairs(passages, ["ict"], seed=3) == make_pairs(passages, ["ict"], seed=3)
    with pytest.raises(ValueError, match="pair kinds"):
        make_pairs(passages, ["queries"])


def test_passages_keep_title_apart_from_body(tmp_path: Path) -> None:
    path = _corpus(tmp_path / "c.jsonl", documents=3)
    passages = read_passages(path)
    record = json.loads(path.read_text().splitlines()[0])
    assert passages[0] == Passage("d0", record["title"], record["text"])
    assert passages[0].text == f"{record['title']}\n\n{record['text']}"
    assert len(read_passages(path, limit=2)) == 2
    (tmp_path / "empty.jsonl").write_text('{"_id": "x", "text": ""}\n')
    with pytest.raises(ValueError, match="no text"):
        read_passages(tmp_path / "empty.jsonl")


def test_interpolation_is_linear_between_start_and_adapted(tiny_bert: Path) -> None:
    from sentence_transformers import SentenceTransformer

    start = SentenceTransformer(str(tiny_bert), device="cpu")
    key = "0.model.encoder.layer.0.attention.self.query.weight"
    base = start.state_dict()[key].clone()
    for weight, expected in ((0.0, base), (0.5, base + 0.5), (1.0, base + 1.0)):
        model = SentenceTransformer(str(tiny_bert), device="cpu")
        with torch.no_grad():
            model.state_dict()[key].add_(1.0)
        interpolate(model, tiny_bert, weight)
        assert torch.allclose(model.state_dict()[key], expected, atol=1e-6)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        interpolate(model, tiny_bert, 1.5)


def _layer0(folder: Path) -> dict[str, torch.Tensor]:
    weights = load_file(str(folder / "model.safetensors"))
    return {k.removeprefix("bert."): v for k, v in weights.items() if "encoder.layer.0." in k}


def test_adapt_cli_runs_both_stages_within_budget_and_resumes(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    corpus_path = _corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / "adapted"
    argv = [
        "adapt", "--model", str(tiny_bert), "--corpus", str(corpus_path), "--out", str(out),
        "--max-time-minutes", "0.6", "--mlm-block-size", "32", "--mlm-batch-size", "4",
        "--contrastive-batch-size", "4", "--max-seq-length", "48", "--interpolate", "1.0", "--keep-work",
    ]  # fmt: skip
    main(argv)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    stages = summary["stages"]
    assert stages["documents"] == 24
    # a fifth of the 24 pairs is held out for the result check, never trained on
    assert stages["mine"]["rows"] == stages["mine"]["pairs"] == 20 and stages["mine"]["negative_columns"] == 1
    assert stages["fit"]["kept"] == stages["fit"]["pairs"] == 20  # a tiny model embeds them all in its share
    assert summary["guard"]["held_out_pairs"] == 4 and stages["guard_start"]["score"]["ndcg@10"] > 0
    assert stages["mlm"]["head"] == "own" and stages["mlm"]["steps"] > 0
    assert stages["contrastive"]["steps"] > 0
    assert stages["contrastive"]["columns"] == ["anchor", "positive", "negative_1"]
    assert sum(summary["seconds_spent"].values()) <= 0.6 * 60 + 5  # the clock stops each stage
    # both stages moved the weights: MLM's encoder differs from the start, contrastive from MLM's
    start, mlm, final = _layer0(tiny_bert), _layer0(work_dir(out) / "mlm" / "model"), _layer0(out)
    assert any(not torch.equal(start[k], mlm[k]) for k in start)
    assert any(not torch.equal(mlm[k], final[k]) for k in mlm)
    from encoder_runtime import load_encoder

    vectors = load_encoder(str(out), backend="torch").embed(["the cat sat", "a dog plays"], normalize=True)
    assert vectors.shape == (2, 32)
    # ready for `cloze export`: the card describes the adaptation
    from encoder_training.export import export_model

    card = json.loads(
        (export_model(out, tmp_path / "exported", measure_scores=False) / "card.json").read_text()
    )
    assert card["training"]["data"]["documents"] == 24 and card["training"]["recipe"]["stages"] == [
        "mlm",
        "contrastive",
    ]
    # a second run finds every stage done and trains nothing again
    record = json.loads((out / "training.json").read_text())
    main(argv)
    again = json.loads((out / "training.json").read_text())
    assert again["stages"] == record["stages"] and again["wall_time_s"] < record["wall_time_s"]
    assert torch.equal(
        _layer0(out)["encoder.layer.0.attention.self.query.weight"],
        final["encoder.layer.0.attention.self.query.weight"],
    )


def test_adapt_cli_rejects_bad_input(tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(
            [
                "adapt",
                "--model",
                str(tiny_bert),
                "--corpus",
                str(tmp_path / "missing.jsonl"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
    corpus_path = _corpus(tmp_path / "c.jsonl", documents=4)
    with pytest.raises(SystemExit):
        main(["adapt", "--corpus", str(corpus_path), "--out", str(tmp_path / "o"), "--stages", "distill"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["adapt", "--corpus", str(corpus_path), "--out", str(tmp_path / "o"), "--distill-weight", "-1"])
    assert "--distill-weight must be zero (off) or positive" in capsys.readouterr().err


def test_an_index_folder_gives_the_same_passages_as_its_corpus(tiny_bert: Path, tmp_path: Path) -> None:
    from encoder_runtime import load_encoder
    from index.build.builder import BuildOptions, build_from_input

    corpus_path = _corpus(tmp_path / "c.jsonl", documents=6)
    encoder = load_encoder(str(tiny_bert), backend="torch")
    build_from_input(tmp_path / "index", corpus_path, encoder, BuildOptions(show_progress=False))
    assert read_passages(tmp_path / "index") == read_passages(corpus_path)


class SlowEncoder:
    """Embeds at a fixed cost a text per window token, as a slow machine would."""

    def __init__(self, seconds_per_token: float):
        self.seconds_per_token = seconds_per_token
        self.max_seq_length = 128
        self.windows: list[int] = []

    def encode(self, texts, **_) -> np.ndarray:
        import time

        self.windows.append(self.max_seq_length)
        time.sleep(len(texts) * self.max_seq_length * self.seconds_per_token)
        return np.zeros((len(texts), 4), np.float32)


def test_mining_and_targets_are_sized_to_their_share_of_the_budget(caplog: pytest.LogCaptureFixture) -> None:
    from encoder_training.adaptation.contrastive import fit_estimate, sample_pairs
    from encoder_training.adaptation.recipe import AdaptConfig

    pairs = [{"anchor": f"a{i}", "positive": f"p{i}"} for i in range(1000)]
    config = AdaptConfig(mine_max_seq_length=128, max_seq_length=256, contrastive_batch_size=8)
    model = SlowEncoder(seconds_per_token=1e-5)  # a pair: 2 texts x (128 + 256) tokens = 7.68 ms
    with caplog.at_level(logging.WARNING):
        record = fit_estimate(model, pairs, config, seconds=1.5, with_targets=True)
    assert set(model.windows) == {128, 256} and model.max_seq_length == 128  # both timed, window restored
    assert record["pairs"] == 1000 and 100 <= record["kept"] <= 195  # 1.5 s / 7.68 ms, less any overhead
    assert record["estimate_seconds"] >= 7.6 and "raise --max-time-minutes" in caplog.text
    kept = sample_pairs(pairs, record["kept"], seed=1)
    # the same pairs on a resume, in their order
    assert len(kept) == record["kept"] and kept == sample_pairs(pairs, record["kept"], seed=1)
    positions = [pairs.index(pair) for pair in kept]
    assert positions == sorted(positions)
    # time to spare: every pair; no targets to embed: the mining window alone is timed
    model.windows.clear()
    ample = fit_estimate(model, pairs, config, seconds=60, with_targets=False)
    assert ample["kept"] == 1000 and set(model.windows) == {128}
    assert sample_pairs(pairs, ample["kept"], seed=1) is pairs
    # never fewer than two contrastive batches, however slow the machine
    assert fit_estimate(model, pairs, config, seconds=0.0, with_targets=True)["kept"] == 16


def test_pairs_without_a_mined_negative_get_a_random_passage(tmp_path: Path) -> None:
    from datasets import Dataset

    from encoder_training.adaptation.contrastive import fill_unmined

    pairs = [{"anchor": f"a{i}", "positive": f"p{i}"} for i in range(10)]
    mined = Dataset.from_list([{"anchor": "a0", "positive": "p0", "negative_1": "p5"}])
    rows = fill_unmined(pairs, mined, num_negatives=1, seed=0).to_list()
    assert sorted(r["anchor"] for r in rows) == sorted(p["anchor"] for p in pairs)
    assert next(r for r in rows if r["anchor"] == "a0")["negative_1"] == "p5"
    assert all(r["negative_1"] != r["positive"] and r["negative_1"].startswith("p") for r in rows)


def test_distillation_term_is_the_squared_distance_from_the_starting_embeddings(tiny_bert: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from encoder_training.adaptation.contrastive import DistilledRankingLoss

    model = SentenceTransformer(str(tiny_bert), device="cpu")
    model.eval()  # no dropout: the two losses see the same embeddings
    columns = [SENTENCES[:2], SENTENCES[2:]]
    features = [model.tokenize(texts) for texts in columns]
    with torch.no_grad():
        own = torch.stack([model(dict(f))["sentence_embedding"] for f in features], dim=1)
        rows = torch.tensor([0, 1])
        ranking = MultipleNegativesRankingLoss(model)([dict(f) for f in features], rows)
        same = DistilledRankingLoss(model, own, weight=3.0)([dict(f) for f in features], rows)
        shifted = DistilledRankingLoss(model, own + 0.5, weight=3.0)([dict(f) for f in features], rows)
    dim = own.shape[-1]
    assert same == pytest.approx(float(ranking), abs=1e-5)  # at the teacher: MNRL alone
    assert shifted == pytest.approx(float(ranking) + 3.0 * 0.25 * dim, rel=1e-4)


def test_adapt_with_distillation_embeds_the_training_texts_once_and_keeps_closer_to_the_start(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from sentence_transformers import SentenceTransformer

    corpus_path = _corpus(tmp_path / "corpus.jsonl")
    start = SentenceTransformer(str(tiny_bert), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    drift = {}
    for weight in ("0", "50"):
        out = tmp_path / f"adapted-{weight}"
        argv = [
            "adapt", "--model", str(tiny_bert), "--corpus", str(corpus_path), "--out", str(out),
            "--stages", "contrastive", "--max-time-minutes", "5", "--max-steps-per-stage", "20", "--contrastive-batch-size", "4",
            "--max-seq-length", "48", "--interpolate", "1.0", "--contrastive-learning-rate", "1e-3",
            "--distill-weight", weight, "--seed", "1", "--guard-pairs", "0",  # the training's drift, unchecked
        ]  # fmt: skip
        main(argv)
        stages = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stages"]
        assert stages["contrastive"]["steps"] > 5
        assert stages["contrastive"]["columns"] == ["anchor", "positive", "negative_1"]
        if weight == "0":
            assert "teacher" not in stages
        else:
            assert stages["teacher"]["rows"] == 24 and stages["teacher"]["columns"] == 3
        moved = SentenceTransformer(str(out), device="cpu").encode(SENTENCES, convert_to_tensor=True)
        drift[weight] = float((moved - start).pow(2).sum(-1).mean())
    assert drift["50"] < drift["0"] / 2, drift


def test_the_teachers_bm25_is_the_products(tmp_path: Path, shared_data: Path) -> None:
    from encoder_training.adaptation.lexical_teacher import Bm25Matrix
    from index.storage.lexical import LexicalIndex
    from index.storage.store import DocumentStore
    from tests.index.test_lexical import as_item, scifact_documents

    documents = scifact_documents(shared_data, 300)
    store = DocumentStore(tmp_path / "documents.sqlite")
    with store.transaction() as conn:
        store.write_documents(conn, [as_item(d) for d in documents], log=True)
    product = LexicalIndex()
    product.build(store)
    store.close()
    bm25 = Bm25Matrix([d.text for d in documents])
    queries = [d.text.split(".")[0] for d in documents[::30]]  # each document's first sentence
    ours = (bm25.anchors(queries) @ bm25.passages.T).toarray()
    worst = 0.0
    for query, row in zip(queries, ours, strict=True):
        expected = dict(product.search(query, len(documents)))
        assert expected, query
        got = {documents[j].id: row[j] for j in row.nonzero()[0]}
        assert got.keys() == expected.keys()
        # The formula and constants are the same; tantivy keeps each document's length in one byte (exact to
        # 40 words, within 6% above), which moves the scores of longer documents by up to 4.5% here.
        assert [got[d] for d in expected] == pytest.approx(list(expected.values()), rel=0.05)
        worst = max(worst, max(abs(got[d] / s - 1) for d, s in expected.items()))
    assert worst > 1e-4  # the lengths' rounding is there to tolerate (or this test could be exact again)


def _teacher_rows():
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "anchor": "zebra stripes",
                "positive": "zebra stripes grow",
                "negative_1": "lions hunt at night",
            },
            {
                "anchor": "lions at night",
                "positive": "lions hunt at night",
                "negative_1": "zebra stripes grow",
            },
            {
                "anchor": "red tulips",
                "positive": "tulips are red flowers",
                "negative_1": "lions hunt at night",
            },
        ]
    )


def test_lexical_teacher_scores_follow_mnrl_candidate_order() -> None:
    from encoder_training.adaptation.lexical_teacher import LexicalTeacher

    teacher = LexicalTeacher(_teacher_rows(), ["anchor", "positive", "negative_1"])
    scores = teacher.scores(np.array([2, 0]))
    # candidates: positives of rows 2 and 0, then their negatives: tulips, zebra, lions, lions
    assert scores.shape == (2, 4)
    assert scores[0].tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])  # "red tulips": its own positive only
    assert scores[1, 1] == pytest.approx(1.0) and scores[1, [0, 2, 3]].tolist() == [0.0, 0.0, 0.0]
    assert float(teacher.scores(np.array([1]))[0, 0]) == pytest.approx(1.0)  # scores over the anchor's best


def test_hybrid_ranking_is_kl_zero_at_the_teacher_and_one_hot_where_bm25_dominates(tiny_bert: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from encoder_training.adaptation.contrastive import DistilledRankingLoss
    from encoder_training.adaptation.lexical_teacher import LexicalTeacher

    rows = _teacher_rows()
    columns = ["anchor", "positive", "negative_1"]
    model = SentenceTransformer(str(tiny_bert), device="cpu")
    model.eval()
    lexical = LexicalTeacher(rows, columns)

    def losses(labels: list[int], lexical_weight: float) -> tuple[float, float, float]:
        features = [model.tokenize([rows[i][c] for i in labels]) for c in columns]
        with torch.no_grad():
            own = torch.stack([model(dict(f))["sentence_embedding"] for f in features], dim=1)
            teacher = torch.zeros(len(rows), *own.shape[1:])
            teacher[labels] = own
            hybrid = DistilledRankingLoss(model, teacher, 0.0, lexical, lexical_weight)
            mnrl = MultipleNegativesRankingLoss(model)([dict(f) for f in features], torch.tensor(labels))
            candidates = torch.nn.functional.normalize(
                own[:, 1:].transpose(0, 1).reshape(-1, own.shape[-1]), dim=-1
            )
            logits = 20 * torch.nn.functional.normalize(own[:, 0], dim=-1) @ candidates.T
            entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
            loss = hybrid([dict(f) for f in features], torch.tensor(labels))
        return float(loss), float(entropy), float(mnrl)

    loss, entropy, _ = losses([0, 1, 2], 0.0)
    assert loss == pytest.approx(entropy, rel=1e-4)  # the student is the teacher: KL 0
    # "zebra stripes" and "red tulips" share words with their own positives only, so with BM25 weighing 5
    # cosines the target is MNRL's one-hot
    loss, entropy, mnrl = losses([0, 2], 5.0)
    assert loss == pytest.approx(mnrl, abs=1e-3) and abs(mnrl - entropy) > 0.05


def test_adapt_with_the_lexical_teacher(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out, corpus_path = tmp_path / "adapted", _corpus(tmp_path / "corpus.jsonl")
    argv = [
        "adapt", "--model", str(tiny_bert), "--corpus", str(corpus_path), "--out", str(out),
        "--stages", "contrastive", "--max-time-minutes", "0.25", "--contrastive-batch-size", "4",
        "--max-seq-length", "48", "--guard-pairs", "0", "--distill-weight", "0", "--lexical-teacher-weight", "0.3",
    ]  # fmt: skip
    main(argv)
    stages = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stages"]
    assert stages["teacher"]["rows"] == 24 and stages["contrastive"]["steps"] > 2
    recipe = json.loads((out / "training.json").read_text())["recipe"]
    assert recipe["lexical_teacher_weight"] == 0.3
    with pytest.raises(SystemExit):
        main(argv[:-1] + ["-1"])
    assert "--lexical-teacher-weight must be zero (off) or positive" in capsys.readouterr().err


def _masked_batch(tiny_bert: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """SENTENCES tokenised, their third token masked and labelled: (clean, masked, attention mask, labels)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    clean, mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.full_like(clean, -100)
    labels[:, 2] = clean[:, 2]
    masked = clean.clone()
    masked[:, 2] = tokenizer.mask_token_id
    return clean, masked, mask, labels


def _mean_pooled(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean pooling by hand: what sentence-transformers makes of a plain Hugging Face folder (tiny_bert)."""
    weights = mask[..., None].float()
    return (states * weights).sum(1) / weights.sum(1)


def test_guarded_mlm_adds_the_weighted_distance_from_the_starting_embedding(tiny_bert: Path) -> None:
    from encoder_training.adaptation.mlm import GuardedMaskedLM, embedding_head, load_mlm

    mlm, _ = load_mlm(tiny_bert)
    mlm.eval()  # no dropout: every loss below sees the same states
    head = embedding_head(tiny_bert)
    clean, masked, mask, labels = _masked_batch(tiny_bert)
    with torch.no_grad():
        plain = float(mlm(input_ids=masked, attention_mask=mask, labels=labels).loss)
        unguarded = float(GuardedMaskedLM(mlm, 0.0, head)(masked, mask, labels=labels).loss)
        student = _mean_pooled(mlm.bert(input_ids=masked, attention_mask=mask).last_hidden_state, mask)
        start = _mean_pooled(mlm.bert(input_ids=clean, attention_mask=mask).last_hidden_state, mask)
    distance = float((student - start).pow(2).sum(-1).mean())
    assert distance > 1e-4  # a masked block embeds elsewhere than its clean self
    assert unguarded == pytest.approx(plain, abs=1e-5)  # the sparse MLM loss, computed densely
    guard = GuardedMaskedLM(mlm, 3.0, head)
    output = guard(masked, mask, labels=labels)
    assert float(output.loss) == pytest.approx(plain + 3.0 * distance, rel=1e-5)
    assert guard.last_metrics["distance"] == pytest.approx(distance, rel=1e-5)
    # the frozen start is neither saved nor trained: one step moves the student only
    assert all(key.startswith("mlm.") for key in guard.state_dict())
    key = "encoder.layer.0.attention.self.query.weight"
    before = mlm.bert.state_dict()[key].clone()
    output.loss.backward()
    torch.optim.SGD(guard.parameters(), lr=1.0).step()
    assert not torch.equal(mlm.bert.state_dict()[key], before)
    assert torch.equal(guard.teacher.state_dict()[key], before)
    # the Trainer's .to() / dtype casts reach the frozen parts too (they are not submodules)
    guard.double()
    assert next(guard.teacher.parameters()).dtype == torch.float64
    assert float(guard(masked, mask, labels=labels).loss) > 0


def test_guarded_mlm_stage_drifts_less_than_plain_mlm(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from sentence_transformers import SentenceTransformer

    corpus_path = _corpus(tmp_path / "corpus.jsonl")
    start = SentenceTransformer(str(tiny_bert), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    drift, records = {}, {}
    for weight in ("0", "50"):
        out = tmp_path / f"adapted-{weight}"
        argv = [
            "adapt", "--model", str(tiny_bert), "--corpus", str(corpus_path), "--out", str(out),
            "--stages", "mlm", "--max-time-minutes", "5", "--max-steps-per-stage", "20", "--mlm-block-size", "32", "--mlm-batch-size", "4",
            "--mlm-learning-rate", "1e-3", "--mlm-distill-weight", weight, "--interpolate", "1.0",
            "--seed", "1", "--keep-work", "--guard-pairs", "0",  # the training's drift, unchecked
        ]  # fmt: skip
        main(argv)
        records[weight] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stages"]["mlm"]
        assert records[weight]["steps"] > 5 and records[weight]["distill_weight"] == float(weight)
        moved = SentenceTransformer(str(out), device="cpu").encode(SENTENCES, convert_to_tensor=True)
        drift[weight] = float((moved - start).pow(2).sum(-1).mean())
    assert drift["50"] < drift["0"] / 2, drift


def test_guarded_mlm_checkpoint_saves_its_tied_weights_and_resumes(
    tiny_bert: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers import AutoTokenizer, TrainerCallback, TrainingArguments

    from encoder_training.adaptation.mlm import GuardedMaskedLM, embedding_head, load_mlm
    from encoder_training.masking import MaskingConfig
    from encoder_training.pretraining.data import BlockDataset, MaskingCollator, pack_blocks
    from encoder_training.pretraining.train import PretrainTrainer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    texts = SENTENCES * 8
    blocks = BlockDataset(pack_blocks(tokenizer, texts, 16))

    def trainer(steps: int) -> PretrainTrainer:
        mlm, _ = load_mlm(tiny_bert)
        args = TrainingArguments(
            output_dir=str(tmp_path / "checkpoints"), max_steps=steps, per_device_train_batch_size=2,
            save_steps=3, logging_steps=1, report_to="none", remove_unused_columns=False, use_cpu=True,
        )  # fmt: skip
        collator = MaskingCollator.for_tokenizer(tokenizer, MaskingConfig(), mlm.config.vocab_size, texts)
        guard = GuardedMaskedLM(mlm, 5.0, embedding_head(tiny_bert))
        return PretrainTrainer(model=guard, args=args, train_dataset=blocks, data_collator=collator)

    first = trainer(3)
    first.train()
    saved = {k: v.clone() for k, v in first.model.mlm.bert.state_dict().items()}
    checkpoint = tmp_path / "checkpoints" / "checkpoint-3"
    assert (checkpoint / "model.safetensors").is_file()
    assert all(key.startswith("mlm.") for key in load_file(str(checkpoint / "model.safetensors")))
    second = trainer(4)
    assert any(not torch.equal(saved[k], v) for k, v in second.model.mlm.bert.state_dict().items())
    loaded = {}

    class Loaded(TrainerCallback):  # training begins after the checkpoint is loaded
        def on_train_begin(self, args, state, control, **kwargs):
            loaded.update({k: v.clone() for k, v in second.model.mlm.bert.state_dict().items()})

    second.add_callback(Loaded())
    with caplog.at_level(logging.WARNING):
        second.train(resume_from_checkpoint=str(checkpoint))
    assert second.state.global_step == 4
    assert loaded and all(torch.equal(value, saved[key]) for key, value in loaded.items())
    mlm = second.model.mlm
    assert mlm.cls.predictions.decoder.weight is mlm.bert.embeddings.word_embeddings.weight  # still tied
    assert "missing keys" not in caplog.text


def test_guard_embeds_blocks_as_the_starting_sentence_encoder_does(bundled_path: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from encoder_training.adaptation.mlm import GuardedMaskedLM, embedding_head, load_mlm, transformer_folder

    mlm, head = load_mlm(bundled_path)
    guard = GuardedMaskedLM(mlm.eval(), 1.0, embedding_head(bundled_path))
    batch = AutoTokenizer.from_pretrained(str(transformer_folder(bundled_path)))(
        SENTENCES, padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        states = guard.teacher(**batch).last_hidden_state
        vectors = guard.embed(states, batch["attention_mask"])
    expected = SentenceTransformer(str(bundled_path), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    assert head == "fill-mask-delta"
    assert torch.allclose(vectors, expected, atol=1e-5)  # its Pooling and Normalize modules, not a copy
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5)


# --- the result check (adaptation.guard) and the cross-encoder teacher ---------------------------------------


def test_held_out_pairs_are_a_fifth_at_most_and_never_trained_on() -> None:
    from encoder_training.adaptation.guard import hold_out

    pairs = [{"anchor": f"a{i}", "positive": f"p{i}"} for i in range(30)]
    train, held = hold_out(pairs, 100, seed=0)
    assert held is not None and len(held.queries) == 6 and len(train) == 24
    assert not {p["anchor"] for p in train} & set(held.queries)
    assert [f"p{q[1:]}" for q in held.queries] == held.passages  # each anchor with its own positive
    assert hold_out(pairs, 100, seed=0)[1] == held  # the same slice on a resume
    assert hold_out(pairs[:10], 100, seed=0) == (pairs[:10], None)  # two pairs rank nothing: no check


def test_held_out_scores_count_ties_against_the_encoder() -> None:
    from encoder_training.adaptation.guard import graded_ndcg, pair_scores

    perfect = pair_scores(torch.eye(4))
    assert perfect == {"ndcg@10": 1.0, "mrr@10": 1.0}
    collapsed = pair_scores(torch.ones(4, 4))  # every passage ties with the positive: ranked last
    assert collapsed["mrr@10"] == pytest.approx(0.25) and collapsed["ndcg@10"] == pytest.approx(
        1 / np.log2(5)
    )
    assert graded_ndcg([0.9, 0.1, 0.5], [1.0, 0.0, 0.5]) == pytest.approx(1.0)
    assert graded_ndcg([0.1, 0.9, 0.5], [1.0, 0.0, 0.5]) < 0.8
    assert graded_ndcg([0.5, 0.5], [1.0, 0.0]) < 1.0  # a tie is ranked worst-first


def _topical_corpus(path: Path, documents: int = 40) -> Path:
    """Each document's sentences drawn from its own six words, so a sentence and the rest of its passage
    share words: inverse cloze then has something to teach (``_corpus``'s sentences share nothing)."""
    rng = random.Random(0)
    with path.open("w") as handle:
        for number in range(documents):
            words = rng.sample(TINY_WORDS, 6)
            sentences = [" ".join(rng.choice(words) for _ in range(7)).capitalize() + "." for _ in range(4)]
            handle.write(json.dumps({"_id": f"d{number}", "text": " ".join(sentences)}) + "\n")
    return path


def _adapt_checked(tiny: Path, tmp_path: Path, name: str, learning_rate: str, *extra: str) -> dict:
    """A short contrastive-only run with the check on eight held-out pairs; returns training.json."""
    corpus_path = _topical_corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / name
    main([
        "adapt", "--model", str(tiny), "--corpus", str(corpus_path), "--out", str(out), "--stages", "contrastive",
        "--max-time-minutes", "5", "--max-steps-per-stage", "20", "--contrastive-batch-size", "4",
        "--max-seq-length", "48", "--contrastive-learning-rate", learning_rate, "--distill-weight", "0",
        "--guard-pairs", "8", "--interpolate", "1.0", "--seed", "1", *extra,
    ])  # fmt: skip
    return json.loads((out / "training.json").read_text())


def test_the_check_keeps_the_starting_weights_when_adaptation_harms_retrieval(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    record = _adapt_checked(tiny_bert, tmp_path, "harmed", "10")  # a learning rate that wrecks the encoder
    check = record["guard"]
    assert check["held_out_pairs"] == 8 and record["data"]["pairs"] == 32
    assert check["adapted"]["ndcg@10"] < check["start"]["ndcg@10"]
    assert [b["alpha"] for b in check["blends"]] == [0.5, 0.1]  # the other blends were tried, none won
    assert all(b["decision"] <= check["start"]["decision"] for b in check["blends"])
    assert check["decision"] == "start" and check["alpha"] == 0.0
    err = capsys.readouterr().err
    assert "does NOT beat the starting one" in err and "the starting weights are kept" in err
    from encoder_runtime.model_dir import fingerprint

    # exactly the starting encoder, file for file: an index built with the start still matches it
    assert fingerprint(tmp_path / "harmed") == fingerprint(tiny_bert)
    from encoder_training.export import build_card, render_readme  # what `cloze export` writes

    card = build_card(tmp_path / "harmed", tmp_path / "harmed", "harmed", {}, {})
    assert card["training"]["guard"]["decision"] == "start"
    assert card["training"]["guard"]["start"] == check["start"]
    assert "adaptation check: on 8 held-out pairs (ndcg@10) the start scored" in render_readme(card)


def _blurred(tiny_bert: Path, out: Path) -> Path:
    """``tiny_bert`` with every word embedding nearly the same: a start that tells passages apart poorly."""
    shutil.copytree(tiny_bert, out)
    weights = load_file(str(out / "model.safetensors"))
    key = next(k for k in weights if k.endswith("word_embeddings.weight"))
    noise = torch.randn(weights[key].shape, generator=torch.Generator().manual_seed(0))
    weights[key] = weights[key][:1].repeat(weights[key].shape[0], 1) + 0.01 * noise
    save_file(weights, str(out / "model.safetensors"))
    return out


def test_the_check_keeps_an_adapted_encoder_that_beats_the_start(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    start = _blurred(tiny_bert, tmp_path / "blurred")
    record = _adapt_checked(start, tmp_path, "helped", "1e-2")
    check = record["guard"]
    assert check["adapted"]["ndcg@10"] > check["start"]["ndcg@10"]
    assert check["decision"] == "adapted" and check["alpha"] == 1.0 and check["blends"] == []
    assert "beats the start and is kept" in capsys.readouterr().err
    before, after = _layer0(start), _layer0(tmp_path / "helped")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def _tiny_cross_encoder(tiny_bert: Path, out: Path) -> Path:
    from sentence_transformers import CrossEncoder

    CrossEncoder(str(tiny_bert), num_labels=1, device="cpu").save(str(out))  # random head: mechanics only
    return out


def test_teacher_margins_are_the_cross_encoders_positive_minus_negative(
    tiny_bert: Path, tmp_path: Path
) -> None:
    from sentence_transformers import CrossEncoder

    from encoder_training.adaptation.cross_teacher import load_teacher, score_rows

    folder = _tiny_cross_encoder(tiny_bert, tmp_path / "ce")
    rows = _teacher_rows()
    scored = score_rows(load_teacher(folder, 48), rows, 60.0, tmp_path / "work")
    direct = CrossEncoder(str(folder), device="cpu")
    for row in scored:
        positive, negative = direct.predict(
            [(row["anchor"], row["positive"]), (row["anchor"], row["negative_1"])]
        )
        assert 0.0 <= positive <= 1.0  # probabilities: margins on the cosine's scale
        assert row["label"] == pytest.approx([positive - negative], abs=1e-5)
    assert len(scored) == 3 and (tmp_path / "work" / "teacher_margins.jsonl").is_file()
    again = score_rows(None, rows, 0.0, tmp_path / "work")  # a resume reads the cache, scores nothing
    assert again["label"] == scored["label"]


def test_adapt_with_a_cross_encoder_teacher(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    teacher = _tiny_cross_encoder(tiny_bert, tmp_path / "ce")
    for mode, losses in (
        ("beside", {"corpus": "MultipleNegativesRankingLoss", "teacher": "MarginMSELoss"}),
        ("instead", {"teacher": "MarginMSELoss"}),
    ):
        record = _adapt_checked(
            tiny_bert, tmp_path, mode, "1e-3", "--teacher", str(teacher), "--teacher-mode", mode
        )
        stages = record["stages"]
        assert stages["contrastive"]["losses"] == losses and stages["contrastive"]["steps"] == 20
        assert stages["cross_teacher"]["rows"] == stages["cross_teacher"]["of_rows"] == 32
        check = record["guard"]
        assert check["metric"] == "mean of ndcg@10 and teacher_ndcg@10"  # the teacher's grades join the check
        for entry in (check["start"], check["adapted"]):
            assert entry["decision"] == pytest.approx(
                (entry["ndcg@10"] + entry["teacher_ndcg@10"]) / 2, abs=1e-4
            )
        assert record["recipe"]["teacher"] == str(teacher)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["adapt", "--corpus", str(tmp_path / "corpus.jsonl"), "--out", str(tmp_path / "x"),
              "--teacher", str(teacher), "--teacher-mode", "alone"])  # fmt: skip
    assert "--teacher-mode must be one of beside, instead" in capsys.readouterr().err
