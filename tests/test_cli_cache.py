"""cli.enable_compilation_cache: every program cached, the GPU autotuner's results beside them."""

import jax
import pytest

from caliber_jax import cli

KEYS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
    "jax_persistent_cache_enable_xla_caches",
)


@pytest.fixture
def restore_jax_config():
    before = {key: getattr(jax.config, key) for key in KEYS}
    yield
    for key, value in before.items():
        jax.config.update(key, value)


def test_cache_dir_also_holds_the_autotune_cache(tmp_path, restore_jax_config):
    jax.config.update("jax_persistent_cache_enable_xla_caches", "")
    cli.enable_compilation_cache(str(tmp_path))
    assert jax.config.jax_compilation_cache_dir == str(tmp_path)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == 0
    assert jax.config.jax_persistent_cache_enable_xla_caches == (
        "xla_gpu_per_fusion_autotune_cache_dir"
    )


def test_none_leaves_the_cache_off(restore_jax_config):
    jax.config.update("jax_compilation_cache_dir", None)
    cli.enable_compilation_cache("none")
    assert jax.config.jax_compilation_cache_dir is None
