"""What a run's floats depend on beyond its config and commit: the instruction set the CPU
kernels use, the CPU itself, torch's build, the threads in use, the environment variables
that choose kernels and threads, and on CUDA the device, driver and cuDNN.

Two runs of the same config, seed and commit log the same numbers to the bit only where
`same_floats` holds for their records (an AVX2 and an AVX-512 machine round differently;
so do 1 and 2 threads)."""

from __future__ import annotations

import contextlib
import os
import platform
import re
from pathlib import Path

import torch

# CPU flags that change which kernels run (or whether bf16/AMX paths exist).
FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
         "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")
# Environment variables that choose kernels or thread counts.
ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "ATEN_", "ONEDNN_", "DNNL_", "GOMP_", "OPENBLAS_",
                "CUBLAS_", "CUDNN_", "NVIDIA_TF32", "TORCH_ALLOW_TF32", "CUDA_VISIBLE_DEVICES")
# The keys of a record that must agree for two runs to compute the same floats (cpu_vendor:
# the record's cpu.vendor; kernels tune themselves to the CPU beyond its instruction set).
DECISIVE = ("cpu_capability", "cpu_vendor", "threads", "torch", "kernel_env", "cuda")
# What a caller sets to run on a narrower instruction set than this CPU's (emulation).
EMULATE = {"AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
           "DEFAULT": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}}
# Capabilities from widest to narrowest; a CPU can emulate any after its own.
ORDER = ("AVX512", "AVX2", "DEFAULT")


def cpu() -> dict:
    """The CPU's vendor, family, model, name and the FLAGS it has (from /proc/cpuinfo where
    there is one, else platform's words)."""
    out = {"vendor": None, "family": None, "model": None, "name": platform.processor() or None,
           "arch": platform.machine(), "flags": []}
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model",
            "model name": "name", "flags": "flags", "Features": "flags"}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return out
    for line in text.split("\n\n")[0].splitlines():  # the first processor
        key, _, value = line.partition(":")
        key = key.strip()
        if key in keys:
            value = value.strip()
            out[keys[key]] = sorted(set(value.split()) & set(FLAGS)) if keys[key] == "flags" \
                else value
    return out


def build() -> dict:
    """torch's version (with its local tag), commit, and the oneDNN and MKL it was built with."""
    shown = torch.__config__.show()
    onednn = re.search(r"MKL-DNN v([\w.]+)", shown)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", shown)
    return {"version": torch.__version__, "git": getattr(torch.version, "git_version", None),
            "onednn": onednn.group(1) if onednn else None, "mkl": mkl.group(1) if mkl else None}


def kernel_env(environ: dict | None = None) -> dict:
    """The set environment variables that choose kernels or threads, sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES)}


def cuda() -> dict | None:
    """The CUDA device, driver, runtime and cuDNN; None without one."""
    if not torch.cuda.is_available():
        return None
    driver = None  # the driver's CUDA version, as cudaDriverGetVersion gives it (13000: 13.0)
    with contextlib.suppress(AttributeError, RuntimeError):
        driver = torch._C._cuda_getDriverVersion()
    return {"device": torch.cuda.get_device_name(0), "capability":
            ".".join(map(str, torch.cuda.get_device_capability(0))), "runtime": torch.version.cuda,
            "driver": driver, "cudnn": torch.backends.cudnn.version()}


def record() -> dict:
    """Everything a run's floats depend on besides its config and commit, read now (after the
    run has set its thread count)."""
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu": cpu(),
            "threads": torch.get_num_threads(), "torch": build(), "kernel_env": kernel_env(),
            "cuda": cuda()}


def vendor_of(floats: dict | None) -> str | None:
    """The CPU's vendor in a record's floats (GenuineIntel, AuthenticAMD), None where absent."""
    return ((floats or {}).get("cpu") or {}).get("vendor")


def _decisive(floats: dict, key: str):
    return vendor_of(floats) if key == "cpu_vendor" else floats.get(key)


def differences(a: dict | None, b: dict | None) -> list[str]:
    """The DECISIVE keys on which two records differ ("not recorded" where either lacks one)."""
    if not a or not b:
        return ["not recorded"]
    return [k for k in DECISIVE if _decisive(a, k) != _decisive(b, k)]


def same_floats(a: dict | None, b: dict | None) -> bool:
    return differences(a, b) == []


def capability_of(info: dict) -> str | None:
    """A run.json's capability at its start ("AVX512", "AVX2", ...), None where not recorded."""
    return (info.get("floats") or {}).get("cpu_capability")


def _starts(info: dict) -> list[dict | None]:
    """A run.json's floats at its start and at each resume, in order (None: not recorded)."""
    return [info.get("floats"), *[r.get("floats") for r in info.get("resumed", [])]]


def capabilities_of(info: dict) -> list[str | None]:
    """The capability at the run's start and at each resume, in order (None: not recorded)."""
    return [(f or {}).get("cpu_capability") for f in _starts(info)]


VENDORS = {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}


def kernels_of(floats: dict | None) -> str | None:
    """A record's kernels in words: its capability and the CPU's vendor ("AVX512 on Intel"),
    None where not recorded."""
    cap, vendor = (floats or {}).get("cpu_capability"), vendor_of(floats)
    if cap is None:
        return None
    return f"{cap} on {VENDORS.get(vendor, vendor)}" if vendor else cap


def kernels_all(info: dict) -> list[str | None]:
    """kernels_of at the run's start and at each resume, in order."""
    return [kernels_of(f) for f in _starts(info)]


def can_reproduce(floats: dict | None) -> bool:
    """Whether this machine can re-run the kernels of a record's floats: a CPU of the same
    vendor, with the recorded capability or a wider one (emulated). Emulation narrows the
    instruction set, not the kernels' tuning to the CPU: on an Intel AVX-512 CPU, AVX2 kernels
    did not reproduce a run made on an AMD AVX2 one (tests/golden/README.md)."""
    here = record()
    return vendor_of(floats) == vendor_of(here) and \
        can_emulate((floats or {}).get("cpu_capability"), here["cpu_capability"])


def can_emulate(recorded: str | None, here: str | None = None) -> bool:
    """Whether this CPU can run the kernels of `recorded` (a narrower or equal capability)."""
    here = here or torch.backends.cpu.get_cpu_capability()
    if recorded not in ORDER or here not in ORDER:
        return False
    return ORDER.index(recorded) >= ORDER.index(here)
