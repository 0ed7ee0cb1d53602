"""`python -m bertjax.compile`: compile the real pretraining train step for a TPU slice on this
machine (no TPU needed: libtpu's compiler, from the `tpu` extra) and report, per chip, its HBM
against the chip's, its FLOPs, HBM traffic and collectives a step, and a roofline bound on its
step time. A config that does not fit a chip gets the setting training's train.fit=auto would
choose (remat, then accumulation, then fsdp; the report says how each phase was made to fit), or
with train.fit=off is refused with training's own one line (exit 2).

    python -m bertjax.compile --config=configs/platform.py:tpu_v4_32 --topology=v4-32
        [--num-slices=2] [--json OUT [--overwrite]] [--config.KEY=VALUE ...]

Slices are named as Google Cloud names them: v4-N and v5p-N count TensorCores (two a chip),
v5e-N (or v5litepod-N) and v6e-N count chips. The figures are estimates from the compiled HLO
and the chips' published peaks, not measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from bertjax import settings
from bertjax.aot import attention_report, report, topology
from bertjax.aot.minimum_bytes import minimum_bytes
from bertjax.aot.pretrain_step import PretrainTarget
from bertjax.cli import entry
from bertjax.cli.config_flags import overridden_keys, parse_config
from bertjax.core import json_records, output_dir
from bertjax.core.errors import EXIT_BAD_INPUT, UserError
from bertjax.core.errors import report as report_error
from bertjax.settings import PretrainSettings

USAGE = ("python -m bertjax.compile --config=FILE --topology=SLICE [--num-slices=N] "
         "[--json OUT [--overwrite]] [--config.KEY=VALUE ...]")


def _is_report(path: str) -> bool:
    try:
        found = json_records.read_object(path)
    except json_records.NotAnObject:
        return False
    return {"topology", "phases"} <= found.keys()


# What --json writes, and so the only file --overwrite replaces.
REPORT = output_dir.Kind("bertjax.compile report", directory=False, holds=_is_report)


def parse_args(argv: list[str]):
    """(options, settings); a bad flag, topology or config is a UserError."""
    parser = entry.ArgumentParser(prog="python -m bertjax.compile", usage=USAGE,
                                  allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--topology", required=True,
                        help="the TPU slice, e.g. v4-8, v4-32, v5e-8, v5e-256, v5p-64, v6e-8")
    parser.add_argument("--num-slices", type=int, default=1,
                        help="that many slices, joined by the data-center network (multislice)")
    parser.add_argument("--json", metavar="OUT",
                        help="also write the report to this file (a local path or gs://)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --json report")
    parser.add_argument("--config", metavar="FILE[:ARG]", help="the job's config file")
    options, rest = parser.parse_known_args(argv[1:])
    stray = [arg for arg in rest if not arg.startswith("--config.")]
    if stray:
        raise UserError(f"bad flags: unexpected {' '.join(stray)} (the config's settings are "
                        "given as --config.KEY=VALUE)")
    slice_ = topology.parse(options.topology)
    if options.num_slices < 1:
        raise UserError(f"--num-slices must be at least 1, got {options.num_slices}")
    config_args = [f"--config={options.config}"] if options.config else []
    config, _ = parse_config([argv[0], *config_args, *rest])
    s = settings.read(config, overridden_keys(argv))
    if not isinstance(s, PretrainSettings):
        raise UserError("bertjax.compile compiles pretraining configs (task=pretrain); "
                        f"this config's task is {s.task!r}")
    if options.json:  # refused before the compile, as every output is
        output_dir.check_target(options.json, overwrite=options.overwrite, kind=REPORT,
                                sources=[_config_file(options.config)])
    elif options.overwrite:
        raise UserError("--overwrite replaces the --json report: give --json OUT")
    return options, slice_, s


def _config_file(config: str | None) -> str | None:
    return config.split(":", 1)[0] if config else None


def run(options, slice_: topology.Slice, s: PretrainSettings) -> dict:
    """Compiles every phase (refusing a misfit) and returns the report."""
    devices = topology.devices(slice_, options.num_slices)
    memory_gb = s.train.device_memory_gb or slice_.chip.hbm_gib
    target = PretrainTarget(s, devices, memory_gb)
    compiled = target.compile_all()
    phases = [report.phase_report(c, slice_, len(devices), s.train.batch_size,
                                  minimum_bytes(c.state, c.batch, target.encoder, target.mesh,
                                                c.phase.seq_len))
              for c in compiled]
    s, encoder = target.s, target.encoder  # the setting train.fit chose
    attention = attention_report.attention_report(
        encoder, devices[0].platform, packed=s.objective.mode == "documents",
        phases=[(c.phase.seq_len, c.executable.as_text()) for c in compiled])
    return {
        "config": options.config, "topology": slice_.name, "libtpu_topology": slice_.libtpu_name,
        "num_slices": options.num_slices, "chips": len(devices),
        "device_kind": devices[0].device_kind, "chip": dataclasses.asdict(slice_.chip),
        "mesh": dict(target.mesh.shape),
        "model": (f"{s.model.preset} (L={encoder.num_layers}, H={encoder.hidden_size}), "
                  f"objective {s.objective.name}, {encoder.dtype}, "
                  f"scan_layers={encoder.scan_layers}, remat={encoder.remat}, "
                  f"accumulation {s.train.accumulation_steps}"),
        "phases": phases,
        "fit": target.fit.record(),  # what train.fit changed, and how each phase was made to fit
        "attention": attention,
        "note": "estimates from the compiled HLO and published chip peaks, not measurements",
    }


@entry.command
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    try:
        options, slice_, s = parse_args(argv)
        result = run(options, slice_, s)
        if options.json:
            with output_dir.staged_file(options.json, overwrite=options.overwrite, kind=REPORT,
                                        sources=[_config_file(options.config)], mode="w") as f:
                f.write(json.dumps(result, indent=2) + "\n")
    except UserError as e:
        report_error(str(e))
        return EXIT_BAD_INPUT
    print(report.describe(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
