"""`python -m bertjax.bench --task finetune`: one epoch of fine-tuning on the config's real
training data, ours against transformers' PyTorch model, in the same run.

Ours is the job's own pieces: the task's features and model, the recipe's optimizer, the
generic donated train step, and the job's batch order (EpochBatches, with the config's length
buckets), one step compiled per bucket as the job does (all compiled before timing, the compile time
shown apart); timed twice, with buckets and with every batch padded to max_seq_len, so the table
shows what bucketing buys; with train.packing=true also with packed rows (several sentences a
row, bertjax.finetune.packing; batch_size then counts packed rows), so it shows what packing buys
over both. The runs' steps are interleaved (turns of BLOCK_STEPS steps, each
run to completion), so a change in the machine's load falls on all alike. The peer is what a
transformers user runs: the matching `*ForSequenceClassification` / `*ForTokenClassification`,
AdamW with the same settings, the same rows in a seeded random order, each batch padded to its
own longest row (DataCollatorWithPadding), gradient clipping. Both start from the same random
initialization (the weights do not change the time); `--torch-bf16` runs the peer under
`torch.autocast("cpu", dtype=torch.bfloat16)`, our precision is the config's model.dtype.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from bertjax.bench.torch_peer import cpu_threads, hf_config, peer_libraries
from bertjax.core.errors import UserError
from bertjax.finetune.batches import EpochBatches
from bertjax.finetune.distillation import task_objective
from bertjax.finetune import length_bucketing
from bertjax.finetune.packing import PackedBatches
from bertjax.finetune.schema import abstract_batch
from bertjax.jobs.task_data import read_task_data
from bertjax.jobs.starting_point import starting_point
from bertjax.parallel import partitioning
from bertjax.settings import FinetuneSettings
from bertjax.train.compilation import compile_step
from bertjax.train.optimizer import make_optimizer
from bertjax.train.state import create_train_state, param_count
from bertjax.train.step import make_train_step

TASKS = {"finetune_classification": "sequence", "finetune_token_classification": "token"}


@dataclasses.dataclass
class EpochTiming:
    label: str
    seconds: float  # the epoch's steps, compiled steps only
    compile_seconds: float
    compiles: int
    tokens: int  # tokens the steps processed, padding included
    real_tokens: int
    steps: int
    loss: float

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "padded_tokens_per_real": self.tokens /
                max(self.real_tokens, 1) - 1}


def check_task(task: str) -> None:
    """Refuses, before its settings are read, a config of a task this benchmark does not time."""
    if task not in TASKS:
        raise UserError(f"--task finetune times {', '.join(TASKS)}; the config's task is "
                        f"{task!r}")


def read(s: FinetuneSettings, examples: int | None):
    """(settings, start, data): the job's settings with `examples` training rows (if given) and
    one evaluation row, its starting point and its data."""
    check_task(s.task)
    data = dataclasses.replace(s.data, max_eval_examples=1, **(
        {"max_train_examples": examples} if examples else {}))
    s = dataclasses.replace(s, data=data)
    if s.method.name != "full" or s.distill is not None:
        raise UserError("--task finetune times full fine-tuning (finetune.method=full, no "
                        "distill.teacher)")
    start = starting_point(s, with_params=False)
    return s, start, read_task_data(s, start.tokenizer)


class OurEpoch:
    def __init__(self, s, start, data, buckets: tuple[int, ...], packing: bool = False):
        self.s, self.data = s, data
        self.mesh = s.mesh.make()
        arrays = data.train_features.arrays
        if packing:
            self.batches = PackedBatches(arrays, s.train.batch_size, s.train.seed,
                                         s.task_settings.max_seq_len, data.task.packed_batch)
        else:
            self.batches = EpochBatches(arrays, s.train.batch_size, s.train.seed,
                                        buckets=buckets)
        self.model = data.task.model(start.encoder, False)
        self.optimizer = make_optimizer(s.optimizer_config(self.batches.steps_per_epoch))
        template = self.batches.template if packing else arrays
        self.shapes = abstract_batch(template, s.train.batch_size,
                                     partitioning.batch_sharding(self.mesh))
        self.state, self.shardings = create_train_state(self.model, self.optimizer, self.shapes,
                                                        self.mesh, s.train.seed)
        self.abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), self.state)
        self.params = param_count(self.state.params)
        self.step = make_train_step(self.model, self.optimizer, self.mesh, self.shardings,
                                    accumulation_steps=s.train.accumulation_steps,
                                    objective=task_objective(data.task, None))
        self.compiled: dict = {}
        self.compile_seconds = 0.0

    def _compiled(self, length: int):
        if length not in self.compiled:
            compiled = compile_step(self.step, self.abstract,
                                    length_bucketing.cut_shapes(self.shapes, length),
                                    name="bench step", verbose=False)
            self.compile_seconds += compiled.compile_seconds
            self.compiled[length] = compiled
        return self.compiled[length]

    def prepare(self):
        """Compiles every shape the epoch needs and places its batches; returns (one thunk per
        step, running it to completion, and a function giving the EpochTiming from the seconds
        the thunks took)."""
        steps = self.batches.steps_per_epoch
        host = [self.batches.batch(i) for i in range(steps)]
        for length in sorted({b["input_mask"].shape[1] for b in host}):
            self._compiled(length)
        placed = [partitioning.global_batch(b, self.mesh) for b in host]
        last = {}

        def thunk(batch, length):
            def step():
                self.state, last["metrics"] = self.compiled[length](self.state, batch)
                jax.block_until_ready(last["metrics"]["loss"])
            return step

        thunks = [thunk(b, h["input_mask"].shape[1]) for b, h in zip(placed, host)]
        # A row is real if any of its sequences is (a packed row's weight is per sequence).
        real = sum(int(b["input_mask"][b["weight"].reshape(len(b["weight"]), -1).max(1) > 0]
                       .sum()) for b in host)
        tokens = sum(b["input_mask"].size for b in host)

        def timing(label: str, seconds: float) -> EpochTiming:
            loss = float(jax.device_get(last["metrics"]["loss"]))
            return EpochTiming(label, seconds, self.compile_seconds, len(self.compiled), tokens,
                               real, steps, loss)

        return thunks, timing


class TorchEpoch:
    """transformers' model for the task, trained an epoch with dynamic padding."""

    def __init__(self, s, start, data, *, bf16: bool):
        torch, transformers = peer_libraries()
        self.torch, self.bf16 = torch, bf16
        self.threads = cpu_threads()
        torch.set_num_threads(self.threads)
        torch.manual_seed(s.train.seed)
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        kind = TASKS[s.task]
        labels = len(data.task.labels)
        cls = (transformers.BertForSequenceClassification if kind == "sequence"
               else transformers.BertForTokenClassification)
        self.model = cls(hf_config(start.encoder, num_labels=labels)).train()
        self.params = sum(p.numel() for p in self.model.parameters())
        o = s.optimizer_config(1)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=o.learning_rate,
                                           betas=(o.b1, o.b2), eps=o.eps,
                                           weight_decay=o.weight_decay)
        self.clip_norm = o.clip_norm
        self.kind = kind
        self.arrays = data.train_features.arrays
        self.batch_size = s.train.batch_size
        self.seed = s.train.seed

    def _batches(self) -> list[dict]:
        """A seeded random order, each batch padded to its longest row (the last one short)."""
        torch, a = self.torch, self.arrays
        lengths = a["input_mask"].sum(axis=1)
        order = np.random.default_rng(self.seed).permutation(len(lengths))
        out = []
        for first in range(0, len(order), self.batch_size):
            rows = order[first:first + self.batch_size]
            t = int(lengths[rows].max())
            batch = {"input_ids": a["input_ids"][rows, :t],
                     "token_type_ids": a["segment_ids"][rows, :t],
                     "attention_mask": a["input_mask"][rows, :t]}
            if self.kind == "sequence":
                batch["labels"] = a["label"][rows]
            else:
                labels = np.where(a["label_mask"][rows, :t] > 0, a["label_ids"][rows, :t], -100)
                batch["labels"] = labels
            out.append({k: torch.from_numpy(np.asarray(v, np.int64)) for k, v in batch.items()})
        return out

    def prepare(self):
        torch = self.torch
        batches = self._batches()
        last = {}

        def thunk(batch):
            def step():
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                    loss = self.model(**batch).loss
                loss.backward()
                if self.clip_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                last["loss"] = float(loss.detach().float())
            return step

        tokens = sum(b["input_ids"].numel() for b in batches)
        real = sum(int(b["attention_mask"].sum()) for b in batches)

        def timing(label: str, seconds: float) -> EpochTiming:
            return EpochTiming(label, seconds, 0.0, 0, tokens, real, len(batches), last["loss"])

        return [thunk(b) for b in batches], timing


# Consecutive steps a run takes before the next run's turn. The first step after another
# framework ran is the slower one (the memory it freed is faulted back in; its idle workers may
# still spin), so a turn of one step charged every step with that.
BLOCK_STEPS = 8


def interleaved(runs: list[tuple[list, object]], labels: list[str]) -> list[EpochTiming]:
    """Each run's epoch timed step by step, the runs taking turns of BLOCK_STEPS steps, so a
    change in the machine's load falls on all of them alike."""
    spent = [0.0] * len(runs)
    for first in range(0, max(len(thunks) for thunks, _ in runs), BLOCK_STEPS):
        for r, (thunks, _) in enumerate(runs):
            for thunk in thunks[first:first + BLOCK_STEPS]:
                started = time.perf_counter()
                thunk()
                spent[r] += time.perf_counter() - started
    return [timing(label, seconds) for (_, timing), label, seconds in zip(runs, labels, spent)]


def run(options, s: FinetuneSettings) -> dict:
    """The epochs timed; `options`: the command's --examples, --compare-torch, --torch-bf16."""
    s, start, data = read(s, options.examples)
    max_len = s.task_settings.max_seq_len
    buckets = s.train.buckets(max_len)
    rows = len(data.train_features)
    ours = OurEpoch(s, start, data, buckets)
    runs, labels = [ours.prepare()], [f"bertjax, buckets {'/'.join(map(str, buckets))}"]
    if len(buckets) > 1:
        runs.append(OurEpoch(s, start, data, (max_len,)).prepare())
        labels.append(f"bertjax, padded to {max_len}")
    if s.train.packing:
        packed = OurEpoch(s, start, data, (max_len,), packing=True)
        runs.append(packed.prepare())
        labels.append(f"bertjax, packed (up to {packed.batches.slots} a row)")
    peer = None
    if options.compare_torch:
        peer = TorchEpoch(s, start, data, bf16=options.torch_bf16)
        precision = "bf16 autocast" if options.torch_bf16 else "fp32"
        runs.append(peer.prepare())
        labels.append(f"transformers {peer.versions['transformers']}, dynamic padding, "
                      f"{precision}")
    timings = interleaved(runs, labels)
    result = {"task": s.task, "rows": rows, "batch": s.train.batch_size, "max_seq_len": max_len,
              "dtype": start.encoder.dtype, "matmul_dtype": start.encoder.operand_dtype,
              "params": ours.params,
              "devices": ours.mesh.devices.size, "platform": jax.devices()[0].platform,
              "torch_threads": peer.threads if peer else None,
              "epochs": [dict(t.as_dict(), examples_per_s=rows / t.seconds) for t in timings]}
    if s.train.packing:
        packed_seconds = timings[len(timings) - 1 - (peer is not None)].seconds
        result["packed_speedup"] = {t.label: t.seconds / packed_seconds for t in timings}
    if peer is not None:
        result["speedup_vs_torch"] = timings[-1].seconds / timings[0].seconds
        result["speedup_vs_torch_with_compile"] = timings[-1].seconds / (
            timings[0].seconds + timings[0].compile_seconds)
    return result


def describe(r: dict) -> str:
    lines = [f"task:     {r['task']}, {r['rows']:,} training rows, batch {r['batch']}, "
             f"max_seq_len {r['max_seq_len']}, {r['params']:,} parameters, our dtype "
             f"{r['dtype']} (matmul operands {r['matmul_dtype']}), {r['devices']} x "
             f"{r['platform']}"
             + (f", torch {r['torch_threads']} threads" if r["torch_threads"] else ""),
             "| run | epoch s | examples/s | compile s (shapes) | padding tokens per real "
             "token | last loss |", "|---|---|---|---|---|---|"]
    for e in r["epochs"]:
        compiled = f"{e['compile_seconds']:.1f} ({e['compiles']})" if e["compiles"] else "-"
        lines.append(f"| {e['label']} | {e['seconds']:.2f} | {e['examples_per_s']:,.0f} | "
                     f"{compiled} | {e['padded_tokens_per_real']:.2f} | {e['loss']:.4f} |")
    if "packed_speedup" in r:
        faster = [f"{ratio:.2f}x faster than {label}"
                  for label, ratio in r["packed_speedup"].items()
                  if not label.startswith("bertjax, packed")]
        lines.append(f"packed:   an epoch {'; '.join(faster)}")
    if "speedup_vs_torch" in r:
        lines.append(f"ratio:    {r['speedup_vs_torch']:.2f}x transformers' epoch time "
                     f"({r['speedup_vs_torch_with_compile']:.2f}x counting our compilation)")
    return "\n".join(lines)
