"""What a warm start's ``built_with`` record says about the CPU (agentjax/train/warmstart.py, "Reproducibility": the
CPU type changes a build, so the record names it): the model name and the AVX-512 flag read from a cpuinfo file, and
``None`` where the file is missing or silent."""

from __future__ import annotations

from agentjax.train import warmstart

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512dq
bogomips\t: 4000.00

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
"""


def test_cpu_info_reads_the_model_and_the_avx512_flag(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(XEON)
    assert warmstart.cpu_info(str(path)) == {"cpu_model": "Intel(R) Xeon(R) Processor", "avx512": True}
    path.write_text(XEON.replace(" avx512f avx512dq", ""))
    assert warmstart.cpu_info(str(path))["avx512"] is False  # avx2 only
    path.write_text(XEON.replace("avx512f ", ""))
    assert warmstart.cpu_info(str(path))["avx512"] is False  # avx512dq without the foundation flag does not count


def test_cpu_info_is_none_where_nothing_is_known(tmp_path):
    assert warmstart.cpu_info(str(tmp_path / "missing")) == {"cpu_model": None, "avx512": None}
    (tmp_path / "empty").write_text("")
    assert warmstart.cpu_info(str(tmp_path / "empty")) == {"cpu_model": None, "avx512": None}


def test_build_info_names_this_cpu():
    info = warmstart.build_info()
    assert {"jax", "jaxlib", "numpy", "cpu_count", "cpu_model", "avx512", "git_revision"} <= info.keys()
    assert info["cpu_count"] >= 1
