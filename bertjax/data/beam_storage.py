"""What a Beam preparation's workers read and write on a bucket (gs://), where a runner's workers
see no disk of the driver's (Dataflow): inputs named by URL, each fetched by the worker that
reads it, and shards uploaded straight into OUTPUT/shards/.

A shard on a bucket is complete when its last object, COMPLETE_MARKER, is there: a worker writes
the shard into a local temporary directory (corpus.write_shard, the local bytes) and uploads its
files with that one last, each object whole. A shard without it is a killed upload, written
again. The bucket's plan.json ties its shards to one preparation, as the local plan does.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import tempfile
from typing import Iterable

import numpy as np

from bertjax.core import storage, transfer
from bertjax.core.errors import UserError
from bertjax.data import corpus
from bertjax.data.preparation_plan import PLAN
from bertjax.data.shard_writing import tokenize_and_write
from bertjax.data.tokenizer import Tokenizer

# corpus.write_shard's last array: its object on the bucket marks the shard complete.
COMPLETE_MARKER = "token_counts.npy"


def input_urls(specs: Iterable[str]) -> list[str]:
    """The objects URL specs name, in reading order (sources.resolve_inputs's, for a bucket): a
    glob its sorted matches, a prefix every object under it (sorted, hidden ones left out)."""
    urls: list[str] = []
    for spec in specs:
        fs, inner = storage.filesystem(spec)
        prefix = storage.scheme(spec) + "://"
        if any(c in spec for c in "*?["):
            with storage.reported(spec, "list"):
                matches = [prefix + m for m in sorted(fs.glob(inner))]
        else:
            matches = [storage.absolute(spec)]
        for match in matches:
            found = sorted(transfer.remote_files(match))
            if not found:
                raise storage.not_found(match)
            urls += [storage.join(match, name) if name else match for name in found
                     if not any(part.startswith(".") for part in name.split("/"))]
    return list(dict.fromkeys(urls))


def local_input(url: str) -> str:
    """A worker's local copy of one input (the cache's, fetched again only when it changed)."""
    return transfer.local_copy(url)


def shard_url(output_url: str, index: int) -> str:
    return storage.join(output_url, corpus.SHARDS_DIR, corpus.shard_name(index))


def shard_is_complete(output_url: str, index: int) -> bool:
    return storage.exists(storage.join(shard_url(output_url, index), COMPLETE_MARKER))


def complete_shards(output_url: str) -> set[int]:
    """Indices of the shards complete on the bucket."""
    shards = storage.join(output_url, corpus.SHARDS_DIR)
    fs, inner = storage.filesystem(shards)
    with storage.reported(shards, "list"):
        found = fs.find(inner, withdirs=False) if storage.object_info(fs, inner) else []
    complete = set()
    for name in found:
        shard, file = posixpath.split(posixpath.relpath(name, inner))
        if file == COMPLETE_MARKER and shard.startswith("shard-"):
            complete.add(int(shard.rsplit("-", 1)[1]))
    return complete


def write_shard(output_url: str, index: int, group: list[list[str]], tokenizer: Tokenizer) -> None:
    """Tokenizes and writes shard `index` here, then uploads it, its marker last."""
    with tempfile.TemporaryDirectory(prefix="bertjax-shard-") as local:
        tokenize_and_write(tokenizer, local, index, group)
        transfer.upload_tree(corpus.shard_path(local, index), shard_url(output_url, index),
                             last=(COMPLETE_MARKER,))


def shard_stats(output_url: str, index: int) -> corpus.ShardStats:
    """Counts of a complete shard on the bucket, from its boundary arrays."""
    url = shard_url(output_url, index)
    try:
        sentences = np.load(io.BytesIO(storage.read_bytes(storage.join(url,
                                                                       "sentence_bounds.npy"))))
        documents = np.load(io.BytesIO(storage.read_bytes(storage.join(url,
                                                                       "document_bounds.npy"))))
    except ValueError as e:
        raise UserError(f"corrupt shard {url}: {e}; delete it and run again") from None
    return corpus.ShardStats(len(documents) - 1, len(sentences) - 1, int(sentences[-1]))


def claim(output_url: str, local_output: str) -> None:
    """The bucket's plan.json: this preparation's (the local one's, `local_output`'s), or
    uploaded now; another's is refused, its shards untouched."""
    url = storage.join(output_url, PLAN)
    with open(os.path.join(local_output, PLAN), "rb") as f:
        local = f.read()
    plan = json.loads(local)
    if storage.exists(url):
        try:
            stored = json.loads(storage.read_bytes(url))
        except ValueError as e:
            raise UserError(f"cannot read {url}: {e}") from None
        if stored.get("fingerprint") != plan["fingerprint"]:
            raise UserError(f"{output_url} holds an unfinished preparation of other inputs or "
                            "settings; nothing was changed (choose another output)")
        return
    storage.write_bytes(url, local)


def unclaim(output_url: str) -> None:
    """The bucket's plan.json removed (a run refused before its first shard)."""
    storage.remove(storage.join(output_url, PLAN))
