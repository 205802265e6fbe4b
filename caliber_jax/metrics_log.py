"""A training run's `metrics.jsonl`, one JSON row per logged step, kept one row per step across
resumes, and its TensorBoard scalars."""

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


class MetricsWriter:
    """One line of `metrics.jsonl` per logged step in the workdir, and TensorBoard scalars; with
    `active` False (every process but the first) it writes nothing.

    TensorBoard is optional (`config.tensorboard`): tensorboardX imports torch, seconds per
    launch, which the CPU demo does without.
    """

    def __init__(
        self, workdir: str | os.PathLike, *, tensorboard: bool, start: int = 0, active: bool = True
    ):
        workdir = paths.as_path(workdir)
        self.log = workdir / "metrics.jsonl"
        self.active = active
        self.tensorboard = None
        if not active:
            return
        # Resumed at step `start`: the rows logged after its checkpoint are logged again.
        trim_after(self.log, last_step=start)
        if tensorboard:
            from tensorboardX import SummaryWriter  # writes gs:// and s3:// logdirs itself

            self.tensorboard = SummaryWriter(os.fspath(workdir / "tensorboard"))

    def write(self, metrics: dict[str, float], step_num: int) -> None:
        if not self.active:
            return
        if self.tensorboard is not None:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, value, step_num)
            self.tensorboard.flush()
        line = json.dumps({"step": step_num, **metrics}) + "\n"
        if paths.is_remote(self.log):  # object stores cannot append: rewrite the (small) file
            self.log.write_text((self.log.read_text() if self.log.exists() else "") + line)
            return
        with self.log.open("a") as handle:
            handle.write(line)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
