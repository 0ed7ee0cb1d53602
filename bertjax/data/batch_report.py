"""What a pretraining batch holds, for a person to read: its examples decoded with each prediction
target shown beside what the model sees, statistics over batches (the 80/10/10 masking split,
padding, NSP balance), and the raw arrays dumped to an .npz file (`python -m bertjax.data.inspect`).
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from bertjax.core import output_dir
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import Tokenizer


# The pair label's meaning by example mode: next-sentence or sentence-order prediction.
PAIR_NAMES = {"nsp": {0: "IsNext", 1: "NotNext"}, "sop": {0: "InOrder", 1: "Swapped"}}


def _original_ids(batch: dict) -> np.ndarray:
    """input_ids with every prediction target put back."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_weights"] > 0)
    ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
    return ids


def describe_batch(batch: dict, tokenizer: Tokenizer, max_examples: int,
                   mode: str = "nsp") -> str:
    """The first `max_examples` examples, one token a word, targets shown as `seen(=target)`."""
    lines = []
    for i in range(min(max_examples, batch["input_ids"].shape[0])):
        length = int(batch["input_mask"][i].sum())
        words = tokenizer.tokens(batch["input_ids"][i, :length])
        real = batch["masked_weights"][i] > 0
        targets = zip(batch["masked_positions"][i][real], batch["masked_ids"][i][real])
        for position, target in targets:
            words[position] += f"(={tokenizer.id_to_token(int(target))})"
        header = f"example {i}: {length} tokens, {int(real.sum())} predictions"
        if "nsp_label" in batch:
            label = int(batch["nsp_label"][i])
            header += f", nsp_label {label} ({PAIR_NAMES.get(mode, {}).get(label, '?')})"
        padding = batch["input_ids"].shape[1] - length
        lines += [header, "  " + " ".join(words) + (f"  + {padding} x [PAD]" if padding else "")]
    return "\n".join(lines)


def batch_statistics(batches: list[dict], tokenizer: Tokenizer) -> dict:
    """Token, padding, masking (the 80/10/10 split) and NSP statistics over batches."""
    if not batches:
        raise UserError("no batches to describe")
    special = tokenizer.special_mask()
    mask_id = tokenizer.special.mask
    totals = dict(examples=0, positions=0, tokens=0, candidates=0, predictions=0, as_mask=0,
                  as_random=0, as_kept=0, nsp=0, nsp_positive=0)
    seq_lens = set()
    for batch in batches:
        original = _original_ids(batch)
        real = batch["input_mask"] > 0
        chosen = batch["masked_weights"] > 0
        rows, slots = np.nonzero(chosen)
        seen = batch["input_ids"][rows, batch["masked_positions"][rows, slots]]
        target = batch["masked_ids"][rows, slots]
        seq_lens.add(int(batch["input_ids"].shape[1]))
        totals["examples"] += batch["input_ids"].shape[0]
        totals["positions"] += batch["input_ids"].size
        totals["tokens"] += int(real.sum())
        totals["candidates"] += int((real & ~special[original]).sum())
        totals["predictions"] += int(chosen.sum())
        totals["as_mask"] += int((seen == mask_id).sum())
        totals["as_kept"] += int((seen == target).sum())
        totals["as_random"] += int(((seen != mask_id) & (seen != target)).sum())
        if "nsp_label" in batch:
            totals["nsp"] += batch["nsp_label"].size
            totals["nsp_positive"] += int((batch["nsp_label"] == 0).sum())
    predictions = max(totals["predictions"], 1)
    stats = {
        "examples": totals["examples"],
        "seq_lens": sorted(seq_lens),
        "tokens_per_example": totals["tokens"] / totals["examples"],
        "padding_fraction": (totals["positions"] - totals["tokens"]) / totals["positions"],
        "predictions_per_example": totals["predictions"] / totals["examples"],
        "masked_fraction": totals["predictions"] / max(totals["candidates"], 1),
        "mask_token_fraction": totals["as_mask"] / predictions,
        "random_token_fraction": totals["as_random"] / predictions,
        "unchanged_fraction": totals["as_kept"] / predictions,
    }
    if totals["nsp"]:
        stats["nsp_positive_fraction"] = totals["nsp_positive"] / totals["nsp"]
    return stats


def format_statistics(stats: dict) -> str:
    return "\n".join(f"  {key:<24} {value:.4f}" if isinstance(value, float)
                     else f"  {key:<24} {value}" for key, value in stats.items())


def _is_npz(path: str) -> bool:
    return zipfile.is_zipfile(path)


# What --dump writes, and so the only file its --overwrite replaces.
DUMP = output_dir.Kind("batch dump (.npz)", directory=False, holds=_is_npz)


def check_dump_target(path: str, *, overwrite: bool) -> None:
    """Refuses, before any batch is built, a dump that would replace a file unasked (or, with
    overwrite, a file that is not an earlier dump)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError(f"cannot write {path}: {directory} is not a directory")
    if os.path.isdir(path):
        raise UserError(f"cannot write {path}: it is a directory")
    if os.path.lexists(path) and not overwrite:
        raise UserError(f"{path} already exists; choose a new --dump file or pass --overwrite")
    output_dir.check_target(path, overwrite=overwrite, kind=DUMP)


def write_dump(path: str, batches: list[dict], *, overwrite: bool = False) -> None:
    """The batches' arrays, concatenated per key, written atomically to an .npz file."""
    check_dump_target(path, overwrite=overwrite)
    shapes = {key: {b[key].shape[1:] for b in batches} for key in batches[0]}
    if any(len(s) > 1 for s in shapes.values()):
        raise UserError("the batches cross a sequence-length switch; dump batches of one phase")
    arrays = {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}
    with output_dir.staged_file(path, overwrite=overwrite, kind=DUMP) as f:
        np.savez(f, **arrays)
