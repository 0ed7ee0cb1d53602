"""The one model loader: any checkpoint kind -> encoder config, parameters, tokenizer and heads.

    a run's workdir      WORKDIR/run.json + WORKDIR/checkpoints/<step>/state (pretraining or
                         fine-tuning; a fine-tuning run with restarts is followed to its best)
    a params export      DIR/bertjax.json + DIR/params + DIR/tokenizer (`bertjax.cli.export`,
                         `bertjax.cli.convert`)
    an adapters export   the same files holding only what an adapter / LoRA run trained; the
                         base they adapt (recorded, or `base=`) is loaded under them
    a Hugging Face BERT  DIR/config.json + model.safetensors or pytorch_model.bin (+ vocab.txt),
                         converted in memory: nothing is written

`describe(path)` reads the JSON records alone (no arrays); `load(path)` also reads the parameters
as numpy arrays. Fine-tuning, export, predict and pretraining's init checkpoint all come through
here, so a path means the same thing to every command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

from bertjax.core import json_records, storage, transfer
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import load_tokenizer
from bertjax.interop import adapters_dir, hf_files, hf_models, params_dir
from bertjax.model import gdes
from bertjax.model.config import EncoderConfig

ORBAX_COMMITTED = "commit_success.txt"  # what Orbax writes last into a step on a bucket
RUN_RECORD = "run.json"
RESULTS_FILE = "results.json"
CHECKPOINTS = "checkpoints"
WORKDIR, PARAMS, HUGGING_FACE, ADAPTERS = "workdir", "params", "hf", "adapters"


@dataclasses.dataclass
class Loaded:
    path: str                        # where it was read from (a restart's workdir when followed)
    kind: str                        # WORKDIR, PARAMS or HUGGING_FACE
    encoder: EncoderConfig | None    # None when the source does not record it
    heads: dict                      # run.json / bertjax.json "heads": which heads the params have
    record: dict                     # the source's whole JSON record (run.json or bertjax.json)
    tokenizer_dir: str | None
    step: int | None = None
    params: dict | None = None       # numpy tree; None from describe()
    _tokenizer: Any = None           # already built (a Hugging Face directory's vocab.txt)

    @property
    def info(self) -> dict:
        """The record, with where the parameters came from (what an export keeps)."""
        where = {"source": self.path, "step": self.step} if self.kind == WORKDIR else {}
        return {**self.record, **where}

    @property
    def has_tokenizer(self) -> bool:
        return self._tokenizer is not None or self.tokenizer_dir is not None

    def tokenizer(self, override: str = ""):
        """The model's own tokenizer (or `override`'s); UserError when none is known."""
        if override:
            return load_tokenizer(override)
        if self._tokenizer is not None:
            return self._tokenizer
        if not self.tokenizer_dir:
            raise UserError(f"{self.path} keeps no tokenizer; name its vocabulary "
                            "(--config.data.tokenizer or --tokenizer)")
        return load_tokenizer(self.tokenizer_dir)

    def require_encoder(self) -> EncoderConfig:
        if self.encoder is None:
            raise UserError(f"{self.path} does not record its model config (no run.json with an "
                            "encoder entry); cannot tell what the parameters are")
        return self.encoder


def kind_of(path: str) -> str:
    given, path = path, fetched(path)
    with named_errors(given, path):
        return _kind_of(path)


def _kind_of(path: str) -> str:
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path}")
    if params_dir.is_params_dir(path):
        info = read_json(os.path.join(path, params_dir.INFO_FILE))
        return ADAPTERS if info.get("format") == adapters_dir.FORMAT else PARAMS
    if os.path.isdir(os.path.join(path, CHECKPOINTS)) or os.path.isfile(
            os.path.join(path, RESULTS_FILE)):
        return WORKDIR
    if os.path.isfile(os.path.join(path, "config.json")):
        return HUGGING_FACE
    raise UserError(f"{path} is not a model: neither a bertjax workdir (with checkpoints/), a "
                    f"params export (with {params_dir.INFO_FILE}) nor a Hugging Face BERT "
                    "directory (with config.json)")


def describe(path: str) -> Loaded:
    """What `path` holds, from its JSON records alone (no arrays are read)."""
    given, path = path, fetched(path)
    with named_errors(given, path):
        kind = _kind_of(path)
        if kind in (PARAMS, ADAPTERS):
            return _named(_describe_params(path, kind), given)
        if kind == WORKDIR:
            return _named(_describe_workdir(_followed(path)), given)
        return _named(_load_hugging_face(path, with_params=False), given)


@contextlib.contextmanager
def named_errors(given: str, local: str) -> Iterator[None]:
    """A refusal about a model read from a bucket names its URL, not this host's copy."""
    try:
        yield
    except UserError as e:
        if local == given or local not in str(e):
            raise
        raise UserError(str(e).replace(local, given)) from None


def _named(loaded: Loaded, given: str) -> Loaded:
    """A model read from a bucket names the URL (what records and messages show), not this
    host's copy of it."""
    if storage.is_url(given):
        loaded.path = storage.absolute(given)
    return loaded


def load(path: str, step: int | None = None, *, base: str | None = None) -> Loaded:
    """`describe(path)` with the parameters (a workdir's latest checkpoint, or `step`); an
    adapters export on `base` (default: the base it records)."""
    given, path = path, fetched(path, step)
    with named_errors(given, path):
        return _named(_load(path, step, base), given)


def _load(path: str, step: int | None, base: str | None) -> Loaded:
    kind = _kind_of(path)
    if step is not None and kind != WORKDIR:
        raise UserError(f"a checkpoint step was given, but {path} is not a workdir with "
                        "checkpoints/")
    if base is not None and kind != ADAPTERS:
        raise UserError(f"a base was given, but {path} is not an adapters export")
    if kind == HUGGING_FACE:
        return _load_hugging_face(path, with_params=True)
    if kind in (PARAMS, ADAPTERS):
        loaded = _describe_params(path, kind)
        loaded.params = params_dir.read_tree(os.path.join(path, params_dir.PARAMS_DIR))
        if kind == ADAPTERS:
            loaded.params = _on_base(loaded, base)
        return loaded
    loaded = _describe_workdir(_followed(path))
    loaded.step = _checkpoint_step(loaded.path, step)
    state = os.path.join(loaded.path, CHECKPOINTS, str(loaded.step), "state")
    # An ELECTRA run with GDES: its readers take the discriminator's word table merged.
    loaded.params = gdes.discriminator_view(params_dir.read_tree(state, subtree="params"))
    return loaded


def read_json(path: str) -> dict:
    """A JSON record ({} when absent); a damaged one is refused in one line."""
    if not os.path.exists(path):
        return {}
    try:
        return json_records.read_object(path)
    except json_records.NotAnObject as e:
        raise UserError(f"{path} {e}; restore it or use another directory") from None


def _encoder(record: dict, key: str, path: str) -> EncoderConfig | None:
    fields = record.get(key)
    if not fields:
        return None
    try:
        return EncoderConfig(**fields)
    except TypeError as e:
        raise UserError(f"{path} records a model config bertjax cannot read: {e}") from None


def _describe_params(path: str, kind: str = PARAMS) -> Loaded:
    info_file = os.path.join(path, params_dir.INFO_FILE)
    record = read_json(info_file)
    if record.get("format") not in (params_dir.FORMAT, adapters_dir.FORMAT):
        raise UserError(f"{path} is not a bertjax params export")
    tokenizer_dir = os.path.join(path, params_dir.TOKENIZER_DIR)
    return Loaded(os.path.abspath(path), kind, _encoder(record, "model", info_file),
                  record.get("heads", {}), record,
                  tokenizer_dir if os.path.isdir(tokenizer_dir) else None,
                  step=record.get("step"))


def fetched(path: str, step: int | None = None) -> str:
    """A model on a bucket, copied to this host (the cache, fetched again only when it changed):
    its records, tokenizer and parameters, and of a workdir's checkpoints only the one read (the
    newest, or `step`). A local path is returned as it is."""
    if not storage.is_url(path):
        return path
    steps = checkpoint_steps(path)
    wanted = str(step if step is not None else (steps[-1] if steps else ""))

    def skip(relative: str) -> bool:
        top, _, rest = relative.partition("/")
        if top == CHECKPOINTS:
            return rest.partition("/")[0] != wanted
        return top in ("tensorboard", ".lock")
    return transfer.local_copy(path, skip=skip)


def _on_base(loaded: Loaded, base: str | None) -> dict:
    """An adapters export's parameters put back on the encoder of its base."""
    base = base or loaded.record.get("base", {}).get("path", "")
    if not base or not os.path.exists(base):
        raise UserError(f"{loaded.path} holds adapters for the base {base or '(unrecorded)'}, "
                        "which is not there; name the base (bertjax.load(path, base=BASE))")
    return adapters_dir.combine(loaded.params, load(base).params, loaded.require_encoder(),
                                loaded.record, base)


def _followed(workdir: str) -> str:
    """A fine-tuning workdir with restarts keeps its models in the best restart's workdir."""
    results = read_json(os.path.join(workdir, RESULTS_FILE))
    best = results.get("best_workdir")
    if best and os.path.abspath(best) != os.path.abspath(workdir) and os.path.isdir(best):
        return best
    return workdir


def _describe_workdir(workdir: str) -> Loaded:
    run_file = os.path.join(workdir, RUN_RECORD)
    record = read_json(run_file)
    tokenizer_dir = record.get("tokenizer_dir") or ""
    if storage.is_url(tokenizer_dir) and storage.isdir(tokenizer_dir):  # a run on a bucket
        tokenizer_dir = transfer.local_copy(tokenizer_dir)
    return Loaded(os.path.abspath(workdir), WORKDIR, _encoder(record, "encoder", run_file),
                  record.get("heads", {}), record,
                  tokenizer_dir if os.path.isdir(tokenizer_dir) else None)


def checkpoint_steps(workdir: str) -> list[int]:
    """The complete checkpoints of a workdir (a local path or a URL), oldest first (nothing is
    created or locked). On a bucket a step is complete once Orbax has written its commit marker
    (there is no directory rename to wait for)."""
    directory = storage.join(workdir, CHECKPOINTS)
    if not storage.is_url(workdir):
        if not os.path.isdir(directory):
            return []
        return sorted(int(name) for name in os.listdir(directory) if name.isdigit()
                      and os.path.isdir(os.path.join(directory, name, "state")))
    return sorted(int(name) for name in storage.listdir(directory) if name.isdigit()
                  and storage.exists(storage.join(directory, name, ORBAX_COMMITTED)))


def _checkpoint_step(workdir: str, step: int | None) -> int:
    steps = checkpoint_steps(workdir)
    if not steps:
        raise UserError(f"{workdir} has no checkpoint yet")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise UserError(f"{workdir} has no checkpoint of step {step} (it has {steps})")
    return step


def _load_hugging_face(path: str, *, with_params: bool) -> Loaded:
    hf_config = hf_files.read_config(path)
    hf_models.check_architecture(hf_config)
    encoder = hf_models.encoder_config_from_hf(hf_config, scan_layers=True)
    tokenizer, _ = hf_files.read_tokenizer(path)
    params, initialized = None, []
    if with_params:
        imported = hf_models.from_hf(hf_config, hf_files.read_state_dict(path))
        encoder, params, initialized = imported.model, imported.params, imported.initialized
        if tokenizer is not None and tokenizer.vocab_size > encoder.vocab_size:
            raise UserError(f"{path}/{hf_files.VOCAB} has {tokenizer.vocab_size} tokens but the "
                            f"model embeds only {encoder.vocab_size}")
    heads = {"nsp": True, "sbo": False}
    return Loaded(os.path.abspath(path), HUGGING_FACE, encoder, heads,
                  {"hf_config": hf_config, "initialized": initialized}, None, params=params,
                  _tokenizer=tokenizer)
