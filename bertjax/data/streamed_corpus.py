"""A prepared corpus on a bucket, read in place: its index once, then only the token ranges that
examples need, as byte ranges of its shards' tokens.npy.

Opening fetches the manifest, the tokenizer (a local copy, core/transfer.py), every shard's
sentence_bounds.npy, document_bounds.npy and token_counts.npy whole, and the header of every
tokens.npy (corpus.py writes them with np.save's format 1.0: the header ends at a byte offset,
after which token t of the shard is bytes [offset + t * itemsize, offset + (t + 1) * itemsize)).
The corpus is then a PreparedCorpus whose shard token arrays are `StreamedShard`s: slicing one
gives the tokens of the range from

- the ranges fetched ahead for the batch being built (`serving`; read_ahead.py fetches them), or
- a recording of the ranges asked for (`recording`; how read_ahead.py plans a batch's reads: the
  ranges an example reads depend on the corpus's index and the example's generator only, never
  on the token values, so building the examples over zeros names exactly the ranges the real
  build reads), or
- outside both, a read of that range now (inspection, tests).

Ranges are read with fsspec's `cat_ranges` (gcsfs: concurrent ranged GETs over one aiohttp
session) through core/storage.py, each call bounded like every storage call of a command
(storage_deadline). Why not TensorStore: its array drivers (zarr, n5) would need the corpus in
another format, and its "raw bytes" kvstore reads a range just as cat_file does; the batches stay
a pure function of (seed, step), so what is read and when is planned here either way.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import json
import threading
from typing import Iterator, Sequence

import numpy as np

from bertjax.core import storage, storage_deadline, transfer
from bertjax.core.errors import UserError
from bertjax.data import corpus
from bertjax.data.tokenizer import load_tokenizer

HEADER_PROBE = 256  # bytes read for a tokens.npy header (np.save writes 128 for 1-d arrays)
# Ranges of one shard closer than this are read in one request: fewer requests for a few bytes.
MERGE_GAP_BYTES = 512
_INDEX = ("sentence_bounds", "document_bounds", "token_counts")

Range = tuple[int, int, int]  # (shard index, first token, end token) within the shard


class StreamedShard:
    """One shard's tokens.npy on the bucket, sliced like the memory map it stands in for."""

    def __init__(self, index: int, url: str, path: str, offset: int, dtype: np.dtype,
                 length: int):
        self.index, self.url, self.path, self.offset = index, url, path, offset  # path: fsspec's
        self.dtype, self.length = np.dtype(dtype), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: slice) -> np.ndarray:
        begin, end, stride = key.indices(self.length)
        if stride != 1:
            raise ValueError("a streamed shard is sliced with step 1 only")
        end = max(begin, end)
        source = getattr(_context, "source", None)
        if source is None:
            tokens, _ = read_ranges({self.index: self}, [(self.index, begin, end)])
            return tokens[(self.index, begin, end)]
        return source(self, begin, end)

    def byte_range(self, begin: int, end: int) -> tuple[int, int]:
        return self.offset + begin * self.dtype.itemsize, self.offset + end * self.dtype.itemsize


_context = threading.local()  # .source: how this thread's slices are answered


@contextlib.contextmanager
def recording() -> Iterator[list[Range]]:
    """Slices answer zeros and append their range to the list yielded."""
    ranges: list[Range] = []

    def record(shard: StreamedShard, begin: int, end: int) -> np.ndarray:
        ranges.append((shard.index, begin, end))
        return np.zeros(end - begin, shard.dtype)

    with _answered_by(record):
        yield ranges


@contextlib.contextmanager
def serving(fetched: dict[Range, np.ndarray]) -> Iterator[None]:
    """Slices answer from `fetched`; a range not there is a planning error (a bug)."""
    def serve(shard: StreamedShard, begin: int, end: int) -> np.ndarray:
        key = (shard.index, begin, end)
        if key not in fetched:
            raise RuntimeError(f"tokens {begin}:{end} of {shard.url} were not fetched ahead")
        return fetched[key]

    with _answered_by(serve):
        yield


@contextlib.contextmanager
def _answered_by(source) -> Iterator[None]:
    saved = getattr(_context, "source", None)
    _context.source = source
    try:
        yield
    finally:
        _context.source = saved


def coalesced(shards: dict[int, StreamedShard], ranges: Sequence[Range]) -> list[tuple[int, int, int]]:
    """(shard index, first byte, end byte) requests covering `ranges`: sorted, overlaps and
    ranges less than MERGE_GAP_BYTES apart merged."""
    requests: list[list[int]] = []
    for index, begin, end in sorted(set(ranges)):
        if end <= begin:
            continue
        first, last = shards[index].byte_range(begin, end)
        if requests and requests[-1][0] == index and first - requests[-1][2] <= MERGE_GAP_BYTES:
            requests[-1][2] = max(requests[-1][2], last)
        else:
            requests.append([index, first, last])
    return [tuple(r) for r in requests]


def read_ranges(shards: dict[int, StreamedShard],
                ranges: Sequence[Range]) -> tuple[dict[Range, np.ndarray], int]:
    """({range: its tokens}, bytes fetched) for `ranges`, in as few requests as coalesced()
    makes, sent concurrently; a storage fault is one UserError naming the object."""
    requests = coalesced(shards, ranges)
    tokens: dict[Range, np.ndarray] = {(i, b, e): np.zeros(0, shards[i].dtype)
                                       for i, b, e in ranges if e <= b}
    if not requests:
        return tokens, 0
    url = shards[requests[0][0]].url
    fs, _ = storage.filesystem(url)
    paths = [shards[i].path for i, _, _ in requests]
    nbytes = sum(last - first for _, first, last in requests)
    with storage.reported(url, "read"):
        storage_deadline.progress(nbytes)
        bodies = fs.cat_ranges(paths, [r[1] for r in requests], [r[2] for r in requests],
                               on_error="raise")
    for (index, first, last), body in zip(requests, bodies):
        if len(body) != last - first:
            raise UserError(f"cannot read {shards[index].url}: bytes {first}-{last} came back "
                            f"{len(body)} long; was the corpus replaced while the run reads it?")
    starts = [(index, first) for index, first, _ in requests]
    for index, begin, end in ranges:
        if end <= begin:
            continue
        first, _ = shards[index].byte_range(begin, end)
        held = bisect.bisect_right(starts, (index, first)) - 1  # the request that covers it
        tokens[(index, begin, end)] = np.frombuffer(
            bodies[held], shards[index].dtype, end - begin, first - requests[held][1])
    return tokens, nbytes


class StreamedCorpus(corpus.PreparedCorpus):
    """A PreparedCorpus over StreamedShards. Pickled whole (the index with it) into worker
    processes, which never read the bucket: they build from ranges fetched for them."""

    reopen_in_workers = False

    def __init__(self, *args, shards: Sequence[StreamedShard], index_bytes: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.shards = {shard.index: shard for shard in shards}
        self.index_bytes = index_bytes  # what opening it fetched, tokenizer excluded


def open_streamed(url: str) -> StreamedCorpus:
    """The prepared corpus at `url`, its index fetched, its tokens left on the bucket."""
    url = storage.absolute(url)
    manifest_url = storage.join(url, corpus.MANIFEST)
    if not storage.exists(manifest_url):
        raise UserError(f"{url} is not a prepared corpus (no {corpus.MANIFEST}; was preparation "
                        "interrupted? run it again to finish)")
    raw = storage.read_bytes(manifest_url)
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise UserError(f"cannot read {manifest_url}: {e}") from None
    corpus.check_manifest(manifest, manifest_url)
    names = [shard["name"] for shard in manifest["shards"]]
    shard_urls = [storage.join(url, corpus.SHARDS_DIR, name) for name in names]
    index_urls = [storage.join(shard, f"{array}.npy") for shard in shard_urls for array in _INDEX]
    token_urls = [storage.join(shard, "tokens.npy") for shard in shard_urls]
    fs, _ = storage.filesystem(url)
    inner = {u: storage.filesystem(u)[1] for u in index_urls + token_urls}
    with storage.reported(url, "read"):
        index = fs.cat([inner[u] for u in index_urls], on_error="raise")
        heads = fs.cat_ranges([inner[u] for u in token_urls], [0] * len(token_urls),
                              [HEADER_PROBE] * len(token_urls), on_error="raise")
    arrays = {array: [_npy(index[inner[storage.join(shard, f"{array}.npy")]],
                           storage.join(shard, f"{array}.npy")) for shard in shard_urls]
              for array in _INDEX}
    shards = [_shard(i, token_url, inner[token_url], head) for i, (token_url, head)
              in enumerate(zip(token_urls, heads))]
    tokenizer = load_tokenizer(transfer.local_copy(storage.join(url, corpus.TOKENIZER_DIR)))
    if tokenizer.vocab_size != manifest["vocab_size"]:
        raise UserError(f"{url}: tokenizer has {tokenizer.vocab_size} tokens, the manifest says "
                        f"{manifest['vocab_size']}")
    index_bytes = len(raw) + sum(len(b) for b in index.values()) + sum(len(h) for h in heads)
    opened = StreamedCorpus(shards, arrays["sentence_bounds"], arrays["document_bounds"],
                            np.sum(arrays["token_counts"], axis=0), tokenizer, url,
                            shards=shards, index_bytes=index_bytes)
    opened.manifest = manifest
    return opened


def _npy(data: bytes, url: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError) as e:
        raise UserError(f"corrupt prepared corpus: cannot read {url}: {e}") from None


def _shard(index: int, url: str, path: str, head: bytes) -> StreamedShard:
    """The shard's tokens.npy from its first bytes: where its data starts, dtype and length."""
    f = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(f)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(f)
    except (OSError, ValueError) as e:
        raise UserError(f"corrupt prepared corpus: cannot read the header of {url} (the first "
                        f"{HEADER_PROBE} bytes): {e}") from None
    if len(shape) != 1 or fortran or dtype.hasobject:
        raise UserError(f"corrupt prepared corpus: {url} is not a 1-d token array")
    return StreamedShard(index, url, path, f.tell(), dtype, int(shape[0]))
