"""Work and data directories as `etils.epath` paths, so `gs://` (or any registered scheme) works.

Local paths become absolute (Orbax and TensorStore want absolute ones); `file://` URLs become the
local path they name; other URLs (`gs://bucket/run`) are kept and reach the filesystem package
that handles their scheme (gcsfs through epath, TensorStore's and Orbax's own GCS drivers).
"""

import os

from etils import epath

_FILE_SCHEME = "file://"


def as_path(path: str | os.PathLike) -> epath.Path:
    """A local path, `file://` URL or remote URL as an `epath.Path` (local ones made absolute)."""
    text = os.fspath(path)
    if text.startswith(_FILE_SCHEME):
        text = text[len(_FILE_SCHEME) :]
        if not text.startswith("/"):
            raise ValueError(f"{path}: a file:// URL needs an absolute path (file:///...)")
    if is_remote(text):
        return epath.Path(text)
    return epath.Path(text).expanduser().resolve()


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` is a URL other than `file://` (e.g. `gs://bucket/run`)."""
    text = os.fspath(path)
    return "://" in text and not text.startswith(_FILE_SCHEME)


def kvstore_spec(path: str | os.PathLike) -> str | dict[str, str]:
    """A TensorStore kvstore for a directory: the `file` driver, or the URL of a remote one."""
    path = as_path(path)
    if is_remote(path):
        return os.fspath(path).rstrip("/") + "/"
    return {"driver": "file", "path": os.fspath(path)}
