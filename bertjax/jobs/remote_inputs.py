"""The pretraining job's inputs named by URL, read through local copies on this host.

data.input (files, directories, globs), data.tokenizer and an existing data.prepared on a bucket
are fetched into the cache (core/transfer.py: again only when they changed) and the settings
point at the copies, so the data pipeline memory-maps local shards as it always does; with
`stream_prepared` (pretraining), an existing data.prepared on a bucket stays a URL and is read in
place (data/streamed_corpus.py). A
data.prepared URL that holds no corpus yet is prepared in a local working copy and uploaded when
complete (manifest last): the next run, on any host, finds it there. A refusal about a copy (a
damaged manifest) names the URL, not this host's copy.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from bertjax.core import storage, termination, transfer
from bertjax.core.errors import UserError
from bertjax.data import corpus
from bertjax.settings.pretrain import PretrainSettings


@dataclasses.dataclass(frozen=True)
class LocalInputs:
    settings: PretrainSettings  # with local paths in place of URLs
    upload_prepared_to: str | None  # the data.prepared URL a newly prepared corpus goes to
    urls: dict[str, str] = dataclasses.field(default_factory=dict)  # local copy -> its URL

    @contextlib.contextmanager
    def named_errors(self) -> Iterator[None]:
        """A refusal that names a local copy names its URL instead."""
        try:
            yield
        except UserError as e:
            text = str(e)
            for local, url in self.urls.items():
                text = text.replace(local, url)
            if text == str(e):
                raise
            raise UserError(text) from None


def localized(s: PretrainSettings, *, stream_prepared: bool = False) -> LocalInputs:
    d = s.data
    changes: dict = {}
    if d.input.strip() and any(storage.is_url(p.strip()) for p in d.input.split(",")):
        changes["input"] = ",".join(transfer.local_inputs(
            p.strip() for p in d.input.split(",") if p.strip()))
    if storage.is_url(d.tokenizer):
        changes["tokenizer"] = transfer.local_copy(d.tokenizer)
    upload_to = None
    if storage.is_url(d.prepared):
        storage.check_url(d.prepared)  # before a path is joined to it
        if storage.exists(storage.join(d.prepared, corpus.MANIFEST)):
            if not stream_prepared:
                changes["prepared"] = transfer.local_copy(d.prepared)
        else:
            storage.check_output_url(d.prepared, "a prepared corpus")
            changes["prepared"] = transfer.working_copy(d.prepared)
            upload_to = storage.absolute(d.prepared)
    if not changes:
        return LocalInputs(s, None)
    urls = {changes[key]: storage.absolute(getattr(d, key)) for key in ("tokenizer", "prepared")
            if key in changes}
    return LocalInputs(dataclasses.replace(s, data=dataclasses.replace(d, **changes)), upload_to,
                       urls)


def upload_prepared(local: LocalInputs) -> None:
    """A corpus prepared for a data.prepared URL, uploaded once complete."""
    if local.upload_prepared_to is None:
        return
    upload_corpus(local.settings.data.prepared, local.upload_prepared_to)


def upload_corpus(directory: str, url: str) -> None:
    """A prepared corpus uploaded, its manifest (what marks it complete) last; the preparation's
    own lock and staging files stay behind. SIGTERM stops it between two objects with one line:
    what is there without the manifest is no corpus to a reader, and the same command completes
    it (the corpus prepared on this host stays in its working copy)."""
    with termination.deferred_sigterm() as pending:
        def stop_if_asked(uploaded: list[str]) -> None:
            if pending.arrived and corpus.MANIFEST in uploaded:
                termination.end(f"stopped by SIGTERM as its upload ended: the prepared corpus "
                                f"at {url} is complete")
            if pending.arrived:
                termination.end(
                    f"stopped by SIGTERM while uploading the prepared corpus to {url}: "
                    f"{len(uploaded)} of its objects are there without its {corpus.MANIFEST}, "
                    "which is no corpus to a reader; the same command again completes the "
                    f"upload (or remove them: gsutil -m rm -r {url})")

        transfer.upload_tree(directory, url, last=(corpus.MANIFEST,),
                             only=lambda name: not name.startswith("."),
                             before_each=stop_if_asked)
