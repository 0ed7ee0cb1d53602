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
import sys

from absl import flags

from bertjax.cli import entry
from bertjax.cli.config_flags import parse_config
from bertjax.core import storage
from bertjax.core.errors import UserError
from bertjax.data.batch_report import (batch_statistics, check_dump_target, describe_batch,
                                       format_statistics, write_dump)
from bertjax.jobs import pretraining_data, remote_inputs
from bertjax.settings import pretrain

USAGE = ("python -m bertjax.data.inspect --config=configs/base.py --workdir=DIR [--batches 4] "
         "[--step 0] [--examples 4] [--dump batches.npz [--overwrite]] [--config.KEY=VALUE ...]")


def _flags() -> flags.FlagValues:
    """inspect's own flags, fresh for every call (--config is defined by parse_config)."""
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


def _parse(argv: list[str]):
    """(settings, flags), every check made before a batch is built: the config file is loaded
    and read as the training job reads it (so another task's config is refused by name)."""
    config, values = parse_config(argv, _flags(), usage=USAGE,
                                  about="\n\n".join(__doc__.split("\n\n")[::2]))
    s = pretrain.read(config)
    if not values.workdir and not s.data.prepared:
        raise UserError("--workdir is required (or --config.data.prepared=DIR)")
    if values.batches < 1 or values.step < 0 or values.examples < 0:
        raise UserError("--batches must be positive, --step and --examples not negative")
    if values.dump:
        check_dump_target(values.dump, overwrite=values.overwrite)
    # A few batches: building them here beats starting worker processes.
    return dataclasses.replace(s, data=dataclasses.replace(s.data, workers=0)), values


@entry.command
def main(argv: list[str] | None = None) -> None:
    s, flag_values = _parse(list(sys.argv if argv is None else argv))
    workdir = flag_values.workdir or ""
    if storage.is_url(workdir) and not s.data.prepared:  # as a run on that workdir reads it
        storage.check_output_url(workdir, "a workdir")
        s = dataclasses.replace(s, data=dataclasses.replace(
            s.data, prepared=storage.join(storage.absolute(workdir), "data")))
    inputs = remote_inputs.localized(s)  # a corpus on a bucket, read through a local copy
    prepared = pretraining_data.prepared_corpus(inputs.settings, workdir, None)
    remote_inputs.upload_prepared(inputs)
    s = inputs.settings
    data, tokenizer = pretraining_data.batches(s, prepared), prepared.tokenizer
    with data.train_iterator(flag_values.step) as batches_from:
        batches = [next(batches_from) for _ in range(flag_values.batches)]
    print(f"step {flag_values.step}, {data.local_batch_size} examples a batch, mode {data.mode}")
    print(describe_batch(batches[0], tokenizer, flag_values.examples, data.mode))
    print(f"statistics over {len(batches)} batches:")
    print(format_statistics(batch_statistics(batches, tokenizer)))
    if flag_values.dump:
        write_dump(flag_values.dump, batches, overwrite=flag_values.overwrite)
        print(f"wrote {flag_values.dump}")


if __name__ == "__main__":
    main()
