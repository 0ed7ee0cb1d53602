"""Corpus preparation as an Apache Beam pipeline (`python -m bertjax.data.prepare --runner=...`):
the local engine's corpus, byte for byte, with the reading and tokenizing spread over a runner's
workers.

preparation_engine.prepare plans, locks, saves the tokenizer and writes the manifest last, as
it does locally; the pipeline only does the middle:

  inputs --reshuffled, one input a worker--> (input i, document n of it, document) and each
      input's SourceStats (sources.documents_of)
  the inputs' document counts --> each input's first document number in the whole corpus
  documents --> shard (number // K), grouped, in number order --> shard_writing.tokenize_and_write

so shard i holds documents [i*K, (i+1)*K) in source order, as locally, and a shard complete
already is kept. Workers write into the output directory itself: it must be one every worker
sees (this machine's, or a filesystem they share), or, with `output_url`, a bucket's URL the
driver's local working copy is uploaded to: there workers upload their shards straight into
OUTPUT_URL/shards/ and fetch inputs named by URL themselves (beam_storage.py), which is what
Dataflow needs. The sources' stats come back through one hidden JSON file in the output, read
and removed before the manifest.

apache_beam (the beam extra) is imported only when a pipeline is built or its steps run, never
when this module is: the core and its commands import this module without paying for Beam.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import operator
import os
import re
import sys
import tempfile
from typing import Iterator, Sequence

from bertjax.core import extras, storage
from bertjax.core.errors import UserError
from bertjax.data import beam_storage, corpus, sources
from bertjax.data.shard_writing import read_shard_stats, tokenize_and_write
from bertjax.data.sources import SourceStats
from bertjax.data.tokenizer import Tokenizer

# --runner values. `direct` runs on Beam's FnApiRunner, the engine the DirectRunner uses for a
# batch pipeline: the DirectRunner itself first downloads the Prism runner's binary from GitHub.
RUNNERS = {"direct": "apache_beam.runners.portability.fn_api_runner.FnApiRunner",
           "dataflow": "DataflowRunner", "flink": "FlinkRunner", "spark": "SparkRunner"}
SOURCE_STATS = ".beam-source-stats.json"
_STATS_TAG = "stats"
# What Beam appends to a step's error: " [while running 'read/FlatMap(_read_input)']".
_STEP_SUFFIX = re.compile(r" \[while running '[^']*'\]$")


def _beam(purpose: str):
    return extras.require("apache_beam", "beam", purpose)


class BeamWriter:
    """preparation_engine.DistributedWriter on a Beam runner; built (and its pipeline options
    checked, in one line) before anything is written. With `output_url` the shards go to that
    bucket URL (the output directory is then the driver's working copy, uploaded afterwards)."""

    def __init__(self, runner: str, flags: Sequence[str], output_url: str | None = None):
        if runner not in RUNNERS:
            raise UserError(f"unknown runner {runner!r}; expected one of {', '.join(RUNNERS)}")
        self.runner = runner
        self.output_url = output_url
        purpose = f"preparing with --runner={runner}"
        beam = _beam(purpose)
        self._options = _pipeline_options(beam, list(flags))
        try:
            self._runner = beam.runners.create_runner(RUNNERS[runner])
        except (ImportError, RuntimeError, ValueError) as e:
            raise UserError(f"{purpose} failed: {_first_line(e)} "
                            f"({extras.install_command('beam')})") from None
        errors = _option_errors(beam, runner, self._runner, list(flags), purpose)
        if errors:
            raise UserError(f"bad options for the {runner} runner: "
                            + "; ".join(" ".join(e.split()) for e in errors))

    def __call__(self, files: list[str], input_format: str, output_dir: str,
                 tokenizer: Tokenizer, documents_per_shard: int, max_line_chars: int,
                 tfds_data_dir: str | None,
                 stats: SourceStats) -> tuple[list[corpus.ShardStats], int]:
        sources.check_readable_text([f for f in files if not storage.is_url(f)])
        remote = self.output_url
        if remote is not None:
            beam_storage.claim(remote, output_dir)
            kept = beam_storage.complete_shards(remote)
        else:
            kept = _complete_shards(output_dir)
        try:
            return self._run(files, input_format, output_dir, tokenizer, documents_per_shard,
                             max_line_chars, tfds_data_dir, stats, kept)
        except UserError:
            if remote is not None and not beam_storage.complete_shards(remote):
                beam_storage.unclaim(remote)  # no plan ties the bucket to inputs being fixed
            raise

    def _run(self, files: list[str], input_format: str, output_dir: str, tokenizer: Tokenizer,
             documents_per_shard: int, max_line_chars: int, tfds_data_dir: str | None,
             stats: SourceStats, kept: set[int]) -> tuple[list[corpus.ShardStats], int]:
        remote = self.output_url
        target = remote or output_dir
        beam = _beam(f"preparing with --runner={self.runner}")
        pipeline = beam.Pipeline(runner=self._runner, options=self._options)
        _add_steps(beam, pipeline, files, input_format, target, tokenizer,
                   documents_per_shard, max_line_chars, tfds_data_dir)
        try:
            # The local job service relays each worker's routine warnings (a worker's errors
            # fail the pipeline and are reported from here).
            with _quiet_logs("apache_beam.runners.portability.local_job_service"), \
                    _worker_stderr_aside():
                pipeline.run().wait_until_finish()
        except Exception as e:  # a runner wraps a worker's error in its own types
            raise _worker_error(e, self.runner) from None
        stats.add(_take_source_stats(target))
        if stats.documents == 0:
            raise sources.empty_corpus(files, input_format, stats, max_line_chars)
        count = -(-stats.documents // documents_per_shard)
        shards = [beam_storage.shard_stats(remote, i) if remote else
                  read_shard_stats(output_dir, i) for i in range(count)]
        return shards, sum(s.tokens for i, s in enumerate(shards) if i not in kept)


def _pipeline_options(beam, flags: list[str]):
    """PipelineOptions from the flags the command did not know; a UserError for one Beam does
    not know either, or a bad value (Beam's parser would print its usage and exit)."""
    options = beam.options.pipeline_options.PipelineOptions(flags)
    usage = io.StringIO()
    try:
        # Beam logs a warning for each unknown flag it drops: refused below in one line instead.
        with contextlib.redirect_stderr(usage), _quiet_logs("apache_beam"):
            known = options.get_all_options()
            every = options.get_all_options(retain_unknown_options=True)
    except SystemExit:
        lines = usage.getvalue().strip().splitlines() or ["bad Beam option"]
        raise UserError(lines[-1].split("error: ", 1)[-1]) from None
    unknown = sorted(set(every) - set(known))
    if unknown:
        raise UserError("unknown options (neither the command's nor Beam's): "
                        + ", ".join(f"--{name}" for name in unknown))
    return options


def _option_errors(beam, runner: str, runner_object, flags: list[str], purpose: str) -> list[str]:
    """What Beam's validator finds wrong with the options, checked offline: Dataflow's would
    otherwise look its buckets up (or make one) on Cloud Storage, retrying for minutes."""
    if runner == "dataflow":
        cloud = beam.options.pipeline_options.PipelineOptions(flags).view_as(
            beam.options.pipeline_options.GoogleCloudOptions)
        if not (cloud.temp_location or "").startswith("gs://"):
            return ["--temp_location=gs://BUCKET/PATH is needed (where Dataflow stages the "
                    f"package and its temporary files), not {cloud.temp_location!r}"]
    offline = beam.options.pipeline_options.PipelineOptions([*flags, "--dry_run=true"])
    validator = extras.require("apache_beam.options.pipeline_options_validator", "beam",
                               purpose).PipelineOptionsValidator
    try:
        return validator(offline, runner_object).validate()
    except Exception as e:  # Beam's validators raise their own types
        return [_first_line(e)]


@contextlib.contextmanager
def _quiet_logs(name: str) -> Iterator[None]:
    """The logger `name` passes only errors meanwhile."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _worker_stderr_aside() -> Iterator[None]:
    """File descriptor 2 on a temporary file meanwhile: the DirectRunner's multi_processing
    workers inherit it, and Beam prints a failed bundle's traceback there (reported from here,
    in one line, instead)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as aside:
        os.dup2(aside.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _add_steps(beam, pipeline, files: list[str], input_format: str, output_dir: str,
               tokenizer: Tokenizer, documents_per_shard: int, max_line_chars: int,
               tfds_data_dir: str | None) -> None:
    read = (pipeline
            | "inputs" >> beam.Create(list(enumerate(files)))
            | "spread inputs" >> beam.Reshuffle()  # else all are read where Create ran
            | "read" >> beam.FlatMap(_read_input, input_format, max_line_chars, tfds_data_dir)
            .with_outputs(_STATS_TAG, main="documents"))
    per_input = read[_STATS_TAG] | "input stats" >> beam.combiners.ToList()
    firsts = per_input | "first numbers" >> beam.Map(_first_numbers)
    (read.documents
     | "place" >> beam.Map(_place, beam.pvalue.AsSingleton(firsts), documents_per_shard)
     | "group shards" >> beam.GroupByKey()
     | "write shards" >> beam.Map(_write_shard, tokenizer, output_dir))
    _ = per_input | "save stats" >> beam.Map(_save_source_stats, output_dir)


def _read_input(item: tuple[int, str], input_format: str, max_line_chars: int,
                tfds_data_dir: str | None):
    tagged = _beam("reading an input in a Beam worker").pvalue.TaggedOutput
    number, path = item
    stats = SourceStats()
    local = beam_storage.local_input(path) if storage.is_url(path) else path
    documents = sources.documents_of(local, input_format, stats, max_line_chars=max_line_chars,
                                     tfds_data_dir=tfds_data_dir)
    try:
        for n, document in enumerate(documents):
            yield number, n, document
    except UserError as e:  # named by its URL, not by this worker's copy
        raise UserError(str(e).replace(local, path)) from None
    yield tagged(_STATS_TAG, (number, stats))


def _first_numbers(per_input: list[tuple[int, SourceStats]]) -> dict[int, int]:
    """Each input's first document number in the whole corpus (inputs in the given order)."""
    firsts, total = {}, 0
    for number, stats in sorted(per_input, key=operator.itemgetter(0)):
        firsts[number] = total
        total += stats.documents
    return firsts


def _place(item: tuple[int, int, list[str]], firsts: dict[int, int],
           documents_per_shard: int) -> tuple[int, tuple[int, list[str]]]:
    input_number, n, document = item
    number = firsts[input_number] + n
    return number // documents_per_shard, (number, document)


def _write_shard(keyed: tuple[int, list[tuple[int, list[str]]]], tokenizer: Tokenizer,
                 output_dir: str) -> None:
    index, placed = keyed
    remote = storage.is_url(output_dir)
    if (beam_storage.shard_is_complete if remote else corpus.shard_is_complete)(output_dir, index):
        return
    group = [document for _, document in sorted(placed, key=operator.itemgetter(0))]
    if remote:
        beam_storage.write_shard(output_dir, index, group, tokenizer)
    else:
        tokenize_and_write(tokenizer, output_dir, index, group)


def _save_source_stats(per_input: list[tuple[int, SourceStats]], output_dir: str) -> None:
    total = SourceStats()
    for _, stats in per_input:
        total.add(stats)
    storage.write_bytes(storage.join(output_dir, SOURCE_STATS),
                        json.dumps(total.to_json()).encode())


def _take_source_stats(output_dir: str) -> SourceStats:
    path = storage.join(output_dir, SOURCE_STATS)
    try:
        saved = json.loads(storage.read_bytes(path))
        storage.remove(path)
    except (OSError, ValueError, UserError) as e:
        raise UserError(f"the pipeline left no readable {path} (is the output directory one "
                        f"every worker writes to?): {e}") from None
    total = SourceStats(saved["documents"], saved["sentences"], cut_documents=saved["cut_documents"])
    total.skipped_lines.update(saved["skipped_lines"])
    total.skipped_pages.update(saved["skipped_pages"])
    return total


def _complete_shards(output_dir: str) -> set[int]:
    parent = os.path.join(output_dir, corpus.SHARDS_DIR)
    names = os.listdir(parent) if os.path.isdir(parent) else []
    return {int(n.rsplit("-", 1)[1]) for n in names if n.startswith("shard-")}


def _worker_error(error: Exception, runner: str) -> UserError:
    """One line for a failed pipeline: a worker's UserError as itself, else the runner's error."""
    text = str(error)
    marker = f"{UserError.__name__}: "
    if isinstance(error, UserError):  # raised again as itself, the step's name appended
        found = _first_line(error)
    elif marker in text:  # a portable runner's report holds the worker's traceback
        found = text.rsplit(marker, 1)[1].strip().splitlines()[0]
    else:
        return UserError(f"the {runner} pipeline failed: {_first_line(error)}")
    return UserError(_STEP_SUFFIX.sub("", found))


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
