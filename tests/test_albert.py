"""ALBERT (factorised embeddings, one layer's parameters shared by every layer, sentence-order
prediction) against transformers' Albert models: random AlbertForPreTraining / AlbertModel
directories with an ALBERT-style spiece.model, converted by `python -m bertjax.convert`, compute
transformers' hidden states and scores on padded text and tokenize as AlbertTokenizer; a
SentencePiece ALBERT exports a tokenizer AlbertTokenizer reads and converts back bit for bit; the
parameter count is transformers'; SOP pairs are half swapped, each two consecutive segments of
one document; bad settings are refused in one line before any write. Runs: test_albert_runs.py.
"""

import io
import os

import jax
import numpy as np
import pytest
import sentencepiece as spm
from transformers import (AlbertConfig, AlbertForPreTraining, AlbertModel, AlbertTokenizer,
                          AutoTokenizer)

from bertjax.cli import convert, export
from bertjax.core.errors import UserError
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.examples import IN_ORDER, SWAPPED, ExampleSource
from bertjax.data.tokenizer_training import train_sentencepiece
from bertjax.inference import loading
from bertjax.interop import hf_electra
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining
from albert_reference import TOL, hf_outputs, our_outputs, padded_batch
from cli_checks import assert_one_line_error, run_cli
from hf_reference import randomize
from pretrain_runs import REPO, run_child
from saved_runs import random_params, save_workdir

pytestmark = pytest.mark.slow

TEXTS = ["The cat sat on the mat.", "Two men play chess in a park, after the rain.", "Paris!"]
SIZES = dict(embedding_size=16, hidden_size=48, num_attention_heads=3,
             intermediate_size=80, num_hidden_layers=3, max_position_embeddings=64,
             type_vocab_size=2, hidden_act="gelu_new", attn_implementation="eager")


@pytest.fixture(scope="module")
def spiece(tmp_path_factory, demo_articles) -> tuple[bytes, int]:
    """An ALBERT-style SentencePiece model trained here: <pad> 0, <unk> 1, [CLS] 2, [SEP] 3,
    [MASK] 4, as albert-base-v2's spiece.model has them; (its bytes, its size)."""
    model = io.BytesIO()
    sentences = (s.lower() for d in demo_articles[:20] for s in d)
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences, model_writer=model, vocab_size=400, model_type="unigram",
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="<pad>", unk_piece="<unk>",
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], hard_vocab_limit=False,
        minloglevel=2)
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    return model.getvalue(), processor.get_piece_size()


def save_hf(directory, model, spiece_bytes: bytes) -> str:
    model.save_pretrained(directory)
    with open(os.path.join(directory, "spiece.model"), "wb") as f:
        f.write(spiece_bytes)
    return str(directory)


@pytest.mark.parametrize("groups", [1, 3], ids=["shared", "unshared"])
def test_a_converted_albert_computes_transformers_states_and_scores(tmp_path, capsys, groups,
                                                                    spiece):
    vocab = spiece[1]
    hf = AlbertForPreTraining(AlbertConfig(num_hidden_groups=groups, vocab_size=vocab,
                                           **SIZES)).eval()
    randomize(hf, groups)
    source = save_hf(tmp_path / "hf", hf, spiece[0])
    out = str(tmp_path / "converted")
    code, _, err = run_cli(convert, ["--from-hf", source, "--output", out], capsys)
    assert code == 0 and "initialized" not in err, err
    bundle = loading.load(out)
    config = bundle.encoder
    assert (config.embedding_size, config.share_layers) == (16, groups == 1)
    assert config.activation == "gelu_tanh"
    batch = padded_batch(vocab, groups)
    states, heads = our_outputs(bundle.params, config, batch)
    theirs = hf_outputs(hf, batch)
    hf_states = np.stack([h.numpy() for h in theirs.hidden_states])
    # Both count the projected embeddings as the first of the hidden states.
    print(f"max |ours - transformers|: states {np.abs(states - hf_states).max():.2e}, "
          f"MLM {np.abs(heads['mlm_logits'] - theirs.prediction_logits.numpy()).max():.2e}")
    np.testing.assert_allclose(states, hf_states, **TOL)
    np.testing.assert_allclose(heads["mlm_logits"], theirs.prediction_logits.numpy(), **TOL)
    np.testing.assert_allclose(heads["nsp_logits"], theirs.sop_logits.numpy(), **TOL)
    if config.share_layers:  # one tree for both: the loop over the one layer computes the same
        looped, _ = our_outputs(bundle.params, config.replace(scan_layers=False), batch)
        np.testing.assert_allclose(looped, states, atol=1e-6, rtol=1e-6)


def test_a_bare_albert_model_and_its_tokenizer_embed_text_as_transformers(tmp_path, capsys,
                                                                          spiece):
    """AlbertModel with spiece.model: the converted tokenizer gives AlbertTokenizer's ids, and
    the encoder its last hidden states on those texts, padded."""
    hf = AlbertModel(AlbertConfig(vocab_size=spiece[1], **SIZES)).eval()
    randomize(hf, 7)
    source = save_hf(tmp_path / "hf", hf, spiece[0])
    out = str(tmp_path / "converted")
    code, _, err = run_cli(convert, ["--from-hf", source, "--output", out], capsys)
    assert code == 0 and "the MLM head (predictions)" in err and "sentence-order head" in err, err
    bundle = loading.load(out)
    theirs = AlbertTokenizer.from_pretrained(source)(TEXTS, padding=True, return_tensors="np")
    tokenizer = bundle.tokenizer()
    special = tokenizer.special
    for row, text in enumerate(TEXTS):
        ids = [special.cls, *tokenizer.encode(text).tolist(), special.sep]
        assert theirs["input_ids"][row][theirs["attention_mask"][row] == 1].tolist() == ids
    batch = {"input_ids": theirs["input_ids"].astype(np.int32),
             "segment_ids": np.zeros(theirs["input_ids"].shape, np.int32),
             "input_mask": theirs["attention_mask"].astype(np.int32)}
    assert batch["input_mask"].min() == 0  # padded
    states, _ = our_outputs(bundle.params, bundle.encoder, {
        **batch, "masked_positions": np.zeros((len(TEXTS), 1), np.int32)})
    np.testing.assert_allclose(states[-1], hf_outputs(hf, batch).last_hidden_state.numpy(), **TOL)
    # bertjax.load reads the Hugging Face directory itself the same way.
    direct = loading.load(source)
    assert direct.encoder == bundle.encoder
    for a, b in zip(jax.tree.leaves(direct.params["encoder"]),
                    jax.tree.leaves(bundle.params["encoder"])):
        np.testing.assert_array_equal(a, b)


def our_parameter_count(config: EncoderConfig) -> int:
    ids = np.zeros((1, 2), np.int32)
    shapes = jax.eval_shape(lambda k: Encoder(config).init(k, ids, ids, ids), jax.random.key(0))
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))


@pytest.mark.parametrize("layers", [1, 12])
def test_the_parameter_count_is_transformers(layers):
    """ALBERT-base's sizes (configs/albert.py): 11.7M parameters whatever the depth."""
    theirs = AlbertConfig(vocab_size=30_000, embedding_size=128, hidden_size=768,
                          num_hidden_layers=layers, num_attention_heads=12,
                          intermediate_size=3072, max_position_embeddings=512)
    ours = EncoderConfig(vocab_size=30_000, embedding_size=128, hidden_size=768,
                         num_layers=layers, num_heads=12, intermediate_size=3072,
                         share_layers=True, activation="gelu_tanh")
    count = sum(p.numel() for p in AlbertModel(theirs).parameters())
    print(f"ALBERT-base, {layers} layer(s): {count:,} parameters")
    assert our_parameter_count(ours) == count == 11_683_584
    unshared = ours.replace(share_layers=False)
    assert our_parameter_count(unshared) == sum(
        p.numel() for p in AlbertModel(AlbertConfig(**{**theirs.to_dict(),
                                                        "num_hidden_groups": layers})).parameters())


def test_sentence_order_pairs_are_consecutive_segments_swapped_half_the_time(small_corpus_dir):
    corpus = PreparedCorpus.open(small_corpus_dir)
    source = ExampleSource(corpus, np.arange(corpus.num_documents), mode="sop",
                           special=corpus.tokenizer.special)
    chunks = source.chunks(64)
    rng = np.random.default_rng(0)
    n = 2000
    swapped = 0
    for i in range(n):
        example = source.build(chunks[i % len(chunks)], 64, rng)
        assert example.nsp_label in (IN_ORDER, SWAPPED) and example.input_ids.size <= 64
        first, second = ((example.b_sentences, example.a_sentences)
                         if example.nsp_label == SWAPPED else
                         (example.a_sentences, example.b_sentences))
        documents = np.searchsorted(corpus.document_bounds, [first[0], second[1] - 1],
                                    side="right")
        assert documents[0] == documents[1]  # one document
        assert first[1] == second[0] or first == second  # consecutive (or one sentence, cut)
        swapped += example.nsp_label == SWAPPED
    # Binomial(2000, 1/2): 5 standard deviations are 112.
    assert abs(swapped - n / 2) < 5 * np.sqrt(n / 4), swapped


REFUSED = [
    ({"model.embedding_size": 1024}, "model.embedding_size 1024 must be in [0, model.hidden_size"),
    ({"model.activation": "relu"}, "model.activation"),
]


@pytest.mark.parametrize("overrides,message", REFUSED)
def test_bad_albert_settings_are_refused_before_the_workdir_exists(tmp_path, overrides,
                                                                   message):
    workdir = tmp_path / "wd"
    args = [f"--config={REPO}/configs/albert.py", f"--workdir={workdir}"]
    done = run_child(["bertjax.cli.main", *args,
                      *[f"--config.{k}={v}" for k, v in overrides.items()]])
    assert_one_line_error(done.returncode, done.stderr, message)
    assert not os.path.exists(workdir)


def test_reinitializing_top_layers_of_shared_layers_is_refused(tmp_path):
    workdir = tmp_path / "wd"
    done = run_child(["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py",
                      f"--workdir={workdir}", "--config.model.preset=tiny",
                      "--config.model.share_layers=True", "--config.finetune.reinit_top_layers=1",
                      "--config.data.train=a.jsonl", "--config.data.eval=b.jsonl"])
    assert_one_line_error(done.returncode, done.stderr, "model.share_layers gives every layer the same")
    assert not os.path.exists(workdir)


def test_a_sentencepiece_albert_exports_a_tokenizer_that_albert_tokenizer_reads(
        tmp_path, capsys, demo_articles):
    """configs/albert.py trains a SentencePiece vocabulary: the export carries it as spiece.model,
    and AlbertTokenizer gives our ids; the model converts back bit for bit."""
    tokenizer = train_sentencepiece((s for d in demo_articles[:20] for s in d), vocab_size=500)
    tokenizer_dir = str(tmp_path / "tokenizer")
    tokenizer.save(tokenizer_dir)
    config = EncoderConfig(vocab_size=tokenizer.vocab_size, hidden_size=48, num_heads=3,
                           intermediate_size=80, num_layers=2, max_position_embeddings=64,
                           embedding_size=16, share_layers=True, activation="gelu_tanh",
                           scan_layers=True)
    ids = np.zeros((1, 4), np.int32)
    params = random_params(BertForPretraining(config), ({
        "input_ids": ids, "segment_ids": ids, "input_mask": ids, "masked_positions": ids},), 3)
    workdir = save_workdir(str(tmp_path / "wd"), params, config, task="pretrain",
                           heads={"nsp": True, "sbo": False}, tokenizer_dir=tokenizer_dir)
    out = str(tmp_path / "hf")
    code, _, err = run_cli(export, ["--workdir", workdir, "--format", "hf", "--output", out],
                           capsys)
    assert code == 0 and err == "", err
    theirs = AutoTokenizer.from_pretrained(out)
    special = tokenizer.special
    for text in TEXTS:
        assert theirs(text)["input_ids"] == [special.cls, *tokenizer.encode(text).tolist(),
                                             special.sep]
    back = str(tmp_path / "back")
    code, _, err = run_cli(convert, ["--from-hf", out, "--output", back], capsys)
    assert code == 0 and "initialized" not in err, err
    converted = loading.load(back)
    assert converted.encoder == config
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(converted.params),
                                                     jax.tree.leaves(params)))
    assert converted.tokenizer().encode(TEXTS[1]).tolist() == tokenizer.encode(TEXTS[1]).tolist()


def test_an_electra_run_with_albert_options_is_not_exported_as_transformers_electra():
    model = EncoderConfig(hidden_size=48, num_heads=3, intermediate_size=80, num_layers=2,
                          embedding_size=16, share_layers=True)
    with pytest.raises(UserError, match="has no mapping to transformers' ELECTRA"):
        hf_electra.to_hf({}, model, {"electra": {}})
