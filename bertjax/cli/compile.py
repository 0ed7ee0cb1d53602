"""`python -m bertjax.compile`: compile the real pretraining train step for a TPU slice on this
machine (no TPU needed: libtpu's compiler, from the `tpu` extra) and report, per chip, its HBM
against the chip's, its FLOPs, HBM traffic and collectives a step, and a roofline bound on its
step time. A config that does not fit a chip is refused with training's own one line (exit 2).

    python -m bertjax.compile --config=configs/platform.py:tpu_v4_32 --topology=v4-32
        [--num-slices=2] [--json OUT] [--config.KEY=VALUE ...]

Slices are named as Google Cloud names them: v4-N and v5p-N count TensorCores (two a chip),
v5e-N (or v5litepod-N) and v6e-N count chips. The figures are estimates from the compiled HLO
and the chips' published peaks, not measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from bertjax import settings
from bertjax.aot import attention_report, report, topology
from bertjax.aot.pretrain_step import PretrainTarget
from bertjax.cli import entry
from bertjax.cli.config_flags import overridden_keys, parse_config
from bertjax.core import atomic_files
from bertjax.core.errors import EXIT_BAD_INPUT, UserError
from bertjax.core.errors import report as report_error
from bertjax.settings import PretrainSettings

USAGE = ("python -m bertjax.compile --config=FILE --topology=SLICE [--num-slices=N] "
         "[--json OUT] [--config.KEY=VALUE ...]")


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
    parser.add_argument("--json", metavar="OUT", help="also write the report to this file")
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
    return options, slice_, s


def run(options, slice_: topology.Slice, s: PretrainSettings) -> dict:
    """Compiles every phase (refusing a misfit) and returns the report."""
    devices = topology.devices(slice_, options.num_slices)
    memory_gb = s.train.device_memory_gb or slice_.chip.hbm_gib
    target = PretrainTarget(s, devices, memory_gb)
    compiled = target.compile_all()
    phases = [report.phase_report(c, slice_, len(devices), s.train.batch_size)
              for c in compiled]
    encoder = target.encoder
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
            atomic_files.write_json(options.json, result)
    except UserError as e:
        report_error(str(e))
        return EXIT_BAD_INPUT
    print(report.describe(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
