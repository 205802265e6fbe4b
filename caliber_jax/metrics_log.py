"""A training run's `metrics.jsonl`, one JSON row per logged step, kept one row per step across
resumes."""

import json
import os

from caliber_jax import paths


def trim_after(path: str | os.PathLike, *, last_step: int) -> None:
    """Drops the rows of the metrics log `path` past `last_step` (and a torn last line), rewriting
    it whole (atomically where local): a run resumed from the checkpoint of `last_step` replays
    the steps after it and logs them again."""
    path = paths.as_path(path)
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if line.endswith("\n") and json.loads(line)["step"] <= last_step]
    if len(kept) == len(lines):
        return
    paths.write_text_whole(path, "".join(kept))
