"""Compile time vs depth: the encoder's layers unrolled vs run as one `lax.scan`.

    python benchmarks/compile_depth.py                    # all-MiniLM-L6-v2 cut to 3 and 6 layers
    python benchmarks/compile_depth.py --layers 2,4,6 --length 256

For each depth and each `scan_layers` setting it builds the library's model
(`embedding.split_model(..., scan_layers=...)`), jits forward + backward of a pooled-vector loss
on one batch and prints the seconds spent tracing, lowering, compiling (XLA) and per step (mean of
`--repeats` after one warm-up). No persistent compilation cache is used.
"""

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from caliber_jax.models import embedding  # noqa: E402


def measure(model_dir: str, *, layers: int, scan: bool, batch: int, length: int, repeats: int):
    spec = embedding.read_spec(model_dir, num_layers=layers)
    flat = embedding.load_flat_params(model_dir, spec, seed=0)
    graphdef, state = embedding.split_model(spec, flat, dtype=jnp.float32, scan_layers=scan)
    params = nnx.to_pure_dict(state)

    def loss(p, ids, mask):
        return jnp.sum(nnx.merge(graphdef, p)(ids, mask) ** 2)

    step = jax.jit(jax.value_and_grad(loss))
    ids = jnp.ones((batch, length), jnp.int32)
    mask = jnp.ones((batch, length), jnp.int32)
    t0 = time.perf_counter()
    traced = step.trace(params, ids, mask)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    jax.block_until_ready(compiled(params, ids, mask))
    t4 = time.perf_counter()
    for _ in range(repeats):
        out = compiled(params, ids, mask)
    jax.block_until_ready(out)
    t5 = time.perf_counter()
    return dict(trace=t1 - t0, lower=t2 - t1, compile=t3 - t2, step=(t5 - t4) / repeats)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=None, help="default: all-MiniLM-L6-v2 from PyPI")
    parser.add_argument("--layers", default="3,6")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    model_dir = args.model_dir or str(common.minilm_dir())
    print(f"cpu_flags={common.cpu_description()} devices={jax.devices()}")
    for layers in map(int, args.layers.split(",")):
        for scan in (False, True):
            t = measure(model_dir, layers=layers, scan=scan, batch=args.batch,
                        length=args.length, repeats=args.repeats)  # fmt: skip
            print(f"layers={layers} scan_layers={scan} " +
                  " ".join(f"{k}_s={v:.2f}" for k, v in t.items()), flush=True)  # fmt: skip


if __name__ == "__main__":
    common.run_main(main)
