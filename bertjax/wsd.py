"""Word sense disambiguation by 1-nearest neighbour over contextual word embeddings.

    python -m bertjax.wsd evaluate --model PATH [--lemmas 50] [--layers -1 | -4,-3,-2,-1]
    python -m bertjax.wsd fit --model PATH --output DIR [--lemmas N] [--layers ...]
    python -m bertjax.wsd predict --index DIR --sentence "he sat on the bank" --word bank

A sense's embedding is the mean contextual embedding (`Model.word_vectors`) of its lemma over the
sense's labelled examples; an occurrence gets the candidate sense whose embedding is nearest by
cosine. The candidates for a word are the senses of the lemmas it can be a form of under WordNet's
morphology, part of speech by part of speech ("banked" can only be the verb). The data are WordNet
3.0's example sentences (`bertjax.data.wordnet`); `evaluate` holds out examples of each sense and
compares with the most-frequent-sense baseline: among the same candidates, the sense with the most
training examples, ties going to WordNet's lower sense number. An index (DIR/wsd_index.json +
DIR/sense_vectors.npz) records a digest of the encoder's parameters and refuses any other model.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import sys
from typing import Sequence

import numpy as np

from bertjax.data import wordnet
from bertjax.data.wordnet import Example, Sense
from bertjax.errors import EXIT_BAD_INPUT, UserError, exit_on_user_error, report
from bertjax.interop import output_dir

INFO_FILE = "wsd_index.json"
VECTORS_FILE = "sense_vectors.npz"
FORMAT = "bertjax-wsd-index"
VERSION = 1


def model_digest(model) -> str:
    """sha256 of the encoder's parameter names, shapes, dtypes and values: the same weights give
    the same digest wherever they are loaded from (a Hugging Face dir or its params export)."""
    import jax

    digest = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(model.loaded.params["encoder"])
    for path, leaf in leaves:
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class SenseIndex:
    """Sense embeddings of one model: `fit` them, then `predict` the sense of a word in context."""

    def __init__(self, model, senses: Sequence[Sense], vectors: np.ndarray,
                 counts: Sequence[int], layers, digest: str | None = None):
        self.model = model
        self.senses = list(senses)
        self.vectors = np.asarray(vectors, np.float32)  # [S, H], unit length
        self.counts = list(counts)                      # training examples per sense
        self.layers = layers
        self.digest = digest or model_digest(model)
        self._by_lemma: dict[str, list[int]] = collections.defaultdict(list)
        for i, sense in enumerate(self.senses):
            self._by_lemma[sense.lemma].append(i)

    @classmethod
    def fit(cls, model, examples: Sequence[Example], layers=-1) -> SenseIndex:
        """Each sense's embedding: the normalised mean of its examples' target-word vectors."""
        if not examples:
            raise UserError("no examples to fit a sense index on")
        vectors = _target_vectors(model, [(e.words, e.index) for e in examples], layers)
        sums: dict[Sense, list] = {}
        for e, vector in zip(examples, vectors):
            if np.isfinite(vector).all():  # a target past max_seq_len has no vector
                sums.setdefault(e.sense, []).append(vector)
        if not sums:
            raise UserError("every example's target word lies past the model's max_seq_len")
        senses = list(sums)
        means = np.stack([np.mean(sums[s], axis=0) for s in senses])
        return cls(model, senses, _unit(means), [len(sums[s]) for s in senses],
                   _layers_record(layers))

    # ---- prediction ------------------------------------------------------------------------

    @property
    def lemmas(self) -> list[str]:
        return list(self._by_lemma)

    def candidates(self, word: str, lemma: str | None = None) -> list[int]:
        """Indices of the senses `word` can have: those of `lemma` (or of any lemma) whose part
        of speech admits `word` as a form of the lemma."""
        exc = _exceptions()
        lemmas = [lemma.lower()] if lemma else _lemma_guesses(word, exc)
        return [i for name in lemmas for i in self._by_lemma.get(name, ())
                if wordnet.is_form_of(word, name, self.senses[i].pos, exc)]

    def rank_many(self, items: Sequence[tuple[Sequence[str], int, str | None]]
                  ) -> list[list[tuple[Sense, float]]]:
        """For each (words, target index, lemma or None): the candidate senses with their cosine
        similarity to the target word's vector, best first."""
        choices = [self._checked_candidates(words, index, lemma) for words, index, lemma in items]
        vectors = _target_vectors(self.model, [(w, i) for w, i, _ in items], self.layers)
        ranked = []
        for (words, index, _), options, vector in zip(items, choices, vectors):
            if not np.isfinite(vector).all():
                raise UserError(f"the word {words[index]!r} lies past the model's "
                                f"{self.model.max_seq_len}-token limit")
            scores = self.vectors[options] @ _unit(vector)
            order = np.argsort(-scores, kind="stable")
            ranked.append([(self.senses[options[k]], float(scores[k])) for k in order])
        return ranked

    def rank(self, words: Sequence[str], index: int, lemma: str | None = None
             ) -> list[tuple[Sense, float]]:
        return self.rank_many([(words, index, lemma)])[0]

    def predict(self, words: Sequence[str], index: int, lemma: str | None = None) -> Sense:
        """The sense of `words[index]` nearest by cosine."""
        return self.rank(words, index, lemma)[0][0]

    def most_frequent(self, words: Sequence[str], index: int, lemma: str | None = None) -> Sense:
        """The baseline: of the same candidates, the sense with the most training examples (ties:
        WordNet's lower sense number)."""
        options = self._checked_candidates(words, index, lemma)
        best = min(options, key=lambda i: (-self.counts[i], _sense_number(self.senses[i]), i))
        return self.senses[best]

    def _checked_candidates(self, words, index, lemma) -> list[int]:
        if isinstance(words, str):
            raise UserError("give the sentence as a list of words, not one string")
        if not 0 <= index < len(words):
            raise UserError(f"target index {index} is outside the sentence's {len(words)} words")
        options = self.candidates(words[index], lemma)
        if not options:
            what = f"the lemma {lemma!r}" if lemma else f"the word {words[index]!r}"
            raise UserError(f"the sense index has no senses for {what} (it has "
                            f"{len(self._by_lemma)} lemmas, e.g. "
                            f"{', '.join(sorted(self._by_lemma)[:3])})")
        return options

    # ---- files -----------------------------------------------------------------------------

    def save(self, directory: str, *, overwrite: bool = False) -> None:
        """DIR/wsd_index.json + DIR/sense_vectors.npz; DIR must not exist unless `overwrite`."""
        info = {"format": FORMAT, "version": VERSION, "layers": self.layers,
                "model": {"path": os.path.abspath(self.model.path), "digest": self.digest,
                          "hidden_size": int(self.vectors.shape[1])},
                "senses": [{**dataclasses.asdict(s), "examples": n}
                           for s, n in zip(self.senses, self.counts)]}
        with output_dir.staged(directory, overwrite=overwrite) as staging:
            np.savez(os.path.join(staging, VECTORS_FILE), vectors=self.vectors)
            with open(os.path.join(staging, INFO_FILE), "w", encoding="utf-8") as f:
                json.dump(info, f, indent=1)

    @classmethod
    def load(cls, directory: str, model=None) -> SenseIndex:
        """The index in `directory`, with `model` (default: the model it was fitted with), which
        must be the model it was fitted with."""
        info = read_info(directory)
        recorded = info["model"]
        if model is None:
            if not os.path.exists(recorded["path"]):
                raise UserError(f"the model {directory} was fitted with ({recorded['path']}) is "
                                "gone; name a copy of it with --model")
            from bertjax.api import load

            model = load(recorded["path"])
        digest = model_digest(model)
        if digest != recorded["digest"]:
            raise UserError(f"the sense index {directory} was fitted with another model "
                            f"({recorded['path']}), not {model.path}; refit it or use that model")
        try:
            with np.load(os.path.join(directory, VECTORS_FILE)) as saved:
                vectors = saved["vectors"]
        except (OSError, KeyError, ValueError) as e:
            raise UserError(f"cannot read {os.path.join(directory, VECTORS_FILE)}: {e}") from None
        senses = [Sense(**{k: s[k] for k in ("id", "lemma", "pos", "offset", "definition")})
                  for s in info["senses"]]
        if vectors.shape != (len(senses), recorded["hidden_size"]):
            raise UserError(f"{directory} is damaged: {vectors.shape[0]} sense vectors for "
                            f"{len(senses)} senses")
        return cls(model, senses, vectors, [s["examples"] for s in info["senses"]],
                   info["layers"], digest)


def read_info(directory: str) -> dict:
    path = os.path.join(directory, INFO_FILE)
    if not os.path.isfile(path):
        raise UserError(f"{directory} is not a sense index (no {INFO_FILE}; make one with "
                        "`python -m bertjax.wsd fit`)")
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if info.get("format") != FORMAT or info.get("version") != VERSION:
        raise UserError(f"{path} is not a version-{VERSION} {FORMAT}")
    return info


# ---- evaluation ------------------------------------------------------------------------------

@dataclasses.dataclass
class Evaluation:
    dataset: wordnet.Dataset
    nearest: list[bool]     # per held-out example: 1-NN right
    baseline: list[bool]    # per held-out example: most frequent sense right

    @staticmethod
    def accuracy(hits: Sequence[bool]) -> float:
        return float(np.mean(hits)) if len(hits) else float("nan")

    def per_lemma(self) -> dict[str, tuple[int, int, int, int]]:
        """lemma -> (senses, held-out examples, 1-NN right, baseline right)."""
        senses = collections.Counter(s.lemma for s in self.dataset.senses)
        rows = {lemma: [senses[lemma], 0, 0, 0] for lemma in self.dataset.lemmas}
        for e, hit, base in zip(self.dataset.test, self.nearest, self.baseline):
            row = rows[e.lemma]
            row[1:] = row[1] + 1, row[2] + hit, row[3] + base
        return {lemma: tuple(row) for lemma, row in rows.items()}


def evaluate(model, dataset: wordnet.Dataset, layers=-1) -> Evaluation:
    """Fits on the training examples, predicts the held-out ones."""
    index = SenseIndex.fit(model, dataset.train, layers)
    items = [(e.words, e.index, e.lemma) for e in dataset.test]
    ranked = index.rank_many(items)
    nearest = [r[0][0] == e.sense for r, e in zip(ranked, dataset.test)]
    baseline = [index.most_frequent(*item) == e.sense for item, e in zip(items, dataset.test)]
    return Evaluation(dataset, nearest, baseline)


# ---- helpers ---------------------------------------------------------------------------------

def _target_vectors(model, items: Sequence[tuple[Sequence[str], int]], layers) -> list:
    sentences = [list(words) for words, _ in items]
    vectors = model.word_vectors(sentences, layers=layers) if sentences else []
    return [v[index] for v, (_, index) in zip(vectors, items)]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _layers_record(layers):
    if isinstance(layers, str):
        return layers
    return int(layers) if isinstance(layers, (int, np.integer)) else [int(i) for i in layers]


def _sense_number(sense: Sense) -> int:
    tail = sense.id.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _exceptions():
    return wordnet.exceptions(wordnet.wordnet_dir())


def _lemma_guesses(word: str, exc) -> list[str]:
    """Every base form WordNet's morphology allows for `word`, in any part of speech."""
    return sorted(set().union(*(wordnet.base_forms(word, pos, exc) for pos in wordnet.POS_FILES)))


# ---- command line ----------------------------------------------------------------------------

def _layers_arg(text: str):
    if text == "all":
        return text
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--layers takes 'all', an index or comma-separated indices (-4,-3,-2,-1), got "
            f"{text!r}") from None
    return values[0] if len(values) == 1 else values


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    def fail(message):
        report(message)
        sys.exit(EXIT_BAD_INPUT)

    parser = argparse.ArgumentParser(prog="python -m bertjax.wsd",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate_cmd = commands.add_parser("evaluate", help="held-out WordNet accuracy vs the "
                                       "most-frequent-sense baseline")
    fit_cmd = commands.add_parser("fit", help="fit a sense index on WordNet's examples")
    predict_cmd = commands.add_parser("predict", help="the sense of a word in a sentence")
    for sub in (evaluate_cmd, fit_cmd):
        sub.add_argument("--model", required=True,
                         help="a workdir, params export or Hugging Face BERT directory")
        sub.add_argument("--layers", type=_layers_arg, default=-1,
                         help="hidden states to average: an index or indices (default -1, the "
                         "last layer; -4,-3,-2,-1 for the mean of the last four)")
        sub.add_argument("--batch-size", type=int, default=32)
    evaluate_cmd.add_argument("--lemmas", type=int, default=50,
                              help="the N ambiguous lemmas with the most examples (default 50)")
    evaluate_cmd.add_argument("--all-lemmas", action="store_true",
                              help="every ambiguous lemma (871)")
    evaluate_cmd.add_argument("--holdout", type=int, default=3,
                              help="hold out one example in k of each sense (default 3)")
    fit_cmd.add_argument("--output", required=True, help="the index directory to create")
    fit_cmd.add_argument("--lemmas", type=int, default=None,
                         help="only the N lemmas with the most examples (default: all)")
    fit_cmd.add_argument("--overwrite", action="store_true", help="replace an existing index")
    predict_cmd.add_argument("--index", required=True, help="a directory made by `fit`")
    predict_cmd.add_argument("--sentence", required=True)
    predict_cmd.add_argument("--word", required=True,
                             help="the word to disambiguate (its first occurrence, or of a form "
                             "of it: --word bank finds 'banks')")
    predict_cmd.add_argument("--model", default=None,
                             help="the model (default: the one the index was fitted with)")
    for p in (parser, evaluate_cmd, fit_cmd, predict_cmd):
        p.error = fail
    return parser.parse_args(argv)


def _load_model(args):
    from bertjax.api import load

    return load(args.model, batch_size=getattr(args, "batch_size", 32))


def _evaluate(args) -> None:
    examples = wordnet.read_examples()
    lemmas = None if args.all_lemmas else args.lemmas
    dataset = wordnet.split(examples, lemmas=lemmas, holdout=args.holdout)
    model = _load_model(args)
    result = evaluate(model, dataset, args.layers)
    print(f"WordNet 3.0 example sentences: {len(dataset.lemmas)} ambiguous lemmas, "
          f"{len(dataset.senses)} senses, {len(dataset.train)} training and {len(dataset.test)} "
          f"held-out examples (one in {args.holdout} per sense)")
    print(f"model {model.path}, layers {_layers_record(args.layers)}")
    print(f"{'lemma':<16}{'senses':>7}{'held out':>10}{'1-NN':>8}{'MFS':>8}")
    for lemma, (senses, count, hits, base) in result.per_lemma().items():
        print(f"{lemma:<16}{senses:>7}{count:>10}{hits / count:>8.3f}{base / count:>8.3f}")
    right, base = sum(result.nearest), sum(result.baseline)
    print(f"1-NN accuracy {result.accuracy(result.nearest):.4f} ({right}/{len(dataset.test)}); "
          f"most-frequent-sense baseline {result.accuracy(result.baseline):.4f} "
          f"({base}/{len(dataset.test)})")


def _fit(args) -> None:
    output_dir.check_target(args.output, overwrite=args.overwrite, sources=(args.model,))
    chosen = wordnet.ambiguous_lemmas(wordnet.read_examples(), min_examples=1)
    if args.lemmas is not None:
        if args.lemmas < 1:
            raise UserError(f"--lemmas must be positive, got {args.lemmas}")
        chosen = dict(list(chosen.items())[:args.lemmas])
    examples = [e for senses in chosen.values() for found in senses.values() for e in found]
    index = SenseIndex.fit(_load_model(args), examples, args.layers)
    index.save(args.output, overwrite=args.overwrite)
    print(f"wrote the sense index {os.path.abspath(args.output)}: {len(index.lemmas)} lemmas, "
          f"{len(index.senses)} senses from {len(examples)} WordNet examples")


def _predict(args) -> None:
    index = SenseIndex.load(args.index, None if args.model is None else _load_model(args))
    words = wordnet.words_of(args.sentence)
    target = args.word.lower()
    position = next((i for i, w in enumerate(words) if w.lower() == target), None)
    lemma = None
    if position is None:
        exc = _exceptions()
        position = next((i for i, w in enumerate(words) if any(
            wordnet.is_form_of(w, target, pos, exc) for pos in wordnet.POS_FILES)), None)
        lemma = target
    if position is None:
        raise UserError(f"the word {args.word!r} does not occur in the sentence")
    ranked = index.rank(words, position, lemma)
    best, score = ranked[0]
    print(f"{best.id}\t{score:.4f}\t{best.definition}")
    for sense, score in ranked[1:]:
        print(f"  {sense.id}\t{score:.4f}\t{sense.definition}")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    from bertjax.library_logs import quiet_routine_library_logs

    quiet_routine_library_logs()
    if getattr(args, "batch_size", 1) < 1:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    if args.model is not None:
        from bertjax import loading

        loading.kind_of(args.model)  # "not a model" before WordNet is read
    {"evaluate": _evaluate, "fit": _fit, "predict": _predict}[args.command](args)


if __name__ == "__main__":
    main(sys.argv[1:])
