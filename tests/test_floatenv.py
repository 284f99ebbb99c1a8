"""What a run's floats depend on (bnlab/floatenv.py): recorded, compared, emulable."""

from __future__ import annotations

import torch

from bnlab import floatenv


def test_the_record_names_this_cpus_kernels_and_torchs_build():
    rec = floatenv.record()
    assert rec["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert rec["threads"] == torch.get_num_threads()
    assert rec["torch"]["version"] == torch.__version__ and rec["torch"]["git"]
    assert set(rec["cpu"]["flags"]) <= set(floatenv.FLAGS)
    assert floatenv.same_floats(rec, floatenv.record())


def test_kernel_env_keeps_only_the_variables_that_choose_kernels_or_threads():
    env = {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
           "HOME": "/root", "PATH": "/bin", "MKL_DEBUG_CPU_TYPE": "5"}
    assert list(floatenv.kernel_env(env)) == ["ATEN_CPU_CAPABILITY", "MKL_DEBUG_CPU_TYPE",
                                              "OMP_NUM_THREADS", "ONEDNN_MAX_CPU_ISA"]


def test_differences_name_what_changes_the_floats_and_not_what_does_not():
    a = floatenv.record()
    other = "AVX2" if a["cpu_capability"] == "AVX512" else "AVX512"
    b = {**a, "cpu_capability": other, "cpu": {**a["cpu"], "name": "another name"}}
    assert floatenv.differences(a, b) == ["cpu_capability"]  # the CPU's name alone is not decisive
    c = {**a, "threads": a["threads"] + 1, "kernel_env": {"ATEN_CPU_CAPABILITY": "avx2"}}
    assert floatenv.differences(a, c) == ["threads", "kernel_env"]
    assert floatenv.differences(None, a) == ["not recorded"] and not floatenv.same_floats(a, None)
    d = {**a, "cpu": {**a["cpu"], "vendor": "another vendor"}}  # same capability, other tuning
    assert floatenv.differences(a, d) == ["cpu_vendor"]


def test_a_run_is_reproducible_here_only_on_a_cpu_of_its_vendor():
    here = floatenv.record()
    assert floatenv.can_reproduce(here)
    assert not floatenv.can_reproduce({**here, "cpu": {**here["cpu"], "vendor": "another"}})
    assert not floatenv.can_reproduce(None)


def test_a_cpu_emulates_narrower_capabilities_only():
    assert floatenv.can_emulate("AVX2", "AVX512") and floatenv.can_emulate("AVX2", "AVX2")
    assert not floatenv.can_emulate("AVX512", "AVX2")
    assert not floatenv.can_emulate(None, "AVX2") and not floatenv.can_emulate("AVX2", "NEON")


def test_capabilities_of_a_run_follow_its_resumes_and_say_none_where_not_recorded():
    info = {"floats": {"cpu_capability": "AVX512"},
            "resumed": [{"from_step": 8}, {"from_step": 16, "floats": {"cpu_capability": "AVX2"}}]}
    assert floatenv.capabilities_of(info) == ["AVX512", None, "AVX2"]
    assert floatenv.capability_of({"commit": "abc"}) is None


def test_kernels_in_words_name_the_capability_and_the_vendor_at_start_and_each_resume():
    amd = {"cpu_capability": "AVX2", "cpu": {"vendor": "AuthenticAMD"}}
    info = {"floats": {"cpu_capability": "AVX512", "cpu": {"vendor": "GenuineIntel"}},
            "resumed": [{"from_step": 8}, {"from_step": 16, "floats": amd}]}
    assert floatenv.kernels_all(info) == ["AVX512 on Intel", None, "AVX2 on AMD"]
    assert floatenv.kernels_of({"cpu_capability": "AVX2"}) == "AVX2"  # no vendor recorded
