"""MicroBatcher: concurrent callers get exactly their own answers, batches share passes, the queue is bounded."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from encoder_runtime import MicroBatcher, Overloaded
from tests.conftest import sts_sentences


def test_concurrent_callers_get_the_same_vectors_as_offline(bundled_torch, shared_data):
    texts = sts_sentences(shared_data, 64)
    passes: list[int] = []

    async def scenario() -> list[np.ndarray]:
        batcher = MicroBatcher.for_runtime(
            bundled_torch,
            max_wait_ms=5,
            on_batch=lambda n, tokens: passes.append(n),
        )
        results = await asyncio.gather(*(batcher.submit([text]) for text in texts))
        await batcher.stop()
        return [bundled_torch.finish(vectors)[0] for _, vectors in results]

    concurrent = np.vstack(asyncio.run(scenario()))
    np.testing.assert_allclose(concurrent, bundled_torch.embed(texts), atol=2e-5)
    assert len(passes) < len(texts) / 4, f"64 concurrent callers took {len(passes)} forward passes"


def test_batches_stay_within_the_token_budget(bundled_torch, shared_data):
    texts = sts_sentences(shared_data, 48)
    seen: list[int] = []

    async def scenario() -> None:
        batcher = MicroBatcher(
            bundled_torch.encode,
            bundled_torch.run,
            max_batch_tokens=128,
            on_batch=lambda n, t: seen.append(t),
        )
        await asyncio.gather(*(batcher.submit([text]) for text in texts))
        await batcher.stop()

    asyncio.run(scenario())
    assert seen and max(seen) <= 128


def test_full_queue_answers_overloaded_instead_of_growing():
    release = threading.Event()

    def slow_run(items):
        release.wait(5)
        return [len(item) for item in items]

    def encode(texts):
        from encoder_runtime.tokenization import Encoded

        return [Encoded((1, 2, 3), False) for _ in texts]

    async def scenario() -> tuple[list, Overloaded]:
        batcher = MicroBatcher(encode, slow_run, max_queue=4, max_wait_ms=0)
        first = asyncio.ensure_future(batcher.submit(["a", "b", "c"]))
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded) as refused:
            await batcher.submit(["d", "e"])
        release.set()
        answered = await first
        await batcher.stop()
        return answered[1], refused.value

    answered, refused = asyncio.run(scenario())
    assert answered == [3, 3, 3]
    assert refused.retry_after > 0 and "busy" in str(refused)


def test_a_failing_forward_pass_fails_its_requests_not_the_worker():
    from encoder_runtime.tokenization import Encoded

    calls = {"n": 0}

    def flaky(items):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return [0 for _ in items]

    async def scenario():
        batcher = MicroBatcher(lambda texts: [Encoded((1,), False) for _ in texts], flaky, max_wait_ms=0)
        with pytest.raises(RuntimeError, match="boom"):
            await batcher.submit(["x"])
        _, out = await batcher.submit(["y"])
        await batcher.stop()
        return out

    assert asyncio.run(scenario()) == [0]


class _TimedPasses:
    """A forward pass that takes ``seconds`` and answers each item with ``answer(item)``; it records the most
    passes that ran at once."""

    def __init__(self, answer, seconds: float):
        self.answer, self.seconds = answer, seconds
        self.running = self.most = 0
        self._lock = threading.Lock()

    def __call__(self, items):
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        threading.Event().wait(self.seconds)
        with self._lock:
            self.running -= 1
        return [self.answer(item) for item in items]


@pytest.mark.parametrize("parallel_passes", [1, 2])
def test_passes_in_flight_never_exceed_what_the_backend_runs_well(parallel_passes: int):
    """With ``parallel_passes`` 2 a second pass starts while the first runs (one per core for ONNX Runtime
    on a CPU); with 1 never. Every caller still gets its own answer."""
    from encoder_runtime.tokenization import Encoded

    run = _TimedPasses(lambda item: item.ids[0], 0.05)

    async def scenario() -> list:
        batcher = MicroBatcher(
            lambda texts: [Encoded((int(t),), False) for t in texts],
            run,
            max_wait_ms=0,
            parallel_passes=parallel_passes,
        )

        async def caller(number: int) -> int:
            await asyncio.sleep(0.01 * (number % 4))  # arrivals spread over the first pass
            return (await batcher.submit([str(number)]))[1][0]

        answers = await asyncio.gather(*(caller(n) for n in range(16)))
        await batcher.stop()
        return answers

    assert asyncio.run(scenario()) == list(range(16))
    assert run.most == parallel_passes


def test_what_one_pass_leaves_behind_goes_to_a_free_thread_at_once():
    """One request whose texts can't share a batch (lengths 1 and 8, no padding allowed) runs as two passes
    side by side, not one after the other: the thread that takes the first wakes another for the rest."""
    from encoder_runtime.tokenization import Encoded

    run = _TimedPasses(len, 0.1)

    async def scenario() -> list:
        batcher = MicroBatcher(
            lambda texts: [Encoded((7,) * len(text), False) for text in texts],
            run,
            parallel_passes=2,
            max_padding=0.0,
        )
        _, answers = await batcher.submit(["a", "abcdefgh"])
        await batcher.stop()
        return answers

    assert asyncio.run(scenario()) == [1, 8]
    assert run.most == 2


def test_concurrent_requests_share_tokenizer_calls_and_a_refused_text_fails_only_its_request():
    """Requests that arrive while the tokenizer is busy are tokenised together (one thread hop, not one
    each); a text the tokenizer refuses fails its own request, and its neighbours are still answered."""
    from encoder_runtime.tokenization import Encoded

    calls: list[list[str]] = []

    def encode(texts):
        calls.append(list(texts))
        threading.Event().wait(0.02)
        if "bad" in texts:
            raise ValueError("refused")
        return [Encoded((len(text),), False) for text in texts]

    async def scenario():
        batcher = MicroBatcher(
            encode, lambda items: [item.ids[0] for item in items], max_wait_ms=0, inline_chars=0
        )  # every request through the tokenizer thread

        async def wave(requests, delay):
            await asyncio.sleep(delay)
            return await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)

        good = [["a"], ["bb", "ccc"]] + [["e" * n] for n in range(5, 15)]
        mixed = [["x"], ["bad"], ["yy"]]
        waves = [[good[0]], good[1:], mixed]
        answers = await asyncio.gather(wave(waves[0], 0), wave(waves[1], 0.005), wave(waves[2], 0.1))
        await batcher.stop()
        return [r for w in waves for r in w], [a for w in answers for a in w]

    requests, answers = asyncio.run(scenario())
    for request, answer in zip(requests, answers, strict=True):
        if request == ["bad"]:
            assert isinstance(answer, ValueError)
        else:
            assert answer[1] == [len(text) for text in request]
    assert ["bb", "ccc", "eeeee", "eeeeee"] == calls[1][:4], calls  # wave 2 in one call
    assert len(calls) == 1 + 1 + 1 + 3, calls  # wave 3: one refused call, then one call per request


def test_short_requests_are_tokenised_on_the_event_loop_and_long_ones_on_the_tokenizer_thread():
    from encoder_runtime.tokenization import Encoded

    threads: dict[str, str] = {}

    def encode(texts):
        threads[texts[0]] = threading.current_thread().name
        return [Encoded((len(text),), False) for text in texts]

    async def scenario():
        batcher = MicroBatcher(encode, lambda items: [item.ids[0] for item in items], inline_chars=10)
        answers = [await batcher.submit(["short"]), await batcher.submit(["a text over ten characters"])]
        await batcher.stop()
        return [answer for _, answer in answers]

    assert asyncio.run(scenario()) == [[5], [26]]
    assert threads["short"] == threading.main_thread().name
    assert threads["a text over ten characters"].startswith("tokenize")


def test_bulk_texts_get_one_pass_in_bulk_share_while_queries_wait():
    """Upsert chunks (bulk) yield to queries: with both queued, bulk gets every ``bulk_share``-th pass, and
    every pass once no query waits (so neither side is starved)."""
    from encoder_runtime.tokenization import Encoded

    release = threading.Event()
    passes: list[str] = []

    def run(items):
        release.wait(5)  # the first pass holds the thread until everything is queued
        passes.append("".join(sorted({"b" if item.ids[0] == 2 else "q" for item in items})))
        return [0] * len(items)

    def encode(texts):
        return [Encoded((2 if text.startswith("bulk") else 1, 5), False) for text in texts]

    async def scenario() -> None:
        batcher = MicroBatcher(encode, run, max_batch_size=1, max_wait_ms=0, bulk_share=3)
        first = asyncio.ensure_future(batcher.submit(["query-first"]))
        await asyncio.sleep(0.05)  # the first pass has started and waits
        bulk = asyncio.ensure_future(batcher.submit([f"bulk-{i}" for i in range(4)], bulk=True))
        queries = [asyncio.ensure_future(batcher.submit([f"query-{i}"])) for i in range(4)]
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(first, bulk, *queries)
        await batcher.stop()

    asyncio.run(scenario())
    assert passes == ["q", "q", "q", "b", "q", "q", "b", "b", "b"]


def test_bulk_passes_leave_one_inference_thread_to_queries():
    """With two inference threads, bulk work runs on one at a time: a query that arrives while a bulk pass
    runs is answered before the bulk work queued behind it."""
    from encoder_runtime.tokenization import Encoded

    lock, running, most = threading.Lock(), [0], [0]
    answered: list[str] = []

    def run(items):
        bulk = items[0].ids[0] == 2
        if bulk:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            threading.Event().wait(0.02)
            with lock:
                running[0] -= 1
        return [0] * len(items)

    def encode(texts):
        return [Encoded((2 if text.startswith("bulk") else 1, 5), False) for text in texts]

    async def scenario() -> None:
        batcher = MicroBatcher(encode, run, max_batch_size=1, max_wait_ms=0, parallel_passes=2)

        async def bulk() -> None:
            await batcher.submit([f"bulk-{i}" for i in range(20)], bulk=True)
            answered.append("bulk")

        async def query() -> None:
            await asyncio.sleep(0.05)  # bulk passes under way
            await batcher.submit(["query"])
            answered.append("query")

        await asyncio.gather(bulk(), query())
        await batcher.stop()

    asyncio.run(scenario())
    assert most[0] == 1
    assert answered == ["query", "bulk"]


def test_a_pass_is_planned_from_the_oldest_texts_not_the_whole_queue():
    """With thousands queued, each pass is planned from a few passes' worth of the oldest texts (planning over
    the whole queue cost every pass time in proportion to it), and every text still gets its own answer."""
    from encoder_runtime.batcher import WINDOW_PASSES
    from encoder_runtime.tokenization import Encoded

    release = threading.Event()
    passes: list[list[int]] = []

    def run(items):
        release.wait(5)  # the first pass holds the thread until all 3,000 texts are queued
        passes.append([item.ids[0] for item in items])
        return [item.ids[0] for item in items]

    def encode(texts):
        return [Encoded((int(text),) * (5 + int(text) % 7), False) for text in texts]

    async def scenario() -> list[int]:
        batcher = MicroBatcher(encode, run, max_batch_tokens=256, max_batch_size=16, max_queue=10_000)
        first = asyncio.ensure_future(batcher.submit(["0"]))
        await asyncio.sleep(0.05)
        rest = asyncio.ensure_future(batcher.submit([str(i) for i in range(1, 3000)]))
        await asyncio.sleep(0.05)
        release.set()
        (_, head), (_, tail) = await first, await rest
        await batcher.stop()
        assert batcher._queued_tokens == 0
        return head + tail

    assert asyncio.run(scenario()) == list(range(3000))
    window = WINDOW_PASSES * 16
    for done, batch in enumerate(passes):
        left = sorted(i for later in passes[done:] for i in later)  # the queue, oldest first
        assert min(batch) == left[0] and set(batch) <= set(left[:window])
