"""Fine-tuning metrics against outside references: scipy for correlations, hand formulas for MCC
and F1, seqeval's documented behaviour for entities, the official SQuAD v1.1 normalization, and
brute-force enumeration for the CRF."""

import itertools
import math

import jax
import numpy as np
import pytest
from scipy import stats

from bertjax.finetune import scoring
from bertjax.model import crf


# --- classification --------------------------------------------------------------------------

def test_binary_mcc_and_f1_match_the_hand_formulas():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 200)
    predicted = np.where(rng.random(200) < 0.7, gold, 1 - gold)
    tp = np.sum((predicted == 1) & (gold == 1))
    tn = np.sum((predicted == 0) & (gold == 0))
    fp = np.sum((predicted == 1) & (gold == 0))
    fn = np.sum((predicted == 0) & (gold == 1))
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert scoring.matthews_corrcoef(gold, predicted, 2) == pytest.approx(mcc)
    assert scoring.f1_of_class(gold, predicted, 1) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert scoring.accuracy(gold, predicted) == pytest.approx((tp + tn) / 200)


def test_mcc_edge_cases_and_multiclass():
    assert scoring.matthews_corrcoef([0, 1, 2, 0], [0, 1, 2, 0], 3) == pytest.approx(1.0)
    assert scoring.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0], 2) == pytest.approx(-1.0)
    assert scoring.matthews_corrcoef([0, 1, 0, 1], [1, 1, 1, 1], 2) == 0.0  # constant: undefined
    # Gorodkin's R_K on a 3-class confusion matrix, written out from its definition.
    gold = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    predicted = [0, 1, 0, 1, 2, 2, 2, 0, 2]
    c = scoring.confusion_matrix(gold, predicted, 3).astype(float)
    n = c.sum()
    num = sum(c[k, k] * c[l, m] - c[k, l] * c[m, k]
              for k in range(3) for l in range(3) for m in range(3))
    a = sum(c[k, :].sum() * (n - c[k, :].sum()) for k in range(3))
    b = sum(c[:, k].sum() * (n - c[:, k].sum()) for k in range(3))
    assert scoring.matthews_corrcoef(gold, predicted, 3) == pytest.approx(num / math.sqrt(a * b))
    assert scoring.macro_f1(gold, predicted) == pytest.approx(np.mean([
        2 * 2 / (2 * 2 + 1 + 1), 2 * 1 / (2 * 1 + 1 + 1), 2 * 3 / (2 * 3 + 1 + 1)]))


def test_macro_f1_averages_only_the_labels_present_in_gold_or_predictions():
    # 4 classes; class 3 appears in neither (left out, as sklearn does); class 2 only in the
    # predictions (F1 0, counted).
    gold = [0, 0, 0, 1, 1, 1]
    predicted = [0, 0, 1, 1, 1, 2]
    f1_0 = 2 * 2 / (2 * 2 + 0 + 1)  # tp 2, fp 0, fn 1
    f1_1 = 2 * 2 / (2 * 2 + 1 + 1)  # tp 2, fp 1, fn 1
    assert scoring.macro_f1(gold, predicted) == pytest.approx((f1_0 + f1_1 + 0.0) / 3)
    assert scoring.macro_f1([], []) == 0.0


# --- regression ------------------------------------------------------------------------------

def test_pearson_and_spearman_match_scipy_with_ties():
    rng = np.random.default_rng(1)
    x = rng.normal(size=300)
    y = 0.5 * x + rng.normal(size=300)
    tied = np.round(y * 2) / 2  # many ties
    assert scoring.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert scoring.spearman(x, tied) == pytest.approx(stats.spearmanr(x, tied)[0], abs=1e-12)
    assert scoring.spearman(tied, np.round(x)) == pytest.approx(
        stats.spearmanr(tied, np.round(x))[0], abs=1e-12)
    np.testing.assert_allclose(scoring.average_ranks([3, 1, 3, 2]), stats.rankdata([3, 1, 3, 2]))
    assert scoring.pearson([1, 2, 3], [5, 5, 5]) == 0.0  # constant predictions


# --- entities --------------------------------------------------------------------------------

def test_entity_spans_follow_seqeval_default_rules():
    tags = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-ORG", "I-ORG", "O", "I-MISC", "B-PER"]
    # I-ORG after B-LOC starts an ORG entity; I-MISC after O starts a MISC entity (seqeval's
    # default mode keeps such "invalid" starts rather than dropping them).
    assert scoring.entity_spans(tags) == [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4),
                                          ("ORG", 5, 6), ("MISC", 8, 8), ("PER", 9, 9)]
    assert scoring.entity_spans(["I-PER", "I-PER"]) == [("PER", 0, 1)]
    assert scoring.entity_spans(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]
    assert scoring.entity_spans(["O", "O"]) == []


def test_entity_f1_needs_exact_span_and_type():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "O", "O", "B-LOC"],  # PER cut short: a miss and a false alarm
                 ["B-MISC", "O"]]  # right span, wrong type
    scores = scoring.entity_scores(gold, predicted)
    # 1 of 3 predicted entities is right (LOC), 1 of 3 gold found.
    assert scores["entity_precision"] == pytest.approx(1 / 3)
    assert scores["entity_recall"] == pytest.approx(1 / 3)
    assert scores["entity_f1"] == pytest.approx(1 / 3)
    assert scores["entity_f1_by_type"] == {"LOC": 1.0, "MISC": 0.0, "ORG": 0.0, "PER": 0.0}
    assert scoring.entity_scores(gold, gold)["entity_f1"] == 1.0
    assert scoring.entity_scores(gold, [["O"] * 4, ["O"] * 2])["entity_f1"] == 0.0


# --- SQuAD -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, normalized", [
    ("The Denver Broncos", "denver broncos"),
    ("  an apple, a pear!  ", "apple pear"),
    ("Theatre", "theatre"),  # "the" only as a word
    ("A.D. 1990's", "ad 1990s"),
    ("Saint-Étienne", "saintétienne"),
])
def test_squad_normalization(text, normalized):
    assert scoring.normalize_answer(text) == normalized


def test_squad_em_and_f1_take_the_best_gold_answer():
    assert scoring.exact_match("the Broncos", "Broncos") == 1.0
    # prediction "denver broncos won" vs "broncos": 1 common of 3 and 1 -> P 1/3, R 1 -> F1 0.5
    assert scoring.token_f1("Denver Broncos won", "Broncos") == pytest.approx(0.5)
    assert scoring.token_f1("a", "the") == 0.0  # both normalize to nothing
    scores = scoring.squad_scores({"q1": ["Broncos", "Denver Broncos"], "q2": ["1990"]},
                                  {"q1": "denver broncos", "q2": "in 1991"})
    assert scores == {"exact_match": pytest.approx(50.0), "f1": pytest.approx(50.0)}
    assert scoring.squad_scores({"q": ["x"]}, {})["f1"] == 0.0  # unanswered counts as 0


# --- CRF -------------------------------------------------------------------------------------

def _brute_force(emissions, mask, transitions, start, end):
    positions = np.flatnonzero(mask)
    scores = {}
    if not positions.size:
        return positions, scores
    for tags in itertools.product(range(emissions.shape[-1]), repeat=len(positions)):
        score = start[tags[0]] + end[tags[-1]]
        score += sum(emissions[p, t] for p, t in zip(positions, tags))
        score += sum(transitions[a, b] for a, b in zip(tags, tags[1:]))
        scores[tags] = score
    return positions, scores


def test_crf_log_likelihood_and_viterbi_against_brute_force():
    rng = np.random.default_rng(3)
    classes, length = 3, 5
    emissions = rng.normal(size=(4, length, classes)).astype(np.float32)
    transitions = rng.normal(size=(classes, classes)).astype(np.float32)
    start, end = rng.normal(size=classes).astype(np.float32), rng.normal(size=classes)
    end = end.astype(np.float32)
    # a full row, a row with gaps (first subwords only), a row of padding, a one-position row
    mask = np.array([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]], bool)
    z = np.asarray(crf.log_partition(emissions, mask, transitions, start, end))
    decoded = np.asarray(jax.jit(crf.viterbi_decode)(emissions, mask, transitions, start, end))
    gold = rng.integers(0, classes, (4, length))
    log_likelihood = np.asarray(crf.log_likelihood(emissions, gold, mask, transitions, start,
                                                   end))
    for row in range(4):
        positions, scores = _brute_force(emissions[row], mask[row], transitions, start, end)
        if not positions.size:
            assert z[row] == 0.0 and log_likelihood[row] == 0.0
            continue
        log_z = np.logaddexp.reduce(np.array(list(scores.values()), np.float64))
        assert z[row] == pytest.approx(log_z, abs=1e-4)
        best = max(scores, key=scores.get)
        assert tuple(decoded[row, positions]) == best
        gold_score = scores[tuple(gold[row, positions])]
        assert log_likelihood[row] == pytest.approx(gold_score - log_z, abs=1e-4)
