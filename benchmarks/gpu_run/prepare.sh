#!/usr/bin/env bash
# What the GPU machine lacks, laid out call by call in .gpu-carry/ (ignored by git): run here, in the checkout.
#
#   call1/  wheels for Python 3.12 (the service, training and py-spy) and the model's first part
#   call2/  the rest of the model (the bundled encoder at fp16, in checked parts), sentences, SciFact, wrk
#           and today's code (BEFORE, default the commit before this branch's fixes) for the side by side
#   train/  for benchmarks/gpu_run/train.sh: the fill-mask corpus and held-out text
#
# Each call carries the working tree too: every call's total is printed and must stay under 64 MiB.
#   benchmarks/gpu_run/prepare.sh [BEFORE]
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
BEFORE=${1:-88d6ce7}
PY=${PY:-.venv/bin/python}
C=.gpu-carry
rm -rf "$C" && mkdir -p "$C/call1/wheels" "$C/call2/wrk" "$C/train"

PYTHONPATH=$PWD "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d "$C/call1/wheels" \
  faiss-cpu==1.15.1 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 pydantic==2.14.4 pydantic-core==2.50.5 \
  pydantic-settings==2.16.3 python-dotenv==1.2.4 typing-inspection==0.4.5 annotated-types==0.8.0 orjson==3.13.0 \
  httptools==0.9.0 PyStemmer==3.1.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 opentelemetry-api==1.45.3 \
  typing_extensions==4.16.0 py-spy==0.4.3

# sentences, SciFact and the bundled model rounded to fp16 (benchmarks/gpu.py --prepare), the model in parts
PYTHONPATH=$PWD "$PY" benchmarks/gpu.py --prepare "$C/data"
mkdir -p "$C/call2/data" && mv "$C/data/sentences.txt.gz" "$C/data/beir-scifact" "$C/call2/data/"
mv "$C/data/wiki.valid.raw.gz" "$C/train/"
"$PY" benchmarks/gpu_run/parts.py split "$C/.gpu-model/"* --name model --part-mib 11 --out "$C/parts"
mv "$C/parts/model.part00" "$C/call1/" && mv "$C/parts/"* "$C/call2/"
rm -rf "$C/data" "$C/.gpu-model" "$C/parts"

# held-out text and the fill-mask corpus (encoder_runtime/models/fill-mask-delta/README.md rebuilds it)
cp ../shared/data/wikitext-2-raw/wiki.test.raw "$C/train/" && gzip -9n "$C/train/wiki.test.raw"
if [ -d data/fill-mask-corpus ]; then tar -czf "$C/train/fill-mask-corpus.tar.gz" -C data fill-mask-corpus; fi

cp "$(command -v wrk)" "$C/call2/wrk/"
cp "$(ldd "$(command -v wrk)" | awk '/libluajit/ {print $3}')" "$C/call2/wrk/"
# today's code without what the working tree already carries (the fill-mask delta is linked in there)
git archive --format=tar.gz -o "$C/call2/before.tar.gz" "$BEFORE" app encoder_runtime/__init__.py \
  encoder_runtime/backends encoder_runtime/batcher.py encoder_runtime/default_fill_mask.py \
  encoder_runtime/devices.py encoder_runtime/encoder.py encoder_runtime/fill_mask.py encoder_runtime/model_dir.py \
  encoder_runtime/reranker.py encoder_runtime/tokenization.py encoder_runtime/tokenized_runtime.py index \
  encoder_training harness pyproject.toml

tree=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
for call in call1 call2 train; do
  size=$(du -sb "$C/$call" | cut -f1)
  echo "$call: $((size / 1048576)) MiB carried + $((tree / 1048576)) MiB tree = $(((size + tree) / 1048576)) MiB (limit 64)"
done
