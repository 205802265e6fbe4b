"""Two processes: `embed_teacher --import_x/--import_px` writes disjoint rows equal to a 1-process
import, and training from those vectors fits the least-squares W_out once, on process 0, while
every process starts from the same W_out (the file it saved)."""

import re

import numpy as np
import pytest

from caliber_jax import w_out_init
from caliber_jax.data import pipeline, teacher
from tests.conftest import IN_PROCESS_OPT_LEVEL
from tests.multiprocess.conftest import EMBED, launch, module, train_command

pytestmark = pytest.mark.multiprocess
DIM = ["--config.model.out_dim=128"]  # a new W_out (384 -> 128): what the lstsq fit is for


def test_import_rows_by_process_then_one_w_out_fit_shared(data_dir, tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    for path in data_dir.iterdir():  # the passages only; no val split, no teacher stores
        if path.is_file() and not path.name.startswith("val"):
            (out / path.name).write_bytes(path.read_bytes())
    texts, perturbed = pipeline.load_passages(out / "train.jsonl")
    everything = np.arange(len(texts))
    vectors = {}
    for name, rows in (("x", texts), ("px", perturbed)):
        stored = teacher.open_reader(data_dir / "teacher_train" / name, expect_rows=len(rows),
                                     expect_dim=384)  # fmt: skip
        vectors[name] = stored[everything]
        np.save(tmp_path / f"{name}.npy", vectors[name])
    run = launch(2, *module("caliber_jax.embed_teacher", f"--config.data.dir={out}", *EMBED, *DIM,
                            "--splits=train", f"--import_x={tmp_path / 'x.npy'}",
                            f"--import_px={tmp_path / 'px.npy'}"),
                 log=tmp_path / "import.log")  # fmt: skip
    run.check()
    for name, rows in (("x", texts), ("px", perturbed)):
        store = out / "teacher_train" / name
        # Each process wrote its own chunk-aligned block: [0, 32) and [32, 64) of 64 rows.
        # Not up to a newline: the two processes' lines may interleave in the shared log.
        owned = re.findall(rf"process (\d)/2: rows \[(\d+), (\d+)\) of {re.escape(str(store))}"
                           r"(?![\w.])", run.output())  # fmt: skip
        assert sorted(owned) == [("0", "0", "32"), ("1", "32", str(len(rows)))], run.tail()
        single = tmp_path / "single" / name
        metadata = {"teacher": "external", "pooling": "external"}
        teacher.import_npy(single, vectors_npy=tmp_path / f"{name}.npy", texts=rows, dim=128,
                           chunk_rows=16, metadata=metadata)  # fmt: skip
        want = teacher.open_reader(single, expect_rows=len(rows), expect_dim=128)[everything]
        got = teacher.open_reader(store, expect_rows=len(rows), expect_dim=128,
                                  expect_hash=teacher.text_hash(rows))[everything]  # fmt: skip
        np.testing.assert_array_equal(got, want)

    workdir = tmp_path / "run"
    # The tests' LLVM level: the fit and the W_out every process starts from are checked here,
    # not the steps' code.
    run = launch(2, *train_command(out, workdir, *DIM, "--config.model.w_out_init=lstsq",
                                   "--config.total_steps=2"),
                 log=tmp_path / "train.log", opt_level=IN_PROCESS_OPT_LEVEL)  # fmt: skip
    run.check()
    output = run.output()
    assert output.count("W_out fitted by least squares") == 1, run.tail()
    starts = re.findall(r"process (\d)/2: W_out starts from \S+ \((\w+)\)", output)
    saved = w_out_init.digest(w_out_init.load(workdir / w_out_init.FILE))
    assert sorted(starts) == [("0", saved), ("1", saved)], run.tail()
