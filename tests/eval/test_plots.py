"""Tests for caliber_jax/eval/plots.py: PNGs written for a toy set of results files."""

import json
import struct

import pytest

from caliber_jax.eval import plots


def _retrieval(ndcg):
    return {f"{m}_at_{k}": ndcg for m in ("ndcg", "recall", "mrr", "map") for k in (10, 100)}


def _results(label, shift):
    return {
        "financebench": _retrieval(0.40 + shift),
        "numgap": {
            "overall": {"D": 0.03 + shift, "M": -0.10 + shift, "n": 1300},
            "magnitude": {"D": 0.01 + shift, "M": -0.12 + shift, "n": 500},
            "polarity": {"D": 0.04 + shift, "M": -0.08, "n": 500},
            "unit": {"D": 0.06, "M": -0.09 + shift, "n": 300},
        },
        "mrl": {
            "dim_1024": _retrieval(0.45 + shift),
            "dim_512": _retrieval(0.43 + shift),
            "dim_256": _retrieval(0.40 + shift),
            "int8": _retrieval(0.44 + shift),
            "binary": _retrieval(0.38 + shift),
        },
        "model": f"runs/{label}",
        "label": label,
    }


def _png_size(path):
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


def test_plot_all_writes_every_figure(tmp_path):
    runs = {label: _results(label, 0.01 * i) for i, label in enumerate(["initial", "leaf", "cal"])}
    written = plots.plot_all(runs, tmp_path / "figures")
    names = {"retrieval_ndcg", "numgap_d", "numgap_m", "numgap_trajectory", "mrl"}
    assert {p.name for p in written} == {f"{name}.png" for name in names}
    for path in written:
        width, height = _png_size(path)
        assert width > 300 and height > 300, path
        assert path.stat().st_size > 10_000, path


def test_validation_curves_of_trained_models(tmp_path):
    runs = {label: _results(label, 0.01 * i) for i, label in enumerate(["initial", "leaf", "cal"])}
    for shift, label in enumerate(["leaf", "cal"]):
        runs[label]["validation"] = [
            {"step": step, "val/align_x": 0.9 - 0.001 * step, "val/delta_s": 0.001 * (1 + shift),
             "val/delta_t": 0.007}
            for step in (250, 0, 500)
        ]  # fmt: skip
    written = plots.plot_all(runs, tmp_path)
    assert written[-1].name == "validation.png"
    width, height = _png_size(written[-1])
    assert width > 1000 and height > 300 and written[-1].stat().st_size > 10_000


def test_plot_all_only_tasks_present(tmp_path):
    runs = {"bm25": {"financebench": _retrieval(0.38), "label": "bm25"}}
    written = plots.plot_all(runs, tmp_path)
    assert [p.name for p in written] == ["retrieval_ndcg.png"]
    with pytest.raises(ValueError, match="at least one"):
        plots.plot_all({}, tmp_path)


def test_load_results_labels(tmp_path):
    paths = []
    for name, label in (("a", "first"), ("b", None), ("c", "first")):
        results = _results(label or name, 0.0)
        if label is None:
            del results["label"]
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(results))
    assert list(plots.load_results(paths[:2])) == ["first", "b"]
    with pytest.raises(ValueError, match="'first' is already used"):
        plots.load_results(paths)
