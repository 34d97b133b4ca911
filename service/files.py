"""Serving checkpoint files and archives: conditional GET, Range (via Starlette), tar streams.

Files are served from the reader the store opened without following links, never by a path
of our own: what was checked is what is sent (docs/design/checkpoints.md, "Checkpoint store").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from fastapi import Response
from fastapi.responses import FileResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from trainctl.service.archive import CHUNK, checkpoint_tar, reader_chunks
from trainctl.store.checkpoints.consolidate import ConsolidatedModel
from trainctl.store.checkpoints.info import CheckpointInfo
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, MODEL_FILE, sha256_of
from trainctl.store.checkpoints.storage import Reader
from trainctl.store.checkpoints.store import CheckpointStore


class CheckpointFileResponse(FileResponse):
    """A FileResponse of a reader with a local path, which it closes when the response ends.

    Starlette opens the path it is given (once per range); the reader's path opens the very
    file the reader holds, whatever its name points to by then.
    """

    # Starlette reads 64 KiB per await, each in a worker thread: a GiB-sized weight file
    # is 16,384 thread hops. 1 MiB reads serve it several times faster (docs/performance.md).
    chunk_size = CHUNK

    def __init__(self, reader: Reader, path: str, **kwargs: Any) -> None:
        self.reader = reader
        super().__init__(path, stat_result=os.stat(path), **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.reader.close()  # also when the client went away mid-download


def streamed_file_response(reader: Reader, **kwargs: Any) -> Response:
    """A file the storage cannot offer by a local path, streamed whole (a Range request
    gets all of it, which HTTP allows)."""

    def chunks() -> Iterator[bytes]:
        with reader:
            yield from reader_chunks(reader, reader.size, "the file")

    response = StreamingResponse(chunks(), **kwargs)
    response.headers["Content-Length"] = str(reader.size)
    return response


# What the file and archive routes of a store (/checkpoints, /exports) answer, for OpenAPI.
FILE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The file (JSON for metadata and manifest); Range requests get 206.",
          "content": {"application/octet-stream": {}, "application/json": {}}},
    206: {"description": "The requested byte range."},
    304: {"description": "If-None-Match matched the ETag (the file's sha256)."},
    307: {"description": "TRAINCTL_DOWNLOADS=redirect and a bucket: the file at a short-lived "
                         "presigned URL (Location) of the save the manifest names; follow it "
                         "without this service's Authorization header."},
    416: {"description": "The range is outside the file."},
}  # fmt: skip
ARCHIVE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "A tar of `<tag>/<file>` members.", "content": {"application/x-tar": {}}}
}


def checkpoint_file_response(
    ckpts: CheckpointStore,
    experiment: str,
    tag: str,
    name: str,
    if_none_match: str | None,
    redirect_seconds: int | None = None,
) -> Response:
    """The file, or 304 when the client holds it already. The ETag is the file's sha256.

    FileResponse answers Range (206, or 416 for a range past the end) and If-Range against
    this ETag; a sha256 ETag stays valid across copies of the store, unlike mtime-based ones.
    With `redirect_seconds` (Settings.redirect_seconds), a storage that can serve the file
    itself (a bucket) gets the client sent there instead: `redirect_response`.
    """
    if name == MODEL_FILE and (model := ckpts.consolidated(experiment, tag)) is not None:
        return consolidated_response(model, if_none_match)
    if redirect_seconds is not None and name != MANIFEST_FILE:
        info, url = ckpts.file_url(experiment, tag, name, redirect_seconds)
        if url is not None:
            return redirect_response(url, f'"{listed_sha256(info, name)}"', if_none_match)
    info, reader = ckpts.open_file(experiment, tag, name)
    try:
        if name == MANIFEST_FILE:
            # The manifest does not list itself; it is small.
            sha = sha256_of(ckpts.entry(experiment, tag), name)
        else:
            sha = listed_sha256(info, name)
        etag = f'"{sha}"'
        if if_none_match is not None and _matches(if_none_match, etag):
            reader.close()
            return Response(status_code=304, headers={"ETag": etag})
        media_type = "application/json" if name.endswith(".json") else "application/octet-stream"
        if reader.local_path is None:
            disposition = {"Content-Disposition": f'attachment; filename="{name}"'}
            return streamed_file_response(
                reader, media_type=media_type, headers={"ETag": etag, **disposition}
            )
        return CheckpointFileResponse(
            reader, reader.local_path, filename=name, media_type=media_type, headers={"ETag": etag}
        )
    except BaseException:
        reader.close()
        raise


def listed_sha256(info: CheckpointInfo, name: str) -> str:
    return str(next(f["sha256"] for f in info.files if f["name"] == name))


def redirect_response(url: str, etag: str, if_none_match: str | None) -> Response:
    """307 to the presigned URL (GET stays GET, Range goes along), or 304 as a streamed
    answer's. The URL is a credential until it expires: it goes in this answer alone (no
    log line, no cache: no-store), and clients drop our bearer token on the way (httpx and
    curl do so on a redirect to another origin)."""
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    headers = {"Location": url, "ETag": etag, "Cache-Control": "no-store"}
    return Response(status_code=307, headers=headers)


def consolidated_response(model: ConsolidatedModel, if_none_match: str | None) -> Response:
    """A sharded checkpoint's model file, stitched while it streams: its length is known up
    front, its ETag names the shards it is made of; a Range request gets all of it."""
    etag = f'"{model.etag}"'
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    response = StreamingResponse(
        model.chunks(),
        media_type="application/octet-stream",
        headers={"ETag": etag, "Content-Disposition": f'attachment; filename="{MODEL_FILE}"'},
    )
    response.headers["Content-Length"] = str(model.size)
    return response


def checkpoint_archive_response(ckpts: CheckpointStore, experiment: str, tag: str) -> Response:
    tar = checkpoint_tar(
        ckpts.get(experiment, tag),
        ckpts.entry(experiment, tag),
        ckpts.consolidated(experiment, tag),
    )
    return StreamingResponse(
        iter(tar),
        media_type="application/x-tar",
        headers={
            "Content-Disposition": f'attachment; filename="{tar.filename}"',
            "Content-Length": str(tar.size),
        },
    )


def _matches(if_none_match: str, etag: str) -> bool:
    candidates = {c.strip().removeprefix("W/") for c in if_none_match.split(",")}
    return "*" in candidates or etag in candidates
