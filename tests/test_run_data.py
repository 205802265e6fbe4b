"""run_data: what exists is decided once, by process 0, for every process."""

import jax
import numpy as np
import pytest
from etils import epath

from caliber_jax import run_data


def _as_process(monkeypatch, count: int, process_0_sees: bool):
    """This process as one of `count`, with broadcast_one_to_all answering process 0's value."""
    calls = []

    def broadcast(value):
        calls.append(np.asarray(value).item())
        return np.asarray(process_0_sees)

    monkeypatch.setattr(jax, "process_count", lambda: count)
    monkeypatch.setattr(run_data.multihost_utils, "broadcast_one_to_all", broadcast)
    return calls


@pytest.mark.parametrize("process_0_sees", [True, False])
def test_a_process_takes_process_0s_view_of_the_perturbed_store(tmp_path, monkeypatch,
                                                                 process_0_sees):  # fmt: skip
    # This (non-zero) process has teacher_train/px; process 0 may not (per-host data copies).
    (tmp_path / "teacher_train" / "px").mkdir(parents=True)
    calls = _as_process(monkeypatch, 2, process_0_sees)
    _, _, px = run_data.data_paths(str(tmp_path), "train")
    assert (px is not None) == process_0_sees
    assert calls == [True]  # it offered its own view to the broadcast, which process 0 decides


def test_a_process_takes_process_0s_view_of_the_validation_split(tmp_path, monkeypatch):
    calls = _as_process(monkeypatch, 2, process_0_sees=True)
    assert run_data.exists_for_all(epath.Path(tmp_path) / "val.jsonl")  # missing here
    assert calls == [False]


def test_one_process_decides_alone_without_a_collective(tmp_path, monkeypatch):
    monkeypatch.setattr(run_data.multihost_utils, "broadcast_one_to_all",
                        lambda value: pytest.fail("a collective with one process"))  # fmt: skip
    (tmp_path / "teacher_val" / "px").mkdir(parents=True)
    assert run_data.data_paths(str(tmp_path), "val")[2] is not None
    assert run_data.data_paths(str(tmp_path), "train")[2] is None
