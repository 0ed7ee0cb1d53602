"""benchmarks/pretraining_objectives.py compares objectives on one budget: every objective's config
with the benchmark's overrides must read as the same model, schedule, loop and optimizer (only
what makes the objective may differ), and the table must show each row's figures."""

import dataclasses
import importlib.util
import os
import sys

from bertjax import settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _benchmark():
    name = "pretraining_objectives_benchmark"
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(REPO, "benchmarks", "pretraining_objectives.py"))
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def _module(config_path: str):
    return importlib.import_module(config_path[:-3].replace("/", "."))


bench = _benchmark()


def _settings(name: str, args):
    objective = bench.OBJECTIVES[name]
    config = _module(objective.config).get_config()
    config.update_from_flattened_dict(bench.pretrain_overrides(args, "/prepared", objective))
    return settings.read(config)


def test_every_objective_gets_the_same_budget():
    args = bench.parse_args(["--steps", "50", "--size", "mini", "--seq-len", "64"])
    present = [n for n, o in bench.OBJECTIVES.items()
               if os.path.isfile(os.path.join(REPO, o.config))]
    assert {"bert", "roberta", "spanbert"} <= set(present)
    read = {name: _settings(name, args) for name in present}
    reference = read["bert"]
    assert reference.model.preset == "mini" and reference.train.steps == 50
    assert [(p.seq_len, p.max_predictions) for p in reference.schedule.phases] == [(64, 10)]
    modern = read.pop("modernbert", None)
    if modern is not None:  # its architecture and optimizer are its own; size and budget not
        assert modern.model.preset == "mini" and modern.model.architecture["norm"] == "pre"
        assert modern.train == reference.train
        # The corpus is prepared once with its own vocabulary: the config's size is not read.
        # ... and ModernBERT's recipe keeps packed documents apart.
        assert modern.data.separate_documents and not reference.data.separate_documents
        assert dataclasses.replace(modern.data, vocab_size=0, separate_documents=False) == \
            dataclasses.replace(reference.data, vocab_size=0)
        assert modern.optimizer.name == "stable_adamw"
        assert modern.model.architecture["sliding_window"] == 64  # narrowed to --seq-len
        assert [(p.seq_len, p.max_predictions) for p in modern.schedule.phases] == [(64, 20)]
        assert modern.masking.mask_prob == 0.3
    for name, s in read.items():
        assert s.objective.name == name
        assert s.model == reference.model, name
        assert s.schedule == reference.schedule, name
        assert s.train == reference.train, name
        assert s.data == reference.data, name
        # RoBERTa's beta2 is part of its recipe; everything else the optimizer does is shared.
        assert dataclasses.replace(s.optimizer, b2=0.0) == \
            dataclasses.replace(reference.optimizer, b2=0.0), name
    assert read["spanbert"].masking.strategy == "span"
    assert read["roberta"].masking == reference.masking


def test_random_init_finetunes_the_pretrained_shape_with_the_corpus_vocabulary():
    args = bench.parse_args(["--size", "mini"])
    config = _module(bench.TASKS["ner"][0]).get_config()
    config.update_from_flattened_dict(
        bench.finetune_overrides(args, "ner", bench.RANDOM, "/prepared"))
    s = settings.read(config)
    assert s.model.preset == "mini" and not s.model.from_checkpoint
    assert s.data.tokenizer == "/prepared/tokenizer"
    assert "model.preset" not in bench.finetune_overrides(args, "ner", "bert", "/prepared")


def test_table_rows():
    pretrained = {"wall_s": 301.4, "cpu_s": 590.2,
                  "eval": {"eval_mlm_accuracy": 0.1134, "eval_nsp_accuracy": 0.6}}
    rows = [{"start": "bert", "pretrain": pretrained, "sentiment": {"best": 0.672},
             "ner": {"best": 0.054}},
            {"start": "spanbert", "pretrain": {**pretrained, "eval": {}},
             "sentiment": {"best": 0.6}, "ner": None},
            {"start": "roberta", "pretrain": pretrained, "sentiment": None, "ner": None},
            {"start": "electra", "pretrain": {**pretrained, "eval": {
                "eval_mlm_accuracy": 0.05, "eval_rtd_accuracy": 0.9,
                "eval_replaced_fraction": 0.1}}, "sentiment": None, "ner": None},
            {"start": bench.RANDOM, "sentiment": {"best": 0.508}, "ner": {"best": 0.0}}]
    lines = bench.table(rows).splitlines()
    assert len(lines) == 7 and all(line.count("|") == 7 for line in lines)
    assert lines[2] == "| bert | 301 s (590 s) | MLM 11.3% | NSP 60.0% | 67.2% | 5.4% |"
    assert lines[3] == "| spanbert | 301 s (590 s) | MLM (spans) — | SBO — | 60.0% | — |"
    assert lines[4] == "| roberta | 301 s (590 s) | MLM 11.3% | — | — | — |"
    assert lines[5] == ("| electra | 301 s (590 s) | generator MLM 5.0% | "
                        "RTD 90.0%, replaced 10.0% | — | — |")
    assert lines[6] == "| random init | — | — | — | 50.8% | 0.0% |"
