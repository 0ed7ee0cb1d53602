"""Look at what the model will be fed: decoded pretraining batches and their statistics.

    python -m bertjax.data.inspect --config=configs/base.py --workdir=DIR --batches 4 \
        [--step 0] [--examples 4] [--dump batches.npz [--overwrite]] [--config.KEY=VALUE ...]

Prints the first examples of the first batch as tokens, each prediction target shown beside what
the model sees ("[MASK](=sat)", "dog(=sat)" for a random replacement, "sat(=sat)" when kept), the
NSP label, then statistics over all the batches. --dump writes the raw batch arrays (the batch
schema's keys, batches concatenated) to an .npz file, which must not exist unless --overwrite.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile

import numpy as np
from absl import flags

from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import UserError, exit_on_user_error
from bertjax.core.file_modes import publish


def _flags() -> flags.FlagValues:
    """inspect's own flags, fresh for every call (--config is defined by main.parse_config)."""
    values = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "Run directory (the prepared corpus is WORKDIR/data "
                        "unless config.data.prepared says otherwise).", flag_values=values)
    flags.DEFINE_integer("batches", 2, "How many batches to build.", flag_values=values)
    flags.DEFINE_integer("step", 0, "The first step to build (its phase sets the length).",
                         flag_values=values)
    flags.DEFINE_integer("examples", 4, "How many examples of the first batch to print.",
                         flag_values=values)
    flags.DEFINE_string("dump", None, "Write the raw batch arrays to this .npz file.",
                        flag_values=values)
    flags.DEFINE_bool("overwrite", False, "Replace an existing --dump file.", flag_values=values)
    return values


NSP_NAMES = {0: "IsNext", 1: "NotNext"}


def _original_ids(batch: dict) -> np.ndarray:
    """input_ids with every prediction target put back."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_weights"] > 0)
    ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
    return ids


def describe_batch(batch: dict, tokenizer: Tokenizer, max_examples: int) -> str:
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
            header += f", nsp_label {label} ({NSP_NAMES.get(label, '?')})"
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


def check_dump_target(path: str, *, overwrite: bool) -> None:
    """Refuses, before any batch is built, a dump that would replace a file unasked."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UserError(f"cannot write {path}: {directory} is not a directory")
    if os.path.isdir(path):
        raise UserError(f"cannot write {path}: it is a directory")
    if os.path.lexists(path) and not overwrite:
        raise UserError(f"{path} already exists; choose a new --dump file or pass --overwrite")


def write_dump(path: str, batches: list[dict], *, overwrite: bool = False) -> None:
    """The batches' arrays, concatenated per key, written atomically to an .npz file."""
    check_dump_target(path, overwrite=overwrite)
    shapes = {key: {b[key].shape[1:] for b in batches} for key in batches[0]}
    if any(len(s) > 1 for s in shapes.values()):
        raise UserError("the batches cross a sequence-length switch; dump batches of one phase")
    arrays = {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}
    directory = os.path.dirname(os.path.abspath(path))
    handle, tmp = tempfile.mkstemp(prefix=".inspect-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(handle, "wb") as f:
            np.savez(f, **arrays)
        publish(tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _parse(argv: list[str]):
    """(settings, flags), every check made before a batch is built: the config file is loaded
    and read as the training job reads it (so another task's config is refused by name)."""
    from bertjax.cli.main import parse_config
    from bertjax.settings import pretrain

    config, values = parse_config(argv, _flags())
    s = pretrain.read(config)
    if not values.workdir and not s.data.prepared:
        raise UserError("--workdir is required (or --config.data.prepared=DIR)")
    if values.batches < 1 or values.step < 0 or values.examples < 0:
        raise UserError("--batches must be positive, --step and --examples not negative")
    if values.dump:
        check_dump_target(values.dump, overwrite=values.overwrite)
    # A few batches: building them here beats starting worker processes.
    return dataclasses.replace(s, data=dataclasses.replace(s.data, workers=0)), values


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    from bertjax.jobs import pretraining_data

    s, flag_values = _parse(list(sys.argv if argv is None else argv))
    prepared = pretraining_data.prepared_corpus(s, flag_values.workdir or "", None)
    data, tokenizer = pretraining_data.batches(s, prepared), prepared.tokenizer
    with data.train_iterator(flag_values.step) as batches_from:
        batches = [next(batches_from) for _ in range(flag_values.batches)]
    print(f"step {flag_values.step}, {data.local_batch_size} examples a batch, mode {data.mode}")
    print(describe_batch(batches[0], tokenizer, flag_values.examples))
    print(f"statistics over {len(batches)} batches:")
    print(format_statistics(batch_statistics(batches, tokenizer)))
    if flag_values.dump:
        write_dump(flag_values.dump, batches, overwrite=flag_values.overwrite)
        print(f"wrote {flag_values.dump}")


if __name__ == "__main__":
    main()
