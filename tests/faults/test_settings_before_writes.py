"""Every setting is checked before the first write: each leaf of every training config, given
hostile values by its type, is refused by `python -m bertjax.main` in one line (exit 2, one
`bertjax: error:` line, the workdir not created), or is a value the table below accepts, with the
reason, and then reaches the workdir's opening without a word.

Numbers get a negative, 0, nan, inf, a huge value and text; strings an unknown choice, an empty
string and a path that does not exist; booleans text. The command runs in this process
(cli_in_process) with RunDirectory.open, the job's first write, replaced by a stop: a refused value
never reaches it (its workdir is then checked absent), an accepted one stops there instead of
training. Whether an accepted value then trains is the business of the tests of its feature.
"""

import importlib
import os

import ml_collections
import pytest

import cli_in_process
from bertjax.jobs import run_directory

pytestmark = pytest.mark.slow

PRETRAINING = ("base", "tiny", "demo", "budget", "large", "modernbert", "modernbert_large",
               "electra", "electra_small", "roberta", "spanbert", "no_attention_dropout", "mbert",
               "xlmr", "albert", "deberta")
HUGE_INT, HUGE_FLOAT = "99999999999", "1e30"


def hostile(value) -> tuple[str, ...]:
    if isinstance(value, bool):
        return ("lots",)
    if isinstance(value, int):
        return ("-1", "0", "nan", "inf", HUGE_INT, "lots")
    if isinstance(value, float):
        return ("-1", "0", "nan", "inf", HUGE_FLOAT, "lots")
    return ("bogus", "", "/nonexistent/dir/x")


def _zero(reason: str, *keys: str) -> dict:
    return {(key, "0"): reason for key in keys}


# (key, value) -> why the value may be a valid one (some are, with some configs only). Anything
# not here must be refused; whatever is refused, in one line.
ACCEPTED = {
    **_zero("0 is the preset's size", "model.hidden_size", "model.intermediate_size",
            "model.num_heads", "model.num_layers"),
    **_zero("0 is the paper's generator size", "electra.generator_hidden_size",
            "electra.generator_intermediate_size", "electra.generator_num_heads",
            "electra.generator_num_layers", "electra.generator_vocab_size"),
    **_zero("a share of 0 in the 80/10/10 choice", "masking.mask_token_prob",
            "masking.random_token_prob"),
    **_zero("0: no dropout", "model.attention_dropout", "model.hidden_dropout",
            "finetune.lora_dropout"),
    **_zero("0: off (no such step, limit or pause)", "train.checkpoint_every",
            "train.checkpoint_every_minutes", "train.eval_every", "train.eval_batches",
            "train.log_every", "train.time_budget_minutes", "optimizer.warmup_steps",
            "optimizer.weight_decay", "optimizer.clip_norm", "optimizer.end_learning_rate",
            "optimizer.decay_fraction", "optimizer.b1", "optimizer.b2",
            "optimizer.warmup_fraction", "schedule.long_fraction", "data.short_seq_prob",
            "data.eval_fraction", "train.bucket_multiple", "finetune.reinit_top_layers"),
    **_zero("0: keep every checkpoint", "train.keep_checkpoints"),
    **_zero("0: ask the device", "train.device_memory_gb"),
    **_zero("0: the model's rotary base", "schedule.short_rope_theta"),
    **_zero("0: batches built in the training process", "data.workers"),
    **_zero("0: no segment embeddings", "model.type_vocab_size"),
    **_zero("0: every layer global", "model.sliding_window"),
    **_zero("0: the teacher's term weighs nothing (plain fine-tuning)", "distill.alpha"),
    **_zero("0: a seed like any other", "train.seed"),
    **_zero("0: all the examples", "data.max_train_examples", "data.max_eval_examples",
            "data.max_train_examples_per_class"),
    **_zero("0: the method's key unused by method full", "finetune.adapter_size",
            "finetune.lora_rank", "finetune.prompt_length"),
    **_zero("0: evaluate the start only (zero-shot)", "train.epochs"),
    **_zero("0: epochs decide", "train.steps"),
    **_zero("0: train.batch_size", "train.eval_batch_size"),
    **_zero("0: no translation language modelling", "data.tlm_fraction"),
    **_zero("0: no factorised embeddings", "model.embedding_size"),
    **_zero("0: no log buckets (DeBERTa)", "model.position_buckets"),
    **_zero("0: max_position_embeddings (DeBERTa)", "model.max_relative_positions"),
    **_zero("0: no enhanced mask decoder (DeBERTa)", "model.enhanced_mask_decoder"),
    **{(key, "-1"): "-1: every device" for key in ("mesh.data", "mesh.devices")},
    **{(key, ""): "empty: the documented default" for key in (
        "init_checkpoint", "data.prepared", "data.tokenizer", "model.attention_implementation",
        "model.matmul_dtype", "train.fill_mask_examples", "train.profile_steps", "data.format",
        "data.labels", "data.positive_label", "data.id_column", "data.text_pair_column",
        "data.negative_column", "train.main_metric", "predict_output", "data.tfds_data_dir",
        "finetune.verbalizer", "data.predict", "data.languages", "data.parallel")},
    **{("data.prepared", value): "where the corpus is prepared (created when missing)"
       for value in ("bogus", "/nonexistent/dir/x")},
    **{(key, HUGE_FLOAT): "finite: a large value is a choice, not a fault" for key in (
        "model.layer_norm_eps", "model.rope_theta", "model.rope_local_theta",
        "schedule.short_rope_theta", "optimizer.clip_norm", "optimizer.eps",
        "optimizer.learning_rate", "optimizer.weight_decay", "train.checkpoint_every_minutes",
        "train.device_memory_gb", "train.time_budget_minutes", "electra.discriminator_weight",
        "finetune.temperature", "finetune.lora_alpha", "distill.temperature")},
}
# Fine-tuning reads a column, a file of another mode, or a TFDS directory only where its data
# needs it: a name is any text (a missing column is refused when the data is read, before the
# workdir); predict-mode keys are not read by a training run.
FREE_TEXT = ("data.id_column", "data.label_column", "data.text_column", "data.text_pair_column",
             "data.negative_column", "data.span_start_column", "data.span_end_column",
             "data.predict", "data.tfds_data_dir", "predict_output")


def accepted(key: str, value: str) -> bool:
    return (key, value) in ACCEPTED or key in FREE_TEXT


class Stopped(BaseException):
    """Raised where the job would create its workdir: the value got past every check."""


@pytest.fixture
def stopped_at_first_write(monkeypatch):
    def stop(self):
        raise Stopped(self.path)
    monkeypatch.setattr(run_directory.RunDirectory, "open", stop)


def leaves(config: ml_collections.ConfigDict, prefix: str = ""):
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def problems(config_name: str, base: dict, tmp_path, only: str = "") -> list[str]:
    """Every hostile value of every leaf (of section `only` if given) run; what went wrong."""
    config = importlib.import_module(f"configs.{config_name}").get_config()
    found = []
    for n, (key, default) in enumerate(leaves(config)):
        if not key.startswith(only):
            continue
        for m, value in enumerate(hostile(default)):
            workdir = str(tmp_path / f"wd-{n}-{m}")
            args = ([f"--config=configs/{config_name}.py", f"--workdir={workdir}"]
                    + [f"--config.{k}={v}" for k, v in base.items() if k != key]
                    + [f"--config.{key}={value}"])
            case = f"{config_name} {key}={value!r}"
            try:
                done = cli_in_process.run("main", *args)
            except Stopped:
                done = None
                if not accepted(key, value):
                    found.append(f"{case}: accepted, and not in ACCEPTED")
            if os.path.exists(workdir):
                found.append(f"{case}: the workdir was created")
            if done is None:
                continue
            lines = done.stderr.splitlines()
            if (done.returncode, len(lines)) != (2, 1) or \
                    not lines[0].startswith("bertjax: error: ") or done.stdout:
                found.append(f"{case}: exit {done.returncode}, stderr {lines[-3:]}")
    return found


@pytest.mark.parametrize("config_name", PRETRAINING)
def test_pretraining_settings_refused_before_the_workdir(config_name, tmp_path,
                                                         small_corpus_dir,
                                                         stopped_at_first_write):
    corpus = os.path.join(os.path.dirname(small_corpus_dir), "wiki40.txt")
    assert problems(config_name, {"data.input": corpus}, tmp_path) == []


def test_finetuning_settings_refused_before_the_workdir(tmp_path, finished_short_run,
                                                        stopped_at_first_write):
    base = {"init_checkpoint": finished_short_run, "data.max_train_examples": 64,
            "data.max_eval_examples": 64}
    assert problems("finetune_sentiment", base, tmp_path) == []


def test_distillation_settings_refused_before_the_workdir(tmp_path, sentiment_run,
                                                          stopped_at_first_write):
    """Only the distill section: the rest is finetune_sentiment's (the test above)."""
    base = {"distill.teacher": sentiment_run, "data.max_train_examples": 64,
            "data.max_eval_examples": 64}
    assert problems("distill", base, tmp_path, only="distill.") == []
