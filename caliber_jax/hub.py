"""Model folders by local path or Hugging Face Hub id: the one place a model name becomes a folder.

A name that is an existing path stays that path. Otherwise `org/name` (optionally `org/name@rev`,
a branch, tag or commit) is a Hub id, fetched into (or found in) the Hub cache by
`huggingface_hub.snapshot_download`, which honours `HF_HUB_CACHE` and `HF_HUB_OFFLINE`.
"""

import functools
import os
import re
from pathlib import Path

# Weight formats no backend here reads: a Hub snapshot leaves them out (all-MiniLM-L6-v2 ships
# ONNX, OpenVINO, TF, Rust and PyTorch copies of its 90 MB safetensors weights).
IGNORE_PATTERNS = (
    "*.bin", "*.pt", "*.pth", "*.h5", "*.ot", "*.msgpack", "*.onnx", "*.onnx_data", "*.tflite",
    "*.gguf", "onnx/*", "openvino/*", "coreml/*",
)  # fmt: skip
# huggingface_hub's `validate_repo_id`, with the namespace required: a bare word is a folder name.
_REPO_ID = re.compile(r"^[\w.\-]+/[\w.\-]+$")
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def is_offline() -> bool:
    """Whether Hub downloads are off: `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) as the
    environment holds it now. huggingface_hub reads it once, at import, so a later change would
    otherwise go unseen."""
    from huggingface_hub import constants

    return (
        constants.HF_HUB_OFFLINE
        or _is_true(os.environ.get("HF_HUB_OFFLINE"))
        or _is_true(os.environ.get("TRANSFORMERS_OFFLINE"))
    )


def parse_hub_id(name: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) of `org/name[@revision]`; None when `name` is not one."""
    if name.startswith(_PATH_PREFIXES) or "\\" in name or "://" in name:
        return None
    repo_id, at, revision = name.partition("@")
    valid = (
        _REPO_ID.match(repo_id)
        and len(repo_id) <= 96
        and "--" not in repo_id
        and ".." not in repo_id
        and not repo_id.endswith(".git")
    )
    if not valid or (at and not revision.strip()):
        return None
    return repo_id, revision or None


def resolve_model_dir(name: str | os.PathLike) -> Path:
    """The local folder of a model: `name` itself when it exists, else the Hub snapshot of the
    id `org/name[@revision]` (downloaded unless offline).

    Raises:
        FileNotFoundError: `name` looks like a path (or is no Hub id) and does not exist; or the
            Hub id is offline and not cached, or unknown to the Hub (one line naming it).
    """
    text = os.fspath(name)
    path = Path(text).expanduser()
    if path.exists():
        return path
    parsed = parse_hub_id(text)
    if parsed is None:
        raise FileNotFoundError(
            f"{text}: no such model folder (a Hub model is named org/name, "
            f"e.g. sentence-transformers/all-MiniLM-L6-v2)"
        )
    repo_id, revision = parsed
    # Read now, not at huggingface_hub's import: a test or launcher may set it afterwards.
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    return Path(_snapshot(text, repo_id, revision, cache_dir, is_offline()))


@functools.cache  # one Hub look-up per model and process, however many loaders ask for it
def _snapshot(name: str, repo_id: str, revision: str | None, cache_dir, offline: bool) -> str:
    from huggingface_hub import errors, snapshot_download

    where = f"{repo_id}@{revision}" if revision else repo_id
    command = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    fix = f"download it with `{command}` where there is network, or pass a local folder"
    try:
        return snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=offline,
            ignore_patterns=list(IGNORE_PATTERNS),
        )
    except errors.RevisionNotFoundError:
        raise FileNotFoundError(
            f"{name}: the Hub model {repo_id} has no revision {revision!r}"
        ) from None
    except errors.GatedRepoError:
        raise FileNotFoundError(
            f"{name}: the Hub model {repo_id} is gated: accept its terms on the Hub and log in "
            f"(`hf auth login`), or pass a local folder"
        ) from None
    except errors.RepositoryNotFoundError:
        raise FileNotFoundError(
            f"{name}: no local folder at this path and no Hub model {repo_id} (or it is private: "
            f"log in with `hf auth login`)"
        ) from None
    except errors.LocalEntryNotFoundError as error:  # offline, or the Hub out of reach
        if isinstance(error, getattr(errors, "IncompleteSnapshotError", ())):  # newer versions
            reason = "is only partly in the Hub cache"
        elif offline:
            reason = "is not in the Hub cache and HF_HUB_OFFLINE is set"
        else:
            reason = "is not in the Hub cache and the Hub cannot be reached"
        raise FileNotFoundError(
            f"{name}: no local folder at this path, and the Hub model {where} {reason}: {fix}"
        ) from None
    except errors.HfHubHTTPError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(f"{name}: the Hub refused the download ({first})") from None
