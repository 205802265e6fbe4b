"""tests/conftest.py's XLA setup: what the tests' own process runs under, what launches inherit."""

import os
import re

import jax

from tests import conftest


def test_opt_level_is_added_once_and_a_given_level_wins():
    assert conftest.with_opt_level(None, 0) == "--xla_backend_optimization_level=0"
    assert conftest.with_opt_level("--a=1", 0) == "--a=1 --xla_backend_optimization_level=0"
    given = "--xla_cpu_max_isa=AVX2 --xla_backend_optimization_level=2"
    assert conftest.with_opt_level(given, 0) == given


def test_the_tests_process_has_eight_devices_and_launches_inherit_the_outside_flags():
    given = re.search(r"xla_force_host_platform_device_count=(\d+)", conftest._outside or "")
    assert len(jax.devices()) == (int(given.group(1)) if given else 8)  # a count given outside wins
    # Neither the device count nor the tests' own optimisation level is left in the environment
    # the launched entry points inherit: they run with the caller's flags, as users do.
    assert os.environ.get("XLA_FLAGS") == conftest._outside


def test_machine_line_names_the_cpu_and_the_limits_given_outside(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2\n\n"
        "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2\n"
    )
    held = {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "HOME": "/x"}
    line = conftest.machine_line(held, cpuinfo)
    assert line.startswith("machine: AMD EPYC 7B13, ")
    assert "flags: avx avx2 fma (no avx512)" in line
    assert line.endswith("limits given outside: XLA_FLAGS='--xla_cpu_max_isa=AVX2' "
                         "ONEDNN_MAX_CPU_ISA=AVX2")  # fmt: skip
    assert conftest.machine_line({}, cpuinfo).endswith("limits given outside: none")
