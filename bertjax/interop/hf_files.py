"""The files of a Hugging Face BERT directory: config.json, the weights, the tokenizer files.

    config.json                BertConfig fields
    model.safetensors          the state dict (or shards named by model.safetensors.index.json)
    pytorch_model.bin          the older torch format; read with torch.load(weights_only=True),
                               never plain pickle, and torch is imported only for it
    vocab.txt                  WordPiece vocabulary, one token a line
    tokenizer_config.json      do_lower_case and the special tokens (BertTokenizer's fields)
    special_tokens_map.json

Only bytes and names here; which model the weights make is `hf_models`' concern. Writers put files
into a directory the caller stages (see `output_dir`), so they never leave half an export behind.
"""

from __future__ import annotations

import json
import os
import pickle
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from bertjax.data.json_tokenizer import JSON_FILE, JsonTokenizer
from bertjax.data.tokenizer import (SPECIAL_TOKENS, SentencePieceTokenizer, Tokenizer,
                                    WordPieceTokenizer, load_tokenizer)
from bertjax.core import extras, json_records
from bertjax.core.errors import UserError

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
TORCH_BIN = "pytorch_model.bin"
INDEX_SUFFIX = ".index.json"
VOCAB = "vocab.txt"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# Where an export keeps a vocabulary that transformers has no BERT tokenizer for (SentencePiece).
BERTJAX_TOKENIZER = "bertjax_tokenizer"
SPIECE = "spiece.model"  # ALBERT's SentencePiece model
_OTHER_FRAMEWORKS = ("tf_model.h5", "flax_model.msgpack", "model.ckpt.index")
_SPECIAL_NAMES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")


def read_config(hf_dir: str) -> dict:
    """config.json as a dict; a directory without one is not a Hugging Face checkpoint."""
    if not os.path.isdir(hf_dir):
        raise UserError(f"{hf_dir} is not a directory")
    path = os.path.join(hf_dir, CONFIG)
    if not os.path.isfile(path):
        raise UserError(f"{hf_dir} is not a Hugging Face BERT checkpoint: it has no {CONFIG}")
    try:
        return json_records.read_object(path)
    except json_records.NotAnObject as e:
        raise UserError(f"cannot read {path}: it {e}") from None


def read_state_dict(hf_dir: str) -> dict[str, np.ndarray]:
    """The weights as numpy arrays, from safetensors (preferred) or pytorch_model.bin."""
    for name, reader in ((SAFETENSORS, _read_safetensors), (TORCH_BIN, _read_torch_bin)):
        path = os.path.join(hf_dir, name)
        if os.path.isfile(path):
            return reader(path)
        if os.path.isfile(path + INDEX_SUFFIX):
            return _read_shards(path + INDEX_SUFFIX, reader)
    others = [name for name in _OTHER_FRAMEWORKS if os.path.exists(os.path.join(hf_dir, name))]
    if others:
        raise UserError(f"{hf_dir} holds {others[0]}, weights of another framework; bertjax "
                        f"reads {SAFETENSORS} or {TORCH_BIN}")
    raise UserError(f"{hf_dir} has no weights: no {SAFETENSORS} or {TORCH_BIN}")


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    try:
        return load_file(path)  # bfloat16 comes back as ml_dtypes.bfloat16
    except Exception as e:  # SafetensorError for truncated or corrupt files, OSError
        raise UserError(f"cannot read {path} (truncated or not a safetensors file?): "
                        f"{e}") from None


def _read_torch_bin(path: str) -> dict[str, np.ndarray]:
    # torch is heavy, and needed only for this format (safetensors needs none)
    torch = extras.require("torch", "hf", f"reading {path} (PyTorch's format, not safetensors)")
    try:
        # weights_only: tensors and plain containers only; a pickled object that would run
        # code is refused instead of executed.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise UserError(f"refused {path}: it holds pickled Python objects besides tensors, "
                        "which could run code when loaded; it is not plain weights") from None
    except Exception as e:  # a truncated or corrupt archive
        message = " ".join(str(e).split())[:200]
        raise UserError(f"cannot read {path} (truncated or corrupt?): {message}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise UserError(f"{path} does not hold a state dict of tensors")
    # torch's bfloat16 has no numpy twin: widened to fp32, which is exact.
    return {name: (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()
            for name, t in state.items()}


def _read_shards(index_path: str, reader) -> dict[str, np.ndarray]:
    try:
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read the shard index {index_path}: {e}") from None
    state: dict[str, np.ndarray] = {}
    for name in files:
        path = os.path.join(os.path.dirname(index_path), name)
        if not os.path.isfile(path):
            raise UserError(f"{index_path} names {name}, which does not exist")
        state.update(reader(path))
    return state


def write_model(directory: str, config: dict, state_dict: dict[str, np.ndarray]) -> None:
    """config.json and model.safetensors (with the "pt" format tag transformers expects)."""
    with open(os.path.join(directory, CONFIG), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    arrays = {name: np.ascontiguousarray(value) for name, value in state_dict.items()}
    save_file(arrays, os.path.join(directory, SAFETENSORS), metadata={"format": "pt"})


def write_tokenizer(directory: str, tokenizer: Tokenizer, model_max_length: int,
                    fast: bool = False, albert: bool = False) -> str | None:
    """BertTokenizer's files for a WordPiece vocabulary; returns a warning when there is none.
    `fast` adds its tokenizer.json, which transformers needs for a model type whose own
    tokenizer is a fast one only (ModernBert's).

    `strip_accents` stays null: BERT then strips accents exactly when it lowercases, which is
    what our WordPiece tokenizer does.
    """
    if isinstance(tokenizer, JsonTokenizer):
        _write_fast_tokenizer(directory, tokenizer, model_max_length)
        return None
    if albert and isinstance(tokenizer, SentencePieceTokenizer):
        _write_albert_tokenizer(directory, tokenizer, model_max_length)
        return None
    if not isinstance(tokenizer, WordPieceTokenizer):
        tokenizer.save(os.path.join(directory, BERTJAX_TOKENIZER))
        return (f"{tokenizer.kind} vocabularies have no BERT tokenizer in transformers: the "
                f"export has no {VOCAB}, so AutoTokenizer cannot load it; the vocabulary is in "
                f"{BERTJAX_TOKENIZER}/ (bertjax.data.tokenizer.load_tokenizer reads it)")
    with open(os.path.join(directory, VOCAB), "w", encoding="utf-8") as f:
        f.writelines(tokenizer.id_to_token(i) + "\n" for i in range(tokenizer.vocab_size))
    if fast:
        with open(os.path.join(directory, JSON_FILE), "w", encoding="utf-8") as f:
            f.write(tokenizer.to_json())
    special = dict(zip(_SPECIAL_NAMES, SPECIAL_TOKENS))
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.lowercase,
              "strip_accents": None, "tokenize_chinese_chars": True, "do_basic_tokenize": True,
              "model_max_length": model_max_length, **special}
    for name, content in ((TOKENIZER_CONFIG, config), (SPECIAL_TOKENS_MAP, special)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2)
    return None


def _write_fast_tokenizer(directory: str, tokenizer: JsonTokenizer,
                          model_max_length: int) -> None:
    """tokenizer.json as it was read (ModernBERT's BPE, or one trained here), with the
    tokenizer_config.json that lets AutoTokenizer load it as a fast tokenizer."""
    with open(os.path.join(directory, JSON_FILE), "w", encoding="utf-8") as f:
        f.write(tokenizer.to_json())
    ids = tokenizer.special
    special = {name: tokenizer.id_to_token(getattr(ids, role)) for name, role in
               zip(_SPECIAL_NAMES, ("pad", "unk", "cls", "sep", "mask"))}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": False, **special}
    for name, content in ((TOKENIZER_CONFIG, config), (SPECIAL_TOKENS_MAP, special)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2)


def _write_albert_tokenizer(directory: str, tokenizer: SentencePieceTokenizer,
                            model_max_length: int) -> None:
    """spiece.model with the tokenizer_config.json that makes it AlbertTokenizer's: our special
    pieces, our lowercasing, accents kept (bertjax's SentencePiece tokenizer keeps them)."""
    with open(os.path.join(directory, SPIECE), "wb") as f:
        f.write(tokenizer.model_proto)
    ids = tokenizer.special
    special = {name: tokenizer.id_to_token(getattr(ids, role)) for name, role in
               zip(_SPECIAL_NAMES, ("pad", "unk", "cls", "sep", "mask"))}
    config = {"tokenizer_class": "AlbertTokenizer", "do_lower_case": tokenizer.lowercase,
              "keep_accents": True, "remove_space": True, "model_max_length": model_max_length,
              "bos_token": special["cls_token"], "eos_token": special["sep_token"], **special}
    for name, content in ((TOKENIZER_CONFIG, config), (SPECIAL_TOKENS_MAP, special)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2)


def read_tokenizer(hf_dir: str) -> tuple[Tokenizer | None, list[str]]:
    """(the tokenizer, notes on what it cannot follow); None when the directory has none."""
    if (not os.path.isfile(os.path.join(hf_dir, VOCAB))
            and os.path.isfile(os.path.join(hf_dir, JSON_FILE))):
        return load_tokenizer(hf_dir), []  # a fast tokenizer's file, ModernBERT's among them
    if (not os.path.isfile(os.path.join(hf_dir, VOCAB))
            and os.path.isfile(os.path.join(hf_dir, SPIECE))):
        return _albert_tokenizer(hf_dir)
    if not os.path.isfile(os.path.join(hf_dir, VOCAB)):
        ours = os.path.join(hf_dir, BERTJAX_TOKENIZER)
        if os.path.isdir(ours):
            return load_tokenizer(ours), []
        return None, [f"{hf_dir} has no {VOCAB}: converted without a tokenizer; pretraining "
                      "and fine-tuning need the model's own vocabulary"]
    settings = _read_json_object(os.path.join(hf_dir, TOKENIZER_CONFIG))
    # BertTokenizer's default is uncased, as for a bare vocab.txt.
    lowercase = bool(settings.get("do_lower_case", True))
    notes = []
    strip_accents = settings.get("strip_accents")
    if strip_accents is not None and bool(strip_accents) != lowercase:
        notes.append(f"the tokenizer sets strip_accents={strip_accents} with "
                     f"do_lower_case={lowercase}; bertjax strips accents exactly when it "
                     "lowercases")
    if settings.get("tokenize_chinese_chars") is False:
        notes.append("the tokenizer sets tokenize_chinese_chars=false; bertjax always splits "
                     "CJK characters")
    tokenizer = WordPieceTokenizer.from_vocab_file(os.path.join(hf_dir, VOCAB), lowercase)
    return tokenizer, notes


def _albert_tokenizer(hf_dir: str) -> tuple[Tokenizer, list[str]]:
    """ALBERT's spiece.model (its <pad> the padding piece), lowercased as AlbertTokenizer's
    do_lower_case says (true by default)."""
    settings = _read_json_object(os.path.join(hf_dir, TOKENIZER_CONFIG))
    lowercase = bool(settings.get("do_lower_case", True))
    notes = []
    if not settings.get("keep_accents", False):
        notes.append(f"{SPIECE}: AlbertTokenizer strips accents (keep_accents false); bertjax's "
                     "SentencePiece tokenizer keeps them, so accented text may tokenize "
                     "differently")
    return SentencePieceTokenizer.from_model_file(os.path.join(hf_dir, SPIECE), lowercase), notes


def _read_json_object(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        return json_records.read_object(path)
    except json_records.NotAnObject as e:
        if "not an object" in str(e):  # tokenizer_config.json is optional advice: ignored
            return {}
        raise UserError(f"cannot read {path}: it {e}") from None
