"""NASH (Huang et al., NASH paper Sec. 3): numerically aware similarity on top of an Embedder.

S_NASH(s, s^) = alpha * S_text + (1 - alpha) * S_num (Eq. 3): S_text is the cosine of the
embeddings of the texts with every number masked to "[NUM]" (Eq. 1); S_num aligns numbers by
their contextual token embeddings and scores magnitudes (Eq. 2); alpha comes from the IDF mass of
words vs "[NUM]". Token embeddings are the encoder's last hidden states. Legend: T tokens, D width.

Choices the paper leaves open, fixed here:
- Extractor: integers, decimals, leading-dot decimals (".26") and comma-grouped numbers, not glued
  to a letter before them ("Q3", "FY2023") and followed by no letter but a suffix: "%" or
  k/m/b/bn/bp/bps ("15M", "50bps"). A "+", "-" or U+2212 right before a number, with no letter
  or digit before it, is its sign. The value is the numeral's, without the suffix (nu("15M") =
  15, as in Sec. 4.2.1); only sign and numeral are masked ("15%" -> "[NUM]%", the paper's example).
- A mention's vector h_v is the mean of the vectors of the tokens that overlap its numeral and
  suffix ("3.56%"): the suffix tells a rate from an amount, which the alignment is for, and with
  MiniLM's last layer the numeral tokens alone stay close to their identity (cos("3.56", "4") =
  0.38 in the paper's example, 0.63 with "%"). A mention cut off by truncation has no tokens,
  never aligns, and still counts in |V_s|.
- Eq. 2's direction score divides by |V_s|, the number of mentions summed over. The paper prints
  |V_s^| but justifies it by unmatched v in V_s counting as 0 (recall over V_s); |V_s^| would let
  S_num exceed 1 when the counts differ (3 numbers in s all aligning to the one in s^ give 3).
  Both agree whenever |V_s| = |V_s^|, as in every NumFinE and EmbedNum pair.
- Alignment is the per-mention argmax of Sec. 3.2.2 (two mentions may align to the same one), not
  the greedy one-to-one matching mentioned in App. E.
- IDF is scikit-learn's smoothed idf(w) = ln((1 + M) / (1 + df(w))) + 1 over M masked documents,
  on lower-cased word tokens plus "[NUM]" (footnote 6); an unseen word gets ln(1 + M) + 1. The +1
  keeps "[NUM]" weighted on corpora where every document has a number (plain ln(M / df) = 0).
- The threshold tau is mu + sigma of the cosine of randomly paired numbers from different
  texts, measured with the same encoder (Sec. 5.2.1, App. B), see `fit_threshold`.
"""

import dataclasses
import functools
import math
import random
import re
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from sklearn.feature_extraction.text import TfidfVectorizer

from caliber_jax import embedder as embedder_lib
from caliber_jax.data import padding

NUM_TOKEN = "[NUM]"
_NUMBER_RE = re.compile(
    r"(?:(?<![A-Za-z0-9])(?P<sign>[-+\u2212]))?"
    r"(?<![A-Za-z0-9.,])(?P<numeral>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?!\d|,\d)(?P<suffix>%|(?:bps|bp|bn|[kmb])(?![A-Za-z]))?(?![A-Za-z])",
    re.ASCII | re.IGNORECASE,
)
_IDF_TOKEN_RE = re.compile(r"\[NUM\]|[^\W_]+")


@dataclasses.dataclass(frozen=True)
class Mention:
    """A number in a text: sign and numeral at `[start, end)`, its suffix up to `suffix_end`."""

    start: int
    end: int
    suffix_end: int
    value: float


def extract_numbers(text: str) -> list[Mention]:
    """Numeric mentions of `text`, left to right (see the module docstring for the rules)."""
    mentions = []
    for match in _NUMBER_RE.finditer(text):
        value = float(match.group("numeral").replace(",", ""))
        if match.group("sign") in ("-", "\u2212"):
            value = -value
        mentions.append(Mention(match.start(), match.end("numeral"), match.end(), value))
    return mentions


def mask_numbers(text: str) -> str:
    """`text` with every mention replaced by "[NUM]" (Sec. 3.1): "grows 15%" -> "grows [NUM]%"."""
    pieces, last = [], 0
    for mention in extract_numbers(text):
        pieces += [text[last : mention.start], NUM_TOKEN]
        last = mention.end
    return "".join(pieces) + text[last:]


def idf_tokens(masked_text: str) -> list[str]:
    """IDF tokens of a masked text: "[NUM]" and lower-cased words (punctuation dropped)."""
    return [
        token if token == NUM_TOKEN else token.lower()
        for token in _IDF_TOKEN_RE.findall(masked_text)
    ]


@dataclasses.dataclass(frozen=True)
class Idf:
    """Token -> idf weight, fitted on `num_docs` masked documents (`fit_idf`)."""

    weights: dict[str, float]
    num_docs: int

    def weight(self, token: str) -> float:
        return self.weights.get(token, math.log(1 + self.num_docs) + 1.0)


def fit_idf(texts: Iterable[str]) -> Idf:
    """Smoothed IDF over the masked `texts`, each one document (footnote 6; see module doc)."""
    masked = [mask_numbers(text) for text in texts]
    if not masked:
        raise ValueError("fit_idf needs at least one text")
    vectorizer = TfidfVectorizer(
        tokenizer=idf_tokens, lowercase=False, token_pattern=None, smooth_idf=True, norm=None
    )
    vectorizer.fit(masked)
    vocabulary = vectorizer.vocabulary_
    return Idf({token: float(vectorizer.idf_[i]) for token, i in vocabulary.items()}, len(masked))


def alpha(idf: Idf, masked_a: str, masked_b: str) -> float:
    """alpha = W_text / (W_text + W_num) over the tokens of both masked texts (Sec. 3.3)."""
    w_text = w_num = 0.0
    for token in idf_tokens(masked_a) + idf_tokens(masked_b):
        if token == NUM_TOKEN:
            w_num += idf.weight(token)
        else:
            w_text += idf.weight(token)
    total = w_text + w_num
    return 1.0 if total == 0 else w_text / total


@functools.lru_cache(maxsize=8)
def _hidden_fn(graphdef: nnx.GraphDef):
    """Jitted `(params, ids [B, T], mask [B, T]) -> hidden [B, T, D]` float32, one per model."""

    def hidden(params, input_ids_bt, attention_mask_bt):
        model = nnx.merge(graphdef, params)
        return model.encoder(input_ids_bt, attention_mask_bt).astype(jnp.float32)

    return jax.jit(hidden)


def token_embeddings(
    embedder: embedder_lib.Embedder, texts: Sequence[str], *, batch_size: int = 32
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Contextual token vectors of each text from the encoder's last hidden states.

    Texts are tokenised with special tokens and truncated at `embedder.max_length`, batched by
    length and padded per batch to a bucket length (few jit shapes).

    Returns:
      For each text, `(offsets [T, 2] int32 character spans, vectors [T, D] float32)` for the
      real tokens (special tokens dropped), in token order.
    """
    if embedder.tokenizer is None:
        raise ValueError("token_embeddings needs an Embedder with a tokenizer")
    if isinstance(texts, str):
        raise TypeError("token_embeddings takes a sequence of texts, not one string")
    encoded = embedder.tokenizer(
        list(texts),
        add_special_tokens=True,
        truncation=True,
        max_length=embedder.max_length,
        padding=False,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    ids = encoded["input_ids"]
    hidden_fn = _hidden_fn(embedder.graphdef)
    out: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(ids)
    plan = padding.batch_plan(
        [len(seq) for seq in ids], batch_size=batch_size, max_length=embedder.max_length
    )
    for rows, padded_rows, length in plan:
        batch_ids, batch_mask = embedder_lib.pad_batch(
            [ids[r] for r in rows], rows=padded_rows, length=length, pad_id=embedder.pad_id
        )
        hidden_btd = np.asarray(hidden_fn(embedder.params, batch_ids, batch_mask))
        for slot, row in enumerate(rows):
            keep = np.asarray(encoded["special_tokens_mask"][row]) == 0
            offsets = np.asarray(encoded["offset_mapping"][row], np.int32).reshape(-1, 2)
            out[row] = (offsets[keep], hidden_btd[slot, : len(ids[row])][keep])
    return out


def mention_vectors(
    mentions: Sequence[Mention], offsets: np.ndarray, vectors: np.ndarray
) -> np.ndarray:
    """`[len(mentions), D]` mean vectors of the tokens overlapping each mention (NaN if none).

    The span includes the suffix ("3.56%"), so that the vector says what kind of number it is.
    """
    out = np.full((len(mentions), vectors.shape[1]), np.nan, np.float64)
    for index, mention in enumerate(mentions):
        overlap = (offsets[:, 0] < mention.suffix_end) & (offsets[:, 1] > mention.start)
        if overlap.any():
            out[index] = vectors[overlap].mean(axis=0)
    return out


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def directional_score(
    values_s: np.ndarray, values_t: np.ndarray, cosine_st: np.ndarray, threshold: float
) -> float:
    """S_num(s -> t) of Sec. 3.2.2 for `cosine_st [|V_s|, |V_t|]` (NaN = cannot align).

    Each v in V_s aligns to u* = argmax_u cos(h_v, h_u); the match counts when cos >= tau and
    adds (1 + d(v, u*) / N(v, u*))^-1 with d = |v - u*|, N = 1 + (|v| + |u*|) / 2 (footnote 4).
    The sum is divided by |V_s| (see the module docstring).
    """
    filled = np.where(np.isnan(cosine_st), -np.inf, cosine_st)
    best = np.argmax(filled, axis=1)
    best_cos = filled[np.arange(len(values_s)), best]
    matched = best_cos >= threshold
    u = values_t[best]
    terms = 1.0 / (1.0 + np.abs(values_s - u) / (1.0 + 0.5 * (np.abs(values_s) + np.abs(u))))
    return float(np.sum(terms[matched]) / len(values_s))


def numeric_similarity(
    values_a: np.ndarray,
    vectors_a: np.ndarray,
    values_b: np.ndarray,
    vectors_b: np.ndarray,
    threshold: float,
) -> float:
    """S_num(s, s^) of Eq. 2: the mean of both directional scores.

    Footnote 5: 1 when neither text has a number, 0 when only one has.

    Args:
      values_a, values_b: `[|V|]` mention values of each text.
      vectors_a, vectors_b: `[|V|, D]` mention vectors (NaN rows never align).
      threshold: the alignment threshold tau.
    """
    if len(values_a) == 0 and len(values_b) == 0:
        return 1.0
    if len(values_a) == 0 or len(values_b) == 0:
        return 0.0
    cosine = _unit_rows(vectors_a) @ _unit_rows(vectors_b).T
    forward = directional_score(values_a, values_b, cosine, threshold)
    backward = directional_score(values_b, values_a, cosine.T, threshold)
    return 0.5 * (forward + backward)


class NashScorer:
    """NASH similarity of text pairs for one Embedder, IDF table and threshold.

    `score` fits `score_fn(texts_a, texts_b) -> [n]` of `eval.numfine` and `eval.embednum`;
    `rerank` reorders retrieval candidates.
    """

    def __init__(
        self,
        embedder: embedder_lib.Embedder,
        *,
        idf: Idf,
        threshold: float,
        batch_size: int = 32,
    ):
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"threshold={threshold} is a cosine; expected it in [-1, 1]")
        self.embedder = embedder
        self.idf = idf
        self.threshold = threshold
        self.batch_size = batch_size

    def _numbers(self, texts: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """text -> (values [|V|], mention vectors [|V|, D]) for each distinct text."""
        mentions = {text: extract_numbers(text) for text in dict.fromkeys(texts)}
        with_numbers = [text for text, found in mentions.items() if found]
        tokens = (
            token_embeddings(self.embedder, with_numbers, batch_size=self.batch_size)
            if with_numbers
            else []
        )
        out = {}
        for text, found in mentions.items():
            values = np.array([m.value for m in found], np.float64)
            out[text] = (values, np.zeros((0, self.embedder.dim)))
        for text, (offsets, vectors) in zip(with_numbers, tokens, strict=True):
            out[text] = (out[text][0], mention_vectors(mentions[text], offsets, vectors))
        return out

    def components(self, texts_a: Sequence[str], texts_b: Sequence[str]) -> dict[str, np.ndarray]:
        """`[n]` arrays "text" (Eq. 1), "num" (Eq. 2), "alpha" (Sec. 3.3), "nash" (Eq. 3)."""
        if len(texts_a) != len(texts_b):
            raise ValueError(f"{len(texts_a)} texts_a but {len(texts_b)} texts_b")
        masked_a = [mask_numbers(text) for text in texts_a]
        masked_b = [mask_numbers(text) for text in texts_b]
        unique = list(dict.fromkeys(masked_a + masked_b))
        vectors = self.embedder.encode(unique, batch_size=self.batch_size).astype(np.float64)
        row = {text: index for index, text in enumerate(unique)}
        s_text = np.sum(
            vectors[[row[t] for t in masked_a]] * vectors[[row[t] for t in masked_b]], axis=1
        )
        numbers = self._numbers(list(texts_a) + list(texts_b))
        s_num = np.array(
            [
                numeric_similarity(*numbers[a], *numbers[b], self.threshold)
                for a, b in zip(texts_a, texts_b, strict=True)
            ]
        )
        weight = np.array([alpha(self.idf, a, b) for a, b in zip(masked_a, masked_b, strict=True)])
        return {
            "text": s_text,
            "num": s_num,
            "alpha": weight,
            "nash": weight * s_text + (1 - weight) * s_num,
        }

    def score(self, texts_a: Sequence[str], texts_b: Sequence[str]) -> np.ndarray:
        """S_NASH (Eq. 3) of each pair (texts_a[i], texts_b[i]): `[n]` float64."""
        return self.components(texts_a, texts_b)["nash"]

    __call__ = score

    def rerank(
        self,
        query: str,
        candidates: Sequence[str],
        base_scores: Sequence[float],
        top_k: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Takes the `top_k` candidates by `base_scores` and orders them by S_NASH(query, c).

        Returns:
          `(indices [K] into candidates, NASH scores [K])`, best first, K = min(top_k, n).
          Ties keep the base order.
        """
        base_scores = np.asarray(base_scores, np.float64)
        if base_scores.shape != (len(candidates),):
            raise ValueError(
                f"base_scores has shape {base_scores.shape} for {len(candidates)} candidates"
            )
        if top_k < 1:
            raise ValueError(f"top_k={top_k} must be positive")
        top = np.argsort(-base_scores, kind="stable")[:top_k]
        scores = self.score([query] * len(top), [candidates[i] for i in top])
        order = np.argsort(-scores, kind="stable")
        return top[order], scores[order]


def fit_threshold(
    embedder: embedder_lib.Embedder,
    texts: Sequence[str],
    *,
    seed: int,
    num_pairs: int,
    batch_size: int = 32,
) -> float:
    """tau = mu + sigma of cos(h_v, h_u) for numbers v, u of two different random texts.

    Each pair draws two distinct texts that have numbers, then one mention of each
    (Sec. 5.2.1 and App. B: the background similarity of randomly paired numbers).
    """
    mentions = {text: extract_numbers(text) for text in dict.fromkeys(texts)}
    numeric = [text for text, found in mentions.items() if found]
    if len(numeric) < 2:
        raise ValueError(f"fit_threshold needs >= 2 texts with numbers, got {len(numeric)}")
    tokens = token_embeddings(embedder, numeric, batch_size=batch_size)
    vectors = [
        _unit_rows(mention_vectors(mentions[text], *pair))
        for text, pair in zip(numeric, tokens, strict=True)
    ]
    rng = random.Random(seed)
    cosines = []
    for _ in range(num_pairs):
        first, second = rng.sample(range(len(numeric)), 2)
        a = vectors[first][rng.randrange(len(vectors[first]))]
        b = vectors[second][rng.randrange(len(vectors[second]))]
        if not (np.isnan(a).any() or np.isnan(b).any()):
            cosines.append(float(a @ b))
    if len(cosines) < 2:
        raise ValueError("fit_threshold: fewer than 2 pairs of numbers inside the encoded tokens")
    return float(np.mean(cosines) + np.std(cosines))


def make_scorer(
    embedder: embedder_lib.Embedder,
    *,
    idf_texts: Sequence[str],
    threshold_texts: Sequence[str],
    seed: int,
    num_pairs: int,
    batch_size: int = 32,
) -> NashScorer:
    """A NashScorer with IDF fitted on `idf_texts` and tau on `threshold_texts` (`fit_threshold`).

    The paper fits both on its benchmark sentences (footnote 6, Sec. 5.2.1).
    """
    threshold = fit_threshold(
        embedder, threshold_texts, seed=seed, num_pairs=num_pairs, batch_size=batch_size
    )
    return NashScorer(embedder, idf=fit_idf(idf_texts), threshold=threshold, batch_size=batch_size)
