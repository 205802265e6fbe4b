"""Work and data directories as `etils.epath` paths, so `gs://` (or any registered scheme) works.

Local paths become absolute (Orbax and TensorStore want absolute ones); `file://` URLs become the
local path they name; other URLs (`gs://bucket/run`) are kept and reach the filesystem package
that handles their scheme (gcsfs through epath, TensorStore's and Orbax's own GCS drivers).
"""

import os
import uuid
from collections.abc import Callable
from pathlib import Path

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


def write_atomic(path: str | os.PathLike, write_fn: Callable[[Path], None]) -> None:
    """Writes the local file `path` whole or not at all: `write_fn(tmp)` creates the file `tmp`
    beside `path`, which is then renamed over `path` (and removed if anything fails).

    The file gets the umask's permissions (0644 under umask 022), like any new file, however
    `write_fn` created it: safetensors' `save_file`, like `tempfile.mkstemp`, leaves it 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write_fn(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def umask() -> int:
    """The process's umask, read from /proc where it can be (setting it to read it, the only
    other way, would change it for other threads for a moment; then to the stricter 077)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def write_text_whole(path: str | os.PathLike, text: str) -> None:
    """`text` into the file `path`, which readers see whole or not at all: a local file written
    beside it and renamed over it (`write_atomic`), a remote one (`gs://...`) as one object
    upload, which an object store publishes only once complete."""
    if is_remote(path):
        as_path(path).write_text(text, encoding="utf-8")
    else:
        write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
