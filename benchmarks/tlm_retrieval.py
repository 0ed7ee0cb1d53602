"""What translation language modelling buys: cross-lingual retrieval of held-out verse
translations, multilingual MLM alone against MLM + TLM (XLM) at the same budget.

    python benchmarks/tlm_retrieval.py [--steps 400] [--size tiny] [--batch-size 32]
        [--seq-len 128] [--learning-rate 1e-3] [--tlm-fraction 0.5] [--vocab-size 8000]
        [--pairs 500] [--workdir DIR]

Data: the King James Bible (English) and the Reina-Valera 1909 (Spanish) from Debian's SWORD
modules (bertjax.data.parallel_text; `apt-get download`), each Bible a monolingual corpus (a book a
document), and their verses paired by reference. Both runs are the real job, `python -m
bertjax.main --config=configs/xlm_tlm.py`, on one corpus prepared once (one SentencePiece
vocabulary of --vocab-size, alpha 0.5), with the same preset, steps, batch, sequence length,
learning rate and seed; they differ only in data.tlm_fraction (0: MLM alone, without language ids).
The TLM run trains on the verse pairs except the held-out 2% (every k-th pair); retrieval uses
`--pairs` of those held-out pairs: each English verse's mean-pooled embedding (all layers averaged,
normalized, `bertjax.load(...).embed`) against every Spanish one's, top-1 accuracy in both
directions (chance: 1 / pairs). Embedding uses segment id 0, as `embed` does for any text.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import bertjax  # noqa: E402
from bertjax.core.errors import exit_on_user_error  # noqa: E402
from bertjax.data import parallel_text  # noqa: E402

HELD_OUT = 0.02  # data.eval_fraction: documents and pairs held out alike


def bible(workdir: str) -> tuple[str, str]:
    """(texts directory, pairs file), written once."""
    texts, pairs = os.path.join(workdir, "bible"), os.path.join(workdir, "bible", "pairs.tsv")
    if not os.path.exists(pairs):
        os.makedirs(texts, exist_ok=True)
        parallel_text.write_bible_texts(texts)
        parallel_text.write_bible_pairs(pairs)
    return texts, pairs


def train(args, name: str, tlm_fraction: float, texts: str, pairs: str) -> tuple[str, float]:
    workdir = os.path.join(args.workdir, name)
    overrides = {
        "data.languages": f"en={texts}/en.txt,es={texts}/es.txt",
        "data.prepared": os.path.join(args.workdir, "corpus"), "data.vocab_size": args.vocab_size,
        "data.eval_fraction": HELD_OUT, "data.tlm_fraction": tlm_fraction, "data.workers": 1,
        "model.preset": args.size, "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0,
        "schedule.long_seq_len": args.seq_len,
        "schedule.long_max_predictions": round(args.seq_len * 0.15),
        "train.steps": args.steps, "train.batch_size": args.batch_size,
        "train.eval_every": args.steps, "train.eval_batches": 4,
        "train.checkpoint_every": args.steps, "train.log_every": max(1, args.steps // 10),
        "train.seed": args.seed, "optimizer.learning_rate": args.learning_rate,
        "optimizer.warmup_steps": args.steps // 10}
    if tlm_fraction:
        overrides["data.parallel"] = f"en-es={pairs}"
    command = [sys.executable, "-m", "bertjax.main", f"--config={REPO}/configs/xlm_tlm.py",
               f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in overrides.items()]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO)
    return workdir, time.perf_counter() - start


def last_eval(workdir: str) -> dict:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return {k: v for r in records for k, v in r.items() if k.startswith("eval_")}


def retrieval(workdir: str, english: list[str], spanish: list[str]) -> tuple[float, float]:
    """Top-1 accuracy English -> Spanish and Spanish -> English."""
    model = bertjax.load(workdir)
    a = model.embed(english, "mean", normalize=True)
    b = model.embed(spanish, "mean", normalize=True)
    similarity = a @ b.T
    truth = np.arange(len(english))
    return (float((similarity.argmax(1) == truth).mean()),
            float((similarity.argmax(0) == truth).mean()))


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--tlm-fraction", type=float, default=0.5)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=os.path.join(REPO, "runs", "tlm_retrieval"))
    args = parser.parse_args(argv)
    texts, pairs_file = bible(args.workdir)
    pairs = parallel_text.read_pairs(pairs_file)
    _, held = parallel_text.split_indices(len(pairs), HELD_OUT)
    held = held[:args.pairs]
    english, spanish = [pairs[i][0] for i in held], [pairs[i][1] for i in held]
    rows = []
    for name, fraction in (("MLM", 0.0), ("MLM + TLM", args.tlm_fraction)):
        workdir, seconds = train(args, name.replace(" + ", "_").lower(), fraction, texts,
                                 pairs_file)
        metrics = last_eval(workdir)
        en_es, es_en = retrieval(workdir, english, spanish)
        rows.append(f"| {name} | {fraction:g} | {metrics.get('eval_mlm_accuracy_en', 0):.3f} | "
                    f"{metrics.get('eval_mlm_accuracy_es', 0):.3f} | {en_es:.3f} | {es_en:.3f} "
                    f"| {seconds:.0f} |")
    print(f"\n{args.steps} steps of {args.batch_size} x {args.seq_len} tokens, {args.size}; "
          f"{len(held)} held-out verse pairs (chance {1 / len(held):.3f})\n")
    print("| objective | TLM share | eval MLM acc. en | eval MLM acc. es | top-1 en→es | "
          "top-1 es→en | wall s |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
