#!/usr/bin/env bash
# Issue 61's training run (benchmarks/gpu_run/train.py) in the device call after `serve.sh install` and
# `serve.sh stage` (the model and SciFact already in $T), carrying .gpu-carry/train (the fill-mask corpus).
# Writes $OUT/trained.partNN, trained.parts.json, train.json and commands.log.
# --dry-run: every step here on the CPU, a tiny reranker start, WikiText-2 valid as the corpus, seconds-long.
#   benchmarks/gpu_run/train.sh [--dry-run]
set -euo pipefail
DRY=${1:-}
PY=${PY:-python3}
T=/tmp/cloze-gpu
if [ "$DRY" = "--dry-run" ]; then PY=.venv/bin/python T=/tmp/cloze-gpu-dry OUT=${OUT:-$T/train-out}; fi
OUT=${OUT:?the device call sets OUT}
export PYTHONPATH=$PWD:$T/site:$T/model HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PATH=$T/site/bin:$PATH TMPDIR=$T
mkdir -p "$T/train" "$OUT"
if [ "$DRY" = "--dry-run" ]; then
  export PYTHONPATH=$PWD:$T/model
  "$PY" benchmarks/gpu_run/small_beir.py "$T/data/beir-scifact" "$T/data/scifact-small" --documents 120
  "$PY" -c "from pathlib import Path; from harness.tiny_model import make_tiny_bert as m; m(Path('$T/tiny'), 128)"
  gunzip -c .gpu-carry/train/wiki.valid.raw.gz > "$T/train/wiki.valid.raw"
  "$PY" benchmarks/gpu_run/train.py --dry-run --text "$T/train/wiki.valid.raw" --scifact "$T/data/scifact-small" \
    --tiny-model "$T/tiny" --dev-queries 10 --fill-mask-minutes 0.3 --grid-minutes 0.1 --rerank-minutes 0.1 \
    --out-dir "$OUT"
else
  tar -xzf .gpu-carry/train/fill-mask-corpus.tar.gz -C "$T/train"
  "$PY" benchmarks/gpu_run/train.py --text "$T/train/fill-mask-corpus" --scifact "$T/data/beir-scifact" \
    --out-dir "$OUT"
fi
ls -la "$OUT"
