"""How `make test` spreads the suite over its two xdist workers, and how a worker ends.

xdist (`--dist loadfile --no-loadscope-reorder`) hands a worker one whole test file at a time, in
collection order, whenever the worker is nearly done with its last. With the files in the order
pytest finds them (or xdist's own, most tests first) a long file could start late and keep one
worker busy while the other sat idle: the workers finished 9-22 s apart on fresh clones. Handing
out the longest files first (a greedy schedule) leaves only short files to even out the end.
"""

import os
import sys

# Files taking 8 s or more on a worker, longest first: wall seconds on a fresh clone of e231582
# (2 cores, cold compilation cache, 740 s of pytest), a shared fixture's build counted in the
# first file that asked for it. The rest follow in pytest's order. The figures need only be
# roughly right; a file missing here merely starts later.
LONGEST_FIRST = (
    "test_finetune.py",  # 101
    "test_budget_pretraining_benchmark.py",  # 97
    "test_gcs_runs.py",  # 60
    "test_adapters_lora.py",  # 55
    "test_multihost.py",  # 52
    "test_pretrain.py",  # 52
    "faults/test_catalog.py",  # 50
    "test_electra_runs.py",  # 42
    "test_cloze_prompt.py",  # 41
    "test_retrieval_training.py",  # 39
    "test_packing_finetune.py",  # 39
    "test_index.py",  # 35
    "test_sharded_steps.py",  # 33
    "test_modernbert_runs.py",  # 33
    "test_span_classification.py",  # 32
    "test_notebook.py",  # 29
    "test_bench_finetune.py",  # 29
    "test_length_bucketing.py",  # 29
    "test_distill.py",  # 27
    "faults/test_runs.py",  # 27
    "test_finetune_start.py",  # 27
    "test_wsd.py",  # 25
    "test_step.py",  # 25
    "test_training_parity.py",  # 25
    "test_time_budget.py",  # 24
    "test_books_corpus.py",  # 24
    "test_standardization.py",  # 18
    "test_low_precision_matmul.py",  # 18
    "test_embed.py",  # 18
    "test_compile.py",  # 18
    "test_electra.py",  # 17
    "test_model.py",  # 17
    "test_packing.py",  # 17
    "test_prepare.py",  # 17
    "test_export.py",  # 16
    "test_transformers_budget.py",  # 16
    "test_api.py",  # 16
    "test_bert_reference.py",  # 15
    "test_packaged_tasks.py",  # 15
    "test_bench.py",  # 11
    "test_local_attention.py",  # 11
    "test_masking.py",  # 11
    "test_index_integrity.py",  # 11
    "faults/test_outputs.py",  # 10
    "faults/test_checkpoints.py",  # 9
    "test_convert.py",  # 9
    "test_electra_hf.py",  # 9
)
TESTS = os.path.dirname(os.path.abspath(__file__))


def longest_first(items: list) -> None:
    """Reorders the collected tests, in place, file by file as LONGEST_FIRST ranks them (a file's
    own tests keep their order; files not ranked keep theirs, after the ranked ones)."""
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}

    def file_rank(item) -> int:
        name = os.path.relpath(str(item.path), TESTS).replace(os.sep, "/")
        return rank.get(name, len(rank))

    items.sort(key=file_rank)


def end_worker_at_once() -> None:
    """Ends an xdist worker that has reported its last result (the controller has all it needs).

    A worker's own ending took seconds after its last test (pytest's last garbage collection, the
    interpreter freeing a heap of compiled programs) while the controller waited for it: from the
    last worker's report to the end of the session 7.8 s, against 0.3 s ending at once (fresh
    clones). The session fixtures are torn down (their servers stopped) before the report. What
    is skipped would matter only to a plugin that writes on a worker at its exit, such as
    pytest-cov; the suite has none.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
