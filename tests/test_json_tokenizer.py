"""Hugging Face tokenizer.json files as vocabularies: the ids are those of the `tokenizers` library
reading the same file (without its [CLS]/[SEP] template), the special roles are found by BERT's or
RoBERTa's names, and a saved, pickled or prepared one gives the same ids back. The files are
trained here, on generated sentences, laid out as ModernBERT's is: a byte-level BPE without a
prefix space whose BERT special tokens come after the learned vocabulary."""

import importlib.util
import json
import os
import pickle
import random

import numpy as np
import pytest
import transformers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

import cli_in_process
from bertjax.core.errors import UserError
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.json_tokenizer import JsonTokenizer
from bertjax.data.tokenizer import SPECIAL_TOKENS, load_tokenizer
from bertjax.data.tokenizer_training import build_tokenizer, train_bpe
from bertjax.interop import hf_files
from bertjax.settings import pretrain as pretrain_settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the a of cat dog sat ran over under quickly slowly house river mountain station "
         "Ça façade naïve Zürich Øresund 北京 ひらがな ångström unaffordable tokenization running "
         "jumped 1990s 3.14 e-mail O'Brien can't 😀").split()
HARD_CASES = ["Héllo, wörld! Ça va?", "Chinese 北京大学 and 한국어 text.", "Emoji 😀🚀👍🏽 ™ ∑",
              "   leading and trailing spaces   ", "", "tabs\tand\nnewlines", "ALL CAPS MiXeD",
              "a" * 120]


@pytest.fixture(scope="module")
def sentences():
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + rng.choice(".!?,;")
            for _ in range(400)]


def train(sentences, specials, pre_tokenizer=None, model=None, trainer_cls=trainers.BpeTrainer,
          appended=(), **trainer_kwargs):
    """A tokenizers.Tokenizer trained on the sentences; `appended` tokens are added after it."""
    tok = HFTokenizer(model or models.BPE())
    if pre_tokenizer is None:  # ModernBERT's: byte-level, no prefix space
        pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainer_cls(vocab_size=500, special_tokens=list(specials), show_progress=False,
                          **trainer_kwargs)
    tok.train_from_iterator(sentences, trainer=trainer)
    tok.add_special_tokens(list(appended))
    return tok


@pytest.fixture(scope="module")
def modernbert_like(sentences, tmp_path_factory):
    """tokenizer.json laid out like ModernBERT's: [UNK] [CLS] [SEP] [PAD] [MASK] appended after
    the BPE, a [CLS] $A [SEP] template, and truncation and padding switched on in the file."""
    tok = train(sentences, ["<|endoftext|>"], appended=["[UNK]", "[CLS]", "[SEP]", "[PAD]",
                                                         "[MASK]"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.enable_truncation(8)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]", length=64)
    path = tmp_path_factory.mktemp("modernbert") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def oracle_ids(path, texts):
    tok = HFTokenizer.from_file(path)
    tok.no_truncation()
    tok.no_padding()
    return [tok.encode(text, add_special_tokens=False).ids for text in texts]


def ids_of(tokenizer, texts):
    return [list(map(int, ids)) for ids in tokenizer.encode_batch(texts)]


def test_a_tokenizer_json_file_and_a_saved_pretrained_directory(modernbert_like, sentences,
                                                                 tmp_path):
    texts = sentences + HARD_CASES
    expected = oracle_ids(modernbert_like, texts)
    # What transformers' save_pretrained writes: tokenizer.json and its own tokenizer_config.json.
    hf_dir = tmp_path / "hf"
    transformers.PreTrainedTokenizerFast(tokenizer_file=modernbert_like).save_pretrained(hf_dir)
    assert "type" not in json.loads((hf_dir / "tokenizer_config.json").read_text())
    base = HFTokenizer.from_file(modernbert_like).get_vocab_size(with_added_tokens=False)
    for tok in (load_tokenizer(modernbert_like), load_tokenizer(str(hf_dir))):
        assert isinstance(tok, JsonTokenizer) and tok.kind == "json" and not tok.lowercase
        assert ids_of(tok, texts) == expected  # no template, no truncation, no padding
        assert tok.vocab_size == base + 5
        assert tok.special.as_array().tolist() == [base + 3, base, base + 1, base + 2, base + 4]
        assert [tok.id_to_token(i) for i in tok.special.as_array()] == list(SPECIAL_TOKENS)
        assert tok.token_to_id("[MASK]") == base + 4 and tok.token_to_id("no-such-token") is None
    assert sum(map(len, expected)) > 3000


def test_raw_text_never_yields_a_special_token(modernbert_like):
    tok = load_tokenizer(modernbert_like)
    ids = tok.encode("a [MASK] and a [SEP] and <|endoftext|>")
    assert not np.isin(ids, tok.special.as_array()).any()
    assert tok.decode(ids) == "a [MASK] and a [SEP] and <|endoftext|>"
    assert tok.decode([tok.special.cls, *tok.encode("the cat"), tok.special.sep]) == \
        "[CLS]the cat[SEP]"


def test_save_load_and_pickle_round_trip(modernbert_like, sentences, tmp_path):
    tok = load_tokenizer(modernbert_like)
    tok.save(str(tmp_path / "tok"))
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["type"] == "json" and config["lowercase"] is False
    with open(modernbert_like) as original:  # saved unchanged, truncation settings and all
        assert (tmp_path / "tok" / "tokenizer.json").read_text() == original.read()
    texts = sentences[:100] + HARD_CASES
    for loaded in (load_tokenizer(str(tmp_path / "tok")), pickle.loads(pickle.dumps(tok))):
        assert type(loaded) is JsonTokenizer and loaded.vocab_size == tok.vocab_size
        assert loaded.special == tok.special and loaded.lowercase == tok.lowercase
        assert ids_of(loaded, texts) == ids_of(tok, texts)
        assert (loaded.word_start_mask() == tok.word_start_mask()).all()


def test_byte_level_word_starts(modernbert_like, sentences):
    tok = load_tokenizer(modernbert_like)
    mask = tok.word_start_mask()
    assert mask.shape == (tok.vocab_size,) and mask.dtype == bool
    assert mask[tok.special.as_array()].all() and mask[tok.token_to_id("<|endoftext|>")]
    learned = range(1, tok.vocab_size - 5)
    assert all(mask[i] == tok.id_to_token(i).startswith("\u0120") for i in learned)
    for sentence in sentences[:50]:
        # With a space before every word, each word's first token (and only it) is a start.
        assert mask[tok.encode(" " + sentence)].sum() == len(sentence.split())


def test_wordpiece_and_metaspace_word_starts(sentences, tmp_path):
    wordpiece = train(sentences, SPECIAL_TOKENS, pre_tokenizer=pre_tokenizers.BertPreTokenizer(),
                      model=models.WordPiece(unk_token="[UNK]"),
                      trainer_cls=trainers.WordPieceTrainer)
    metaspace = train(sentences, SPECIAL_TOKENS, pre_tokenizer=pre_tokenizers.Metaspace(),
                      model=models.BPE(unk_token="[UNK]"))
    for tok, name, starts in ((wordpiece, "wp", lambda t: not t.startswith("##")),
                              (metaspace, "ms", lambda t: t.startswith("\u2581"))):
        path = str(tmp_path / f"{name}.json")
        tok.save(path)
        ours = load_tokenizer(path)
        mask = ours.word_start_mask()
        assert ours.special.as_array().tolist() == [0, 1, 2, 3, 4] and mask[:5].all()
        assert all(mask[i] == starts(ours.id_to_token(i)) for i in range(5, ours.vocab_size))
        assert 0 < (~mask).sum() < ours.vocab_size
        assert ids_of(ours, sentences) == oracle_ids(path, sentences)


def test_roberta_names_and_the_normalizer_decides_the_case(sentences, tmp_path):
    tok = train(sentences, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    path = str(tmp_path / "roberta.json")
    tok.save(path)
    ours = load_tokenizer(path, lowercase=False)  # the file's normalizer wins over the argument
    assert ours.lowercase and ours.encode("The Cat").tolist() == ours.encode("the cat").tolist()
    assert (ours.special.cls, ours.special.pad, ours.special.sep, ours.special.unk,
            ours.special.mask) == (0, 1, 2, 3, 4)


def test_bad_files_give_one_clear_line(sentences, tmp_path):
    no_mask = train(sentences, ["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    no_mask.save(str(tmp_path / "no_mask.json"))
    (tmp_path / "garbled.json").write_text('{"version": "1.0", "model": ')
    (tmp_path / "other.json").write_text('{"hello": "world"}')
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    cases = [("no_mask.json", r"lacks the special tokens for mask \(\[MASK\] or <mask>\)"),
             ("garbled.json", "is not a Hugging Face tokenizer.json"),
             ("other.json", "is not a Hugging Face tokenizer.json"),
             ("empty", "holds no tokenizer")]
    for name, message in cases:
        with pytest.raises(UserError, match=message) as error:
            load_tokenizer(str(tmp_path / name))
        assert "\n" not in str(error.value)


def test_train_bpe(sentences, tmp_path):
    tok = train_bpe(sentences, vocab_size=400)
    assert isinstance(tok, JsonTokenizer) and tok.kind == "bpe" and tok.lowercase
    assert 300 < tok.vocab_size <= 400
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tok.special.as_array().tolist() == [0, 1, 2, 3, 4]
    ids = np.concatenate(tok.encode_batch(sentences + HARD_CASES))
    assert not np.isin(ids, [0, 1, 2, 3, 4]).any()  # byte-level: not even [UNK]
    sentence = sentences[7]
    assert tok.decode(tok.encode(sentence)) == sentence.lower()
    # A prefix space: a sentence's first word starts a word, as mid-text.
    assert tok.word_start_mask()[tok.encode(sentence)].sum() == len(sentence.split())
    tok.save(str(tmp_path / "bpe"))
    loaded = load_tokenizer(str(tmp_path / "bpe"))
    assert loaded.kind == "bpe" and pickle.loads(pickle.dumps(tok)).kind == "bpe"
    assert loaded.requested_vocab_size == 400 and ids_of(loaded, sentences) == ids_of(tok, sentences)
    again = train_bpe(sentences, vocab_size=400)
    assert [again.id_to_token(i) for i in range(again.vocab_size)] == \
        [tok.id_to_token(i) for i in range(tok.vocab_size)]
    assert not train_bpe(sentences[:50], vocab_size=300, lowercase=False).lowercase
    with pytest.raises(UserError, match="must exceed the 261 tokens"):
        train_bpe(sentences, vocab_size=261)
    with pytest.raises(UserError, match="the corpus is empty"):
        train_bpe(["", "  "], vocab_size=300)
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    assert build_tokenizer([str(path)], "sentences", "bpe", vocab_size=300).kind == "bpe"


def _config(tokenizer_type):
    spec = importlib.util.spec_from_file_location("tiny", os.path.join(REPO, "configs", "tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.data.tokenizer_type = tokenizer_type
    return config


def test_settings_accept_bpe_and_refuse_unknown_kinds():
    assert pretrain_settings.read(_config("bpe")).data.tokenizer_type == "bpe"
    with pytest.raises(UserError, match="unknown data.tokenizer_type 'unigram'"):
        pretrain_settings.read(_config("unigram"))


def prepare(*args):
    return cli_in_process.run("data.prepare", *args, "--workers", "1", "--no-progress")


def test_prepare_a_corpus_with_a_tokenizer_json(modernbert_like, sentences, tmp_path):
    corpus = tmp_path / "corpus.txt"
    documents = [sentences[i:i + 10] for i in range(0, 60, 10)]
    corpus.write_text("\n\n".join("\n".join(d) for d in documents) + "\n", encoding="utf-8")
    out = tmp_path / "prepared"
    result = prepare("--input", str(corpus), "--output", str(out), "--vocab", modernbert_like)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"prepared {out}: 6 documents, 60 sentences")
    prepared = PreparedCorpus.open(str(out))
    assert prepared.tokenizer.kind == "json"
    flat = [s for d in documents for s in d]
    expected = oracle_ids(modernbert_like, flat)
    assert [prepared.tokens(i, i + 1).tolist() for i in range(len(flat))] == expected
    # A byte-level BPE trained on the corpus, and found again by a second run.
    args = ("--input", str(corpus), "--output", str(tmp_path / "trained"), "--train-vocab", "bpe",
            "--vocab-size", "300")
    assert prepare(*args).returncode == 0
    again = prepare(*args)
    assert again.returncode == 0 and "using the tokenizer trained earlier" in again.stderr
    assert PreparedCorpus.open(str(tmp_path / "trained")).tokenizer.kind == "bpe"


def test_an_export_carries_the_tokenizer_json_for_autotokenizer_and_back(modernbert_like,
                                                                         sentences, tmp_path):
    """What `export --format hf` writes for a tokenizer.json vocabulary: AutoTokenizer loads it
    as a fast tokenizer with the same ids and special tokens, and `convert --from-hf` reads it
    back as the same tokenizer."""
    ours = load_tokenizer(modernbert_like)
    out = tmp_path / "hf"
    out.mkdir()
    assert hf_files.write_tokenizer(str(out), ours, model_max_length=512) is None
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    assert auto.is_fast and auto.mask_token == "[MASK]" and auto.model_max_length == 512
    texts = sentences[:20] + HARD_CASES
    assert [auto(t, add_special_tokens=False)["input_ids"] for t in texts] == ids_of(ours, texts)
    back, notes = hf_files.read_tokenizer(str(out))
    assert notes == [] and ids_of(back, texts) == ids_of(ours, texts)
    assert back.special == ours.special
