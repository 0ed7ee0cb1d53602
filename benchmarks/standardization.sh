#!/usr/bin/env bash
# Anisotropy, and what z-scoring and all-but-the-top change, for one model (docs/using-a-model.md,
# "Anisotropy and standardisation"):
#
#   bash benchmarks/standardization.sh MODEL OUTDIR
#
# Reference corpus: sentences 1,001-2,000 of the Wikipedia demo corpus. Retrieval: the held-out
# articles' 894 passages of tests/retrieval_pairs.py and 300 of their queries (seeded).
set -euo pipefail
model=$1
out=$2
python=${PYTHON:-.venv/bin/python}
cd "$(dirname "$0")/.."
mkdir -p "$out"
$python - "$out" <<'PY'
import json, random, subprocess, sys
from bertjax.data.demo_corpus import demo_corpus_path
out = sys.argv[1]
lines = [l for l in open(demo_corpus_path(), encoding="utf-8").read().splitlines() if l.strip()]
open(f"{out}/reference.txt", "w", encoding="utf-8").write("\n".join(lines[1000:2000]) + "\n")
subprocess.run([sys.executable, "tests/retrieval_pairs.py", f"{out}/pairs"], check=True,
               capture_output=True)
docs = [json.loads(l) for l in open(f"{out}/pairs/docs.jsonl")]
queries = [json.loads(l) for l in open(f"{out}/pairs/queries.jsonl")]
articles = {q["relevant"][0].split("-")[0] for q in queries}
random.Random(0).shuffle(queries)
with open(f"{out}/docs.jsonl", "w") as f:
    f.writelines(json.dumps(d) + "\n" for d in docs if d["id"].split("-")[0] in articles)
with open(f"{out}/queries.jsonl", "w") as f:
    f.writelines(json.dumps(q) + "\n" for q in queries[:300])
PY
run() { $python -m "$@" 2> >(grep -v '^note:' >&2); }
run bertjax.evaluate anisotropy --model "$model" --corpus "$out/reference.txt" --sentences 500 \
    --plot "$out/anisotropy.png" --json "$out/anisotropy.json" --overwrite
for method in zscore all-but-the-top; do
  run bertjax.embed --model "$model" --fit-standardizer "$out/reference.txt" \
      --output "$out/$method.npz" --pooling mean --method $method --overwrite
  run bertjax.embed --model "$model" --fit-standardizer "$out/reference.txt" \
      --output "$out/words-$method.npz" --word-vectors --layers -1 --method $method --overwrite
done
echo "--- Lee et al. similarity"
run bertjax.evaluate similarity --model "$model" --pooling mean
for method in zscore all-but-the-top; do
  run bertjax.evaluate similarity --model "$model" --pooling mean --standardize "$out/$method.npz" \
      | grep "model,"
done
for variant in raw zscore all-but-the-top; do
  words=(); stats=()
  if [ $variant != raw ]; then words=(--standardize "$out/words-$variant.npz"); stats=(--standardize "$out/$variant.npz"); fi
  echo "--- word senses, $variant"
  run bertjax.wsd evaluate --model "$model" "${words[@]}" | tail -3
  echo "--- retrieval, $variant"
  run bertjax.index build --model "$model" --corpus "$out/docs.jsonl" --output "$out/index-$variant" \
      --overwrite "${stats[@]}" > /dev/null
  run bertjax.index evaluate --index "$out/index-$variant" --queries "$out/queries.jsonl" "${stats[@]}" \
      | grep "dense"
done
