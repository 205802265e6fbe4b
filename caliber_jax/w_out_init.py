"""W_out's starting value: Xavier (LEAF's) or a least-squares fit to the teacher (linear probe).

A new W_out (student width d -> teacher dim D) starts random, so the first steps of distillation
push gradients through a projection that scrambles the pretrained student's features (LP-FT,
Kumar et al. 2022: fit the head first, then fine-tune). `"lstsq"` fits W_out once, before training,
by ridge regression from the student's unit pooled vectors of training passages onto their
teacher vectors, with zero bias; training then starts from the best linear map instead.
"""

import hashlib
import json
from collections.abc import Callable

import numpy as np
from etils import epath
from safetensors import numpy as safetensors_numpy

FILE = "w_out_init.safetensors"
METHODS = ("xavier", "lstsq")
# The share of W_out's drawn rows that scores a fit on the others (`split_rows`).
HELD_OUT = 0.1


def ridge_projection(features_nd: np.ndarray, targets_nk: np.ndarray, ridge: float) -> np.ndarray:
    """argmin_W ||F W - T||^2 + ridge * N * ||W||^2: the [d, D] kernel, float32.

    Args:
      features_nd: [N, d] student pooled vectors (the inputs W_out sees).
      targets_nk: [N, D] teacher vectors.
      ridge: penalty per row (scaled by N, so it does not shrink as rows are added).
    """
    features = np.asarray(features_nd, np.float64)
    targets = np.asarray(targets_nk, np.float64)
    if features.ndim != 2 or targets.ndim != 2 or len(features) != len(targets):
        raise ValueError(
            f"ridge_projection: features {features.shape} and targets {targets.shape} must be "
            "[N, d] and [N, D] with the same N"
        )
    if ridge < 0:
        raise ValueError(f"ridge_projection: ridge must be >= 0, got {ridge}")
    n, d = features.shape
    gram = features.T @ features + ridge * n * np.eye(d)
    return np.linalg.solve(gram, features.T @ targets).astype(np.float32)


def mean_cosine(features_nd: np.ndarray, kernel_dk: np.ndarray, targets_nk: np.ndarray) -> float:
    """Mean cos(F_i W, T_i): how well the projection points at the teacher (1 = exactly)."""
    projected = np.asarray(features_nd, np.float64) @ np.asarray(kernel_dk, np.float64)
    projected /= np.maximum(np.linalg.norm(projected, axis=1, keepdims=True), 1e-12)
    targets = np.asarray(targets_nk, np.float64)
    targets = targets / np.maximum(np.linalg.norm(targets, axis=1, keepdims=True), 1e-12)
    return float(np.mean(np.sum(projected * targets, axis=1)))


def split_rows(total: int, *, fit_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random draw of training rows for W_out's fit: (rows fitted on, rows scored on).

    `min(total, fit_rows)` rows are drawn from the whole corpus, not taken from its start: a
    corpus in filing order would otherwise fit (and score) on its first filings only. A
    `HELD_OUT` share of the draw (at least 1 row) is set apart to score the fit; `fit` refits on
    the whole draw afterwards. Both index arrays come back sorted.

    Args:
      total: rows in the training split.
      fit_rows: the most rows to draw (`config.model.w_out_fit_rows`).
      seed: the draw's seed (`config.seed`).
    """
    if total < 2:
        raise ValueError(f"w_out_init.split_rows: needs at least 2 passages, got {total}")
    if fit_rows < 2:
        raise ValueError(f"w_out_init.split_rows: fit_rows must be >= 2, got {fit_rows}")
    drawn = min(total, fit_rows)
    fitted = drawn - max(1, int(round(HELD_OUT * drawn)))
    order = np.random.default_rng(seed).permutation(total)
    return np.sort(order[:fitted]), np.sort(order[fitted:drawn])


def fit(
    encode_fn,
    texts: list[str],
    targets_nk: np.ndarray,
    *,
    heldout_rows: int,
    ridge: float,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Fits W_out on `texts` -> `targets_nk`; returns ({dense.kernel, dense.bias}, report).

    `encode_fn(texts) -> [N, d]` gives the student's unit pooled vectors (before W_out). The last
    `heldout_rows` rows score a fit on the others, rows that fit never saw
    (`report["heldout_cos"]`; `split_rows` draws both sets at random); the kernel returned is then
    refitted on all rows. Unit features are enough: with zero bias, normalize(W p) does not
    depend on |p|.
    """
    if len(texts) != len(targets_nk):
        raise ValueError(f"w_out_init.fit: {len(texts)} texts but {len(targets_nk)} targets")
    if not 1 <= heldout_rows < len(texts):
        raise ValueError(
            f"w_out_init.fit: heldout_rows={heldout_rows} must leave 1 to {len(texts) - 1} of "
            f"the {len(texts)} rows to score"
        )
    features = np.asarray(encode_fn(list(texts)), np.float32)
    targets = np.asarray(targets_nk, np.float32)
    split = len(texts) - heldout_rows
    partial = ridge_projection(features[:split], targets[:split], ridge)
    kernel = ridge_projection(features, targets, ridge)
    report = {
        "rows": len(texts),
        "ridge": float(ridge),
        "heldout_rows": heldout_rows,
        "heldout_cos": mean_cosine(features[split:], partial, targets[split:]),
        "train_cos": mean_cosine(features, kernel, targets),
    }
    bias = np.zeros((kernel.shape[1],), np.float32)
    return {"dense.kernel": kernel, "dense.bias": bias}, report


def save(path: epath.PathLike, tensors: dict[str, np.ndarray], report: dict[str, float]) -> None:
    """Writes the fitted W_out (and the fit's report as metadata) atomically."""
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"report": json.dumps(report)}
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_bytes(safetensors_numpy.save(tensors, metadata=metadata))
    tmp.rename(path)


def load(path: epath.PathLike) -> dict[str, np.ndarray]:
    """Reads a W_out written by `save`."""
    path = epath.Path(path)
    tensors = safetensors_numpy.load(path.read_bytes())
    missing = {"dense.kernel", "dense.bias"} - set(tensors)
    if missing:
        raise ValueError(f"{path}: missing tensors {sorted(missing)}")
    return tensors


def fit_once(
    path: epath.PathLike,
    fit_fn: Callable[[], tuple[dict[str, np.ndarray], dict[str, float]]],
    *,
    process_index: int,
    barrier: Callable[[], None],
) -> tuple[dict[str, np.ndarray], dict[str, float] | None]:
    """The W_out kept at `path`, fitted once for all processes; returns (tensors, report).

    Process 0 calls `fit_fn() -> (tensors, report)` and saves the result, unless `path` already
    exists (a resumed run); every process then waits at `barrier` and reads the file, so all
    start from the same bytes. The report is None where this process did not fit.

    Args:
      path: the workdir's `FILE`, on a filesystem every process sees.
      fit_fn: runs `fit` (only called on process 0).
      process_index: this process.
      barrier: returns once every process has called it (a no-op for one process). Called
        unconditionally, so processes that disagree on whether `path` exists still meet there.
    """
    path = epath.Path(path)
    report = None
    if process_index == 0 and not path.exists():
        tensors, report = fit_fn()
        save(path, tensors, report)
    barrier()
    return load(path), report


def digest(tensors: dict[str, np.ndarray]) -> str:
    """A short SHA-256 of W_out's values (to check that processes start from the same one)."""
    hasher = hashlib.sha256()
    for name in sorted(tensors):
        hasher.update(name.encode())
        hasher.update(np.ascontiguousarray(tensors[name]).tobytes())
    return hasher.hexdigest()[:16]
