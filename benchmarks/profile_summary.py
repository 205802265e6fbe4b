"""Where a step's device time goes, from the Perfetto trace `jax.profiler.trace` writes.

    python benchmarks/profile_summary.py DIR [--steps N]   # DIR as given to jax.profiler.trace

The trace (`create_perfetto_trace=True`: plugins/profile/*/perfetto_trace.json.gz, plain JSON)
holds one complete event ("ph": "X") per kernel on each GPU stream, per XLA op on the CPU's
threads, and the host's own spans. The summary reads the device's op events: on a GPU the
threads of the "/device:*" processes named "Stream ..." (kernels; the derived "XLA Ops" /
"XLA Modules" lines would count the same time twice), or all of a device process's threads
if none is so named; with no device process (XLA:CPU), the host events that name an `hlo_op`.

  busy_frac: the union of the op events' intervals over the window from the first op's start to
    the last one's end: what is left is the device waiting (launches, host work, syncs).
  busy_ms_per_step, category_ms_per_step: the same in milliseconds per step (kernels that overlap
    on two streams count twice in the categories).
  category_frac: op time by kind of kernel, from its name: "gemm" (cuBLAS / CUTLASS / XLA dots),
    "attention" (cuDNN / flash attention), "collective", "memcpy", "other" (XLA's fusions:
    elementwise, reductions, norms).
  top: the ops with the most time (name, share, calls per step).
"""

import argparse
import collections
import gzip
import json
import re
import sys
from pathlib import Path

CATEGORIES = (  # first match wins; names are lower-cased
    ("attention", re.compile(r"sdpa|fmha|flash|attention|cudnn")),
    (
        "gemm",
        re.compile(r"gemm|cublas|nvjet|cutlass|xmma|wgmma|matmul|\bdot\b|dot\.|dot_|triton_gemm"),
    ),
    ("collective", re.compile(r"nccl|all-reduce|all_reduce|allreduce|all-gather|reduce-scatter")),
    ("memcpy", re.compile(r"memcpy|memset")),
)


def read_trace(directory: str | Path) -> dict:
    """The newest plugins/profile/*/perfetto_trace.json.gz under `directory`, parsed."""
    traces = sorted(Path(directory).glob("plugins/profile/*/perfetto_trace.json.gz"))
    if not traces:
        raise FileNotFoundError(f"{directory}: no plugins/profile/*/perfetto_trace.json.gz")
    with gzip.open(traces[-1], "rt") as f:
        return json.load(f)


def category(name: str) -> str:
    lowered = name.lower()
    for label, pattern in CATEGORIES:
        if pattern.search(lowered):
            return label
    return "other"


def op_events(trace: dict) -> tuple[list[dict], list[str]]:
    """(the device's op events, the names of the threads they came from)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    meta = [e for e in events if e.get("ph") == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    complete = [e for e in events if e.get("ph") == "X" and not e["name"].startswith("end: ")]
    device = {pid for pid, name in processes.items() if name.startswith("/device:")}
    if device:
        streams = {
            key for key, name in threads.items() if key[0] in device and name.startswith("Stream")
        }
        keep = streams or {key for key in threads if key[0] in device}
        chosen = [e for e in complete if (e["pid"], e.get("tid")) in keep]
    else:
        chosen = [e for e in complete if "hlo_op" in (e.get("args") or {})]
        keep = {(e["pid"], e.get("tid")) for e in chosen}
    return chosen, sorted({threads.get(key, str(key)) for key in keep})


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def summarize(trace: dict, *, steps: int, top: int = 12) -> dict:
    """The summary of a trace of `steps` steps (see the module docstring); times in ms."""
    events, threads = op_events(trace)
    if not events:
        return {"threads": threads, "op_events": 0}
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events]
    window = max(end for _, end in intervals) - min(start for start, _ in intervals)
    op_time = sum(end - start for start, end in intervals)
    by_category: dict[str, float] = collections.Counter()
    by_name: dict[str, list] = {}
    for event, (start, end) in zip(events, intervals, strict=True):
        name = event["name"]
        args = event.get("args") or {}
        by_category[category(f"{name} {args.get('hlo_op', '')}")] += end - start
        entry = by_name.setdefault(name, [0.0, 0])
        entry[0] += end - start
        entry[1] += 1
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])[:top]
    busy = busy_time(intervals)
    share = 1.0 / op_time if op_time else 0.0  # zero-length events only: no shares
    return {
        "threads": threads,
        "op_events": len(events),
        "ops_per_step": len(events) / steps,
        "window_ms_per_step": window / 1e3 / steps,
        "busy_frac": busy / window if window else 0.0,
        "busy_ms_per_step": busy / 1e3 / steps,
        "category_frac": {k: v * share for k, v in sorted(by_category.items())},
        "category_ms_per_step": {k: v / 1e3 / steps for k, v in sorted(by_category.items())},
        "top": [
            {"name": name[:160], "frac": t * share, "per_step": n / steps}
            for name, (t, n) in ranked
        ],
    }


def key_values(summary: dict) -> list[str]:
    """`profile_*=value` lines for the benchmarks' key=value output."""
    lines = [f"profile_op_events={summary['op_events']}"]
    if summary["op_events"]:
        lines += [
            f"profile_busy_frac={summary['busy_frac']:.4f}",
            f"profile_ops_per_step={summary['ops_per_step']:.1f}",
            f"profile_window_ms_per_step={summary['window_ms_per_step']:.3f}",
            f"profile_busy_ms_per_step={summary['busy_ms_per_step']:.3f}",
        ]
        lines += [f"profile_{k}_frac={v:.4f}" for k, v in summary["category_frac"].items()]
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the directory given to jax.profiler.trace")
    parser.add_argument("--steps", type=int, default=1, help="steps the trace holds")
    args = parser.parse_args(argv)
    summary = summarize(read_trace(args.directory), steps=args.steps)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
