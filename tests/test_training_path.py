"""caliber_jax/training_path.py: the path each platform and config takes (docs/training_path.md)."""

import math

import pytest

from caliber_jax import training_path
from configs import caliber, demo


def choose(config, *, platform="cpu", process_count=1, local_devices=2, **overrides):
    """`train.choose_path` for a config (tests never import train): its fields, by name."""
    settings = dict(
        pack_length=config.data.pack_length,
        pert_rows_multiple=config.data.pert_rows_multiple,
        grad_chunk_rows=config.grad_chunk_rows,
        grad_chunk_rows_on_accelerator=config.grad_chunk_rows_on_accelerator,
        split_update=config.split_update,
        compile_ahead=config.compile_ahead,
        scan_layers=config.model.scan_layers,
    )
    settings.update(overrides)
    return training_path.choose(
        platform=platform, process_count=process_count, local_devices=local_devices, **settings
    )


def test_demo_on_a_cpu_packs_and_chunks_without_compile_ahead():
    path = choose(demo.get_config(), local_devices=8)
    assert (path.layout, path.step_form) == ("packed", "chunked")
    assert path.chunk_rows == math.lcm(4, 8) == 8  # groups shared by the process's devices
    assert not path.compile_ahead and not path.scan_layers
    line = path.describe()
    assert "layout=packed" in line and "step=chunked (groups of 8 rows)" in line
    assert "grad_chunk_rows=4" in line


def test_cpu_runs_of_several_devices_run_collective_programs_in_order():
    assert choose(demo.get_config(), process_count=2).in_order
    assert choose(demo.get_config(), local_devices=4).in_order  # 1 x 4 deadlocked too
    assert choose(caliber.get_config(), process_count=2).in_order  # every step form on the CPU
    assert not choose(demo.get_config(), local_devices=1).in_order  # no collectives: async
    assert not choose(caliber.get_config(), platform="gpu", process_count=2).in_order


def test_caliber_on_an_accelerator_is_one_compact_program_compiled_ahead():
    path = choose(caliber.get_config(), platform="gpu")
    assert (path.layout, path.step_form, path.chunk_rows) == ("compact", "one_program", 0)
    assert path.compile_ahead and not path.in_order
    split = choose(caliber.get_config(), platform="tpu", split_update=True)
    assert split.step_form == "split_update" and split.compile_ahead


# ids without "gpu": conftest skips tests with that keyword where no GPU is present
@pytest.mark.parametrize("platform", ["gpu", "tpu"], ids=["cuda_platform", "tpu_platform"])
def test_chunked_gradients_are_refused_on_accelerators_unless_meant(platform):
    config = demo.get_config()  # packed rows, grad_chunk_rows = 4
    with pytest.raises(ValueError, match=f"grad_chunk_rows=4 on {platform}: .* saves no memory"):
        choose(config, platform=platform)
    meant = choose(config, platform=platform, grad_chunk_rows_on_accelerator=True)
    assert meant.step_form == "chunked"
    assert choose(config, platform=platform, grad_chunk_rows=0).step_form == "split_update"


def test_accelerator_configs_leave_chunks_off():
    config = caliber.get_config()
    assert config.grad_chunk_rows == 0 and not config.grad_chunk_rows_on_accelerator


def test_grad_chunk_rows_has_no_effect_on_padded_layouts():
    path = choose(demo.get_config(), pack_length=0, pert_rows_multiple=0)
    assert (path.layout, path.step_form) == ("stacked", "split_update")
    assert dict(path.reasons)["grad_chunk_rows"] == "4 ignored: no packed rows to group"
    # ...so a padded layout on a GPU with the demo's grad_chunk_rows is not refused either
    assert choose(demo.get_config(), platform="gpu", pack_length=0).layout == "compact"
