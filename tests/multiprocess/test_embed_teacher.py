"""embed_teacher with 2 processes: disjoint chunk-aligned row ranges equal to a 1-process store."""

import json

import numpy as np
import pytest

from caliber_jax.data import pipeline, teacher
from tests.multiprocess.conftest import EMBED, launch, module

pytestmark = pytest.mark.multiprocess


def test_two_processes_write_disjoint_rows_equal_to_one_process(prepared_dir, data_dir, tmp_path):
    out = tmp_path / "data"
    out.mkdir()
    for path in prepared_dir.iterdir():
        if path.is_file():
            (out / path.name).write_bytes(path.read_bytes())
    run = launch(2, *module("caliber_jax.embed_teacher", f"--config.data.dir={out}", *EMBED),
                 log=tmp_path / "embed.log")  # fmt: skip
    run.check()
    for split in ("train", "val"):
        texts, perturbed = pipeline.load_passages(out / f"{split}.jsonl")
        for name, rows in (("x", texts), ("px", perturbed)):
            store, single = out / f"teacher_{split}" / name, data_dir / f"teacher_{split}" / name
            meta = json.loads((store / "metadata.json").read_text())
            ranges = [teacher.process_rows(meta["num_rows"], meta["chunk_rows"], p, 2)
                      for p in range(2)]  # fmt: skip
            # Disjoint, chunk-aligned blocks covering every row (both non-empty for train's 64).
            assert ranges[0][0] == 0 and ranges[0][1] == ranges[1][0] < ranges[1][1] == len(rows)
            assert ranges[0][1] % meta["chunk_rows"] == 0
            assert split == "val" or ranges[0][1] > 0
            want = teacher.open_reader(single, expect_rows=len(rows), expect_dim=384)
            got = teacher.open_reader(store, expect_rows=len(rows), expect_dim=384,
                                      expect_hash=teacher.text_hash(rows))  # fmt: skip
            everything = np.arange(len(rows))
            np.testing.assert_allclose(got[everything], want[everything], atol=1e-5, rtol=0)
            assert not teacher.pending_ranges(store, 0, 1)
