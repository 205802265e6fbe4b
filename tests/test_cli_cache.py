"""cli.enable_compilation_cache: every program cached, the GPU autotuner's results beside them
(only where a GPU plugin is installed), a cache read at any path otherwise."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

from caliber_jax import cli, hostmem

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


@pytest.mark.parametrize("gpu", [True, False])
def test_cache_dir_also_holds_the_autotune_cache_where_a_gpu_plugin_is(
    tmp_path, restore_jax_config, monkeypatch, gpu
):
    monkeypatch.setattr(cli, "gpu_plugin_installed", lambda: gpu)
    jax.config.update("jax_persistent_cache_enable_xla_caches", "")
    cli.enable_compilation_cache(str(tmp_path))
    assert jax.config.jax_compilation_cache_dir == str(tmp_path)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == 0
    assert jax.config.jax_persistent_cache_enable_xla_caches == (
        "xla_gpu_per_fusion_autotune_cache_dir" if gpu else "none"
    )


def test_no_gpu_plugin_in_the_cpu_install():
    assert not cli.gpu_plugin_installed()  # the CPU build of jaxlib this suite runs on


@pytest.mark.parametrize(
    "plugins, gpu",
    [(["xla_cuda12"], True), (["xla_rocm"], True), (["libtpu"], False), ([], False)],
)
def test_gpu_plugin_is_found_as_hostmem_finds_accelerators(monkeypatch, plugins, gpu):
    """One discovery of installed plugins (`hostmem.accelerator_plugins`: modules, entry points,
    libtpu); the compilation cache asks it whether one of them is a GPU's."""
    monkeypatch.setattr(hostmem, "accelerator_plugins", lambda: plugins)
    assert cli.gpu_plugin_installed() == gpu


COMPILE_TWO = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp
    from caliber_jax import cli, hostmem
    cli.enable_compilation_cache(sys.argv[1])
    stats = cli.COMPILE_STATS.start()
    jax.jit(lambda x: jnp.tanh(x) @ x.T)(jnp.ones((8, 8))).block_until_ready()
    jax.jit(lambda x: jnp.sin(x).sum(0))(jnp.ones((8, 8))).block_until_ready()
    print(stats.compiled, stats.cache_hits)
""")


def compiled_and_hits(cache: Path) -> tuple[int, int]:
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_TWO, str(cache)],
        capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    compiled, hits = map(int, result.stdout.split())
    return compiled, hits


def test_a_cache_copied_to_another_path_is_read_there(tmp_path):
    """With the GPU autotuner's directory set, JAX keys every program by the cache's path, and
    a copied cache missed every program (a 16-program training launch compiled all 16)."""
    first = compiled_and_hits(tmp_path / "a")
    assert first[0] >= 2 and first[1] == 0
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert compiled_and_hits(tmp_path / "b") == (0, first[0])


def test_none_leaves_the_cache_off(restore_jax_config):
    jax.config.update("jax_compilation_cache_dir", None)
    cli.enable_compilation_cache("none")
    assert jax.config.jax_compilation_cache_dir is None
