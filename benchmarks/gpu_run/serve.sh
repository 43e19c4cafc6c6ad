#!/usr/bin/env bash
# The served path on a GPU, in three device calls back to back (the machine stays warm, and /tmp with it):
#
#   install   (carry .gpu-carry/call1)  wheels into $T/site, the model's first part into $T/parts
#   stage     (carry .gpu-carry/call2)  the model joined and checked, data and today's code into $T (measure
#             does this first; benchmarks/gpu_run/train.sh's session stages, then trains)
#   measure   (carry .gpu-carry/call2)  the model joined and checked; benchmarks/gpu.py parts 2 and 3: the token
#             budget sweep and tokenising ahead in-process, then `cloze serve` from today's code (BEFORE) and
#             from this checkout under wrk (64 connections, one text and 256 texts a request, p50/p99, server
#             CPU per request), each profiled by py-spy for 15 s under the one-text load -> $OUT/serve.json
#   adapt     (no carry)                part 5, `cloze adapt` on SciFact scored before and after -> $OUT/adapt.json
#
# --dry-run runs every step here on the CPU: the GPU's pass layout, a thin stand-in model, seconds-long arms,
# a 120-document SciFact, into /tmp/cloze-gpu-dry (docs/benchmarks.md, "Running the benchmarks on a GPU", has
# the steps in order).
#   benchmarks/gpu_run/serve.sh install|stage|measure|adapt [--dry-run]
set -euo pipefail
STEP=$1
DRY=${2:-}
PY=${PY:-python3}
T=/tmp/cloze-gpu
if [ "$DRY" = "--dry-run" ]; then PY=.venv/bin/python T=/tmp/cloze-gpu-dry OUT=${OUT:-$T/out}; fi
OUT=${OUT:?the device call sets OUT}
mkdir -p "$T/parts" "$OUT"
export PYTHONPATH=$PWD:$T/site:$T/model HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PATH=$T/site/bin:$PATH
# the dry run's Python has these packages already; the wheels installed are 3.12's (only py-spy's binary is used)
if [ "$DRY" = "--dry-run" ]; then export PYTHONPATH=$PWD:$T/model; fi

case $STEP in
install)
  # --python-version: the same command installs the GPU machine's 3.12 wheels from any Python (the dry run)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --only-binary=:all: \
    --python-version 3.12 --implementation cp --target "$T/site" .gpu-carry/call1/wheels/*.whl
  cp .gpu-carry/call1/model.part* "$T/parts/"
  ls "$T/site" | head -40 > "$OUT/installed.txt"
  ;;
stage | measure)
  cp .gpu-carry/call2/model.part* .gpu-carry/call2/model.parts.json "$T/parts/"
  "$PY" benchmarks/gpu_run/parts.py join "$T/parts" --name model --into "$T/model"
  rm -rf "$T/before" && mkdir -p "$T/before" && tar -xzf .gpu-carry/call2/before.tar.gz -C "$T/before"
  ln -sfn "$PWD/encoder_runtime/models" "$T/before/encoder_runtime/models"
  cp -r .gpu-carry/call2/data .gpu-carry/call2/wrk "$T/"
  if [ "$STEP" = stage ]; then ls -la "$OUT"; exit 0; fi
  "$PY" benchmarks/gpu.py --parts embed,http --no-cpu-arm --before "$T/before" \
    --sentences "$T/data/sentences.txt.gz" --wrk "$T/wrk/wrk" --seconds 15 --profile-seconds 15 \
    --deadline-s 540 --out "$OUT/serve.json" $DRY
  ;;
adapt)
  scifact=$T/data/beir-scifact minutes=2.5 deadline=400
  if [ "$DRY" = "--dry-run" ]; then
    "$PY" benchmarks/gpu_run/small_beir.py "$scifact" "$T/data/scifact-small" --documents 120
    scifact=$T/data/scifact-small minutes=3 deadline=1300
  fi
  "$PY" benchmarks/gpu.py --parts adapt --scifact "$scifact" --adapt-minutes $minutes --deadline-s $deadline \
    --out "$OUT/adapt.json" $DRY
  ;;
*)
  echo "usage: $0 install|stage|measure|adapt [--dry-run]" >&2
  exit 2
  ;;
esac
ls -la "$OUT"
