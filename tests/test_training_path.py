"""caliber_jax/training_path.py: the path each platform and config takes (docs/training_path.md)."""

import pytest

from caliber_jax import training_path
from configs import caliber, calibrate, demo, headline, leaf, numeric, study, study_mpnet


def choose(config, *, platform="cpu", process_count=1, local_devices=2, **overrides):
    """`train.choose_path` for a config (tests never import train): its fields, by name."""
    settings = dict(
        pack_length=config.data.pack_length,
        pack_rungs=config.data.pack_rungs,
        compile_ahead=config.compile_ahead,
        scan_layers=config.model.scan_layers,
    )
    settings.update(overrides)
    return training_path.choose(
        platform=platform, process_count=process_count, local_devices=local_devices, **settings
    )


CONFIGS = {
    "caliber": caliber.get_config,
    "leaf": leaf.get_config,
    "demo": demo.get_config,
    "study": study.get_config,
    "calibrate": calibrate.get_config,
    "numeric": numeric.get_config,
    "study_mpnet": study_mpnet.get_config,
    "headline": headline.get_config,
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_config_trains_packed_rows_in_at_most_three_row_counts(name):
    config = CONFIGS[name]()
    assert config.data.pack_length >= config.data.max_length
    assert config.data.pack_rungs == 3 and config.model.attention == "xla"
    assert not config.model.scan_layers
    for retired in ("split_update", "grad_chunk_rows", "grad_chunk_rows_on_accelerator"):
        assert retired not in config, retired
    line = choose(config).describe()
    assert "layout=packed, step=one_program" in line and "pack_rungs=3" in line


def test_demo_on_a_cpu_has_no_compile_ahead():
    path = choose(demo.get_config(), local_devices=1)
    assert not path.compile_ahead and not path.scan_layers and not path.in_order


def test_cpu_runs_of_several_devices_run_collective_programs_in_order():
    assert choose(demo.get_config(), process_count=2).in_order
    assert choose(demo.get_config(), local_devices=4).in_order  # 1 x 4 deadlocked too
    assert choose(caliber.get_config(), process_count=2).in_order
    assert not choose(demo.get_config(), local_devices=1).in_order  # no collectives: async
    assert not choose(caliber.get_config(), platform="gpu", process_count=2).in_order


def test_caliber_on_an_accelerator_compiles_ahead():
    path = choose(caliber.get_config(), platform="gpu")
    assert path.compile_ahead and not path.in_order


def test_padded_layouts_are_no_training_path():
    with pytest.raises(ValueError, match="pack_length=0: training runs on packed rows only"):
        choose(caliber.get_config(), pack_length=0)
