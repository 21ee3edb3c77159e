"""The test bed's environment: tcmalloc preloaded into vLLM's CPU workers where the system has
it, as vLLM does with the copy its wheels bundle."""

from __future__ import annotations

import os

import pytest

from vllm_ascend_cpp.testing import cpu_env


@pytest.fixture
def clean_env(monkeypatch):
    for k in [*cpu_env.CPU_ENV, "LD_PRELOAD", cpu_env.MALLOC_ENV]:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_tcmalloc_goes_first_in_ld_preload_once(clean_env, tmp_path):
    lib = tmp_path / "lib" / "libtcmalloc_minimal.so.4"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    clean_env.setattr(cpu_env, "TCMALLOC_GLOBS", (str(tmp_path / "*" / lib.name),))
    clean_env.setenv("LD_PRELOAD", "/opt/libgomp.so.1")
    cpu_env.set_cpu_env()
    assert os.environ["LD_PRELOAD"] == f"{lib}:/opt/libgomp.so.1"
    cpu_env.set_cpu_env()  # a second call (several engines in one process) adds nothing
    assert os.environ["LD_PRELOAD"] == f"{lib}:/opt/libgomp.so.1"
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"


def test_an_operator_tcmalloc_or_none_is_left_alone(clean_env, tmp_path):
    clean_env.setattr(cpu_env, "TCMALLOC_GLOBS", (str(tmp_path / "missing.so"),))
    cpu_env.set_cpu_env()
    assert "LD_PRELOAD" not in os.environ
    # glibc then keeps freed memory instead of mapping large blocks afresh.
    assert os.environ["MALLOC_MMAP_MAX_"] == "0"
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    clean_env.setattr(cpu_env, "TCMALLOC_GLOBS", (str(lib),))
    clean_env.setenv("LD_PRELOAD", "/usr/local/lib/libtcmalloc.so")
    cpu_env.set_cpu_env()
    assert os.environ["LD_PRELOAD"] == "/usr/local/lib/libtcmalloc.so"


def test_workers_can_be_kept_on_glibc_malloc(clean_env, tmp_path):
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.write_bytes(b"")
    clean_env.setattr(cpu_env, "TCMALLOC_GLOBS", (str(lib),))
    clean_env.setenv(cpu_env.MALLOC_ENV, "glibc")
    clean_env.setenv("LD_PRELOAD", "/opt/libgomp.so.1")
    cpu_env.set_cpu_env()
    assert os.environ["LD_PRELOAD"] == "/opt/libgomp.so.1"
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == str(1 << 40)
