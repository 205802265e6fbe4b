"""Black-box teachers through PyTorch: any local sentence-transformers or transformers directory.

The Flax `Embedder` covers the families we port (Qwen3, BERT, MPNet); this backend runs any other
model (and the ported ones, as a reference) as the teacher or as an evaluated model, on CPU or
CUDA, and returns the same
`texts -> [n, D]` L2-normalised float32 vectors, so `teacher.embed_to_store` writes the same
stores (chunks, done markers, metadata) whichever backend encoded them. No jax.
"""

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from caliber_jax import tokenization
from caliber_jax.data import padding
from caliber_jax.models import st_layout
from caliber_jax.models.st_layout import is_sentence_transformers_dir, read_st_pooling

_DTYPES = ("float32", "bfloat16", "float16", "auto")
# The config file each module kind's folder holds. sentence-transformers reads a missing one as
# {} and fails later with a TypeError (Dense) or loads defaults silently; a Normalize module has
# no settings, and older sentence-transformers saved it without a folder.
_MODULE_CONFIGS = {"Transformer": "config.json", "Pooling": "config.json", "Dense": "config.json"}
_FOLDERLESS_MODULES = ("Normalize",)


def check_tokenizer_files(tokenizer_dir: Path) -> None:
    """Raises a ValueError naming `tokenizer_dir` when it holds none of the tokenizer files
    (`tokenization.TOKENIZER_FILES`, what the Flax backend requires): transformers would load an
    empty vocabulary (every word [UNK]) and encode without an error."""
    if not any((tokenizer_dir / name).is_file() for name in tokenization.TOKENIZER_FILES):
        raise ValueError(f"{tokenizer_dir}: no tokenizer files "
                         f"({', '.join(tokenization.TOKENIZER_FILES)})")  # fmt: skip


def check_st_modules(model_dir: Path) -> None:
    """Raises a ValueError naming the folder or file when a module that `modules.json` lists has
    no folder or no config in it, and when the Transformer module's folder has no tokenizer:
    checked before sentence-transformers loads them (a TypeError traceback, or an empty
    tokenizer, there)."""
    listing = model_dir / "modules.json"
    for module in st_layout.read_json(listing):
        kind = st_layout.module_kind(module)
        if kind in _FOLDERLESS_MODULES:
            continue
        folder = model_dir / module.get("path", "")
        if not folder.is_dir():
            raise ValueError(f"{folder}: the {kind} module listed in {listing} is missing")
        config = _MODULE_CONFIGS.get(kind)
        if config and not (folder / config).is_file():
            raise ValueError(f"{folder}: the {kind} module listed in {listing} has no {config}")
        if kind == "Transformer":
            check_tokenizer_files(folder)


def check_max_length(
    max_length: int | None, *, model_dir: Path, own: int, positions: int | None
) -> int:
    """The token limit to encode at: `max_length`, or the model's `own` for None or 0 (as the Flax
    backend reads 0). A negative one, or one past the `positions` the model embeds, is a
    ValueError naming `model_dir` (torch would fail mid-run with a size-mismatch traceback)."""
    if not max_length:
        return own
    if max_length < 0:
        raise ValueError(f"{model_dir}: max_length={max_length} is negative (0 or None: the "
                         f"model's own, {own})")  # fmt: skip
    if positions is not None and max_length > positions:
        raise ValueError(f"{model_dir}: max_length={max_length} exceeds the {positions} "
                         "positions the model embeds (max_position_embeddings)")  # fmt: skip
    return max_length


def position_limit(model) -> int | None:
    """The longest input a torch `model` (a transformers model, or a pipeline holding one) embeds:
    the rows of its learned position table, less RoBERTa-style offsets (XLM-R, MPNet: positions
    start after the pad id, so 514 rows hold 512), else its config's `max_position_embeddings`
    (rotary positions), else None."""
    import torch

    for module in model.modules():
        if isinstance(getattr(module, "position_embeddings", None), torch.nn.Embedding):
            padding_idx = getattr(module, "padding_idx", None)
            offset = padding_idx + 1 if isinstance(padding_idx, int) else 0
            return module.position_embeddings.num_embeddings - offset
    for module in model.modules():
        positions = getattr(getattr(module, "config", None), "max_position_embeddings", None)
        if isinstance(positions, int) and positions > 0:  # xlnet's -1: no limit
            return positions
    return None


def resolve_device(device: str) -> str:
    """Resolves "auto" to "cuda" when torch sees a GPU, else "cpu"; other values pass through."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def autocast_bf16(dtype: str, device: str) -> bool:
    """Whether `dtype` "auto" runs float32 weights under bfloat16 autocast on `device`
    (`host.auto_bf16`, the Flax `Embedder`'s rule too): float32 norms and accumulation."""
    from caliber_jax import host

    return dtype == "auto" and host.auto_bf16(device.startswith("cuda"))


class TorchEncoder:
    """A local model encoded through PyTorch: `encode(texts) -> [n, D]` unit float32 vectors.

    A sentence-transformers directory runs its own module pipeline (pooling, Dense, Normalize);
    a plain transformers directory runs `AutoModel` with `pooling` ("mean", "cls" or "last").

    Attributes:
      model_dir: the directory.
      pooling: the pooling used (read from a sentence-transformers directory).
      dim: D, the output width.
      device: torch device string.
    """

    def __init__(self, model_dir: str | Path, *, pooling: str, dtype: str, device: str = "auto"):
        import torch

        if dtype not in _DTYPES:
            raise ValueError(f"{model_dir}: dtype={dtype!r} not in {_DTYPES}")
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise FileNotFoundError(f"{model_dir}: teacher model directory not found")
        self.device = resolve_device(device)
        self.autocast = autocast_bf16(dtype, self.device)
        self._torch_dtype = torch.float32 if dtype == "auto" else getattr(torch, dtype)
        self.is_sentence_transformers = is_sentence_transformers_dir(self.model_dir)
        if self.is_sentence_transformers:
            from sentence_transformers import SentenceTransformer

            check_st_modules(self.model_dir)
            found = read_st_pooling(self.model_dir)
            if pooling and pooling != found:
                raise ValueError(
                    f"{self.model_dir}: its Pooling module uses {found!r}, config asks {pooling!r}"
                )
            self.pooling = found
            self._model = SentenceTransformer(str(self.model_dir), device=self.device)
            self._model.to(self._torch_dtype)
            # sentence-transformers >= 6 renamed get_sentence_embedding_dimension.
            dimension = getattr(self._model, "get_embedding_dimension", None)
            dimension = dimension or self._model.get_sentence_embedding_dimension
            self.dim = int(dimension())
            self._tokenizer = None
        else:
            from transformers import AutoModel, AutoTokenizer

            if pooling not in ("mean", "cls", "last"):
                raise ValueError(f"{self.model_dir}: pooling={pooling!r} not in mean/cls/last")
            self.pooling = pooling
            check_tokenizer_files(self.model_dir)
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
            self._model = AutoModel.from_pretrained(
                str(self.model_dir), torch_dtype=self._torch_dtype
            )
            self._model.to(self.device).eval()
            self.dim = int(self._model.config.hidden_size)
        self.positions = position_limit(self._model)
        # Read once: `_encode` sets a sentence-transformers model's max_seq_length per call.
        self._own_max_length = self._read_own_max_length()

    def _read_own_max_length(self) -> int:
        # Capped at the position table: a tokenizer without a recorded limit says 1e30, and
        # sentence-transformers caps at max_position_embeddings, 2 past what MPNet's table holds.
        if self.is_sentence_transformers:
            own = self._model.max_seq_length
        else:
            own = self._tokenizer.model_max_length
        return int(min(n for n in (own, self.positions) if n))

    def model_max_length(self) -> int:
        """The longest input the model takes (position embeddings / its own limit)."""
        return self._own_max_length

    def resolve_max_length(self, max_length: int | None) -> int:
        """`max_length` checked against the position table (`check_max_length`); None or 0 = the
        model's own limit."""
        return check_max_length(max_length, model_dir=self.model_dir,
                                own=self.model_max_length(), positions=self.positions)  # fmt: skip

    def token_lengths(self, texts: Sequence[str], max_length: int | None) -> np.ndarray:
        """[n] tokens of each text with special tokens, cut at `max_length` (None = the model's
        own limit): what one row of `encode` holds before padding."""
        tokenizer = self._model.tokenizer if self.is_sentence_transformers else self._tokenizer
        limit = self.resolve_max_length(max_length)
        ids = tokenizer(list(texts), truncation=True, max_length=limit)["input_ids"]
        return np.asarray([len(row) for row in ids], np.int64)

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int,
        max_length: int | None,
        tokens_per_batch: int = 0,
    ) -> np.ndarray:
        """Encodes `texts` in batches.

        Args:
          texts: n strings.
          batch_size: texts per forward pass (with `tokens_per_batch` 0).
          max_length: token limit (special tokens included); None = the model's own.
          tokens_per_batch: > 0: length-sorted batches of as many texts as fill this many token
            slots at their length rung (`padding.batch_plan`, the Flax encoder's rule), so short
            passages come many to a forward pass.

        Returns:
          [n, D] float32, L2-normalised rows.
        """
        import torch

        limit = self.resolve_max_length(max_length)
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        device_type = self.device.split(":")[0]
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.autocast):
            if not tokens_per_batch:
                return self._encode(texts, batch_size=batch_size, limit=limit)
            plan = padding.batch_plan(
                self.token_lengths(texts, limit), batch_size=batch_size, max_length=limit,
                tokens_per_batch=tokens_per_batch,
            )  # fmt: skip
            out = np.zeros((len(texts), self.dim), np.float32)
            for rows, _, _ in plan:
                batch = [texts[row] for row in rows]
                out[rows] = self._encode(batch, batch_size=len(batch), limit=limit)
            return out

    def _encode(self, texts: list[str], *, batch_size: int, limit: int) -> np.ndarray:
        import torch

        if self.is_sentence_transformers:
            self._model.max_seq_length = limit
            vectors = self._model.encode(
                texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                show_progress_bar=False,
            )  # fmt: skip
            return np.asarray(vectors, np.float32)
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch_size):
                batch = self._tokenizer(
                    texts[start : start + batch_size], padding=True, truncation=True,
                    max_length=limit, return_tensors="pt",
                ).to(self.device)  # fmt: skip
                hidden_btd = self._model(**batch).last_hidden_state.float()
                out.append(pool(hidden_btd, batch["attention_mask"], self.pooling))
        vectors = torch.cat(out).cpu().numpy()
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def encode_fn(self, *, batch_size: int, max_length: int | None, tokens_per_batch: int = 0):
        """`texts -> [n, D]` with these settings (the evaluation interface); a bad `max_length`
        fails here, before any text is encoded."""
        self.resolve_max_length(max_length)
        return lambda texts: self.encode(texts, batch_size=batch_size, max_length=max_length,
                                         tokens_per_batch=tokens_per_batch)  # fmt: skip


def pool(hidden_btd, mask_bt, pooling: str):
    """Pools token states: mean over real tokens, the first real token, or the last real token,
    wherever the tokenizer pads (Qwen3-Embedding's tokenizer pads on the left).

    Args:
      hidden_btd: [B, T, D] float32 torch tensor.
      mask_bt: [B, T] attention mask (1 = token).
      pooling: "mean", "cls" or "last".

    Returns:
      [B, D] torch tensor.
    """
    import torch

    mask = mask_bt.to(hidden_btd.dtype)
    rows = torch.arange(hidden_btd.shape[0])
    if pooling == "mean":
        return (hidden_btd * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
    real = mask_bt.long()
    if pooling == "cls":
        return hidden_btd[rows, real.argmax(1)]  # the first 1 of each row
    if pooling == "last":
        last = real.shape[1] - 1 - real.flip(1).argmax(1)  # the last 1 of each row
        return hidden_btd[rows, last]
    raise ValueError(f"pooling={pooling!r} not in mean/cls/last")
