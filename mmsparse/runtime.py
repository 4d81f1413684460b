"""The machine mmsparse runs on: the C allocator, thread and worker counts, and native bf16.

`tune_allocator()` runs once when `mmsparse` is imported. glibc's malloc serves every block above
its mmap threshold (128 KiB, rising to at most 32 MiB) with a fresh mmap and gives it back to the
kernel with munmap when it is freed; the same happens to the free top of the heap above
M_TRIM_THRESHOLD. A vision tower allocates tens of MiB of activations per batch, so each batch
faults every page of them in again: encoding on 2 cores spent 57 % of its CPU time in the kernel
(123.6 s system against 94.7 s user for the 1,000 Flickr8k validation images and 5,000 captions,
29.4 million minor page faults). Raising the mmap threshold to 1 GiB and the trim threshold to
2 GiB keeps freed pages in the process for the next batch: 8.3 s system, 0.78 million faults, the
images 4.0 x faster (docs/speed.md). The cost is that the process keeps its peak heap until it
exits (peak RSS 1.76 -> 2.24 GB on that run). MMSPARSE_MALLOC=system leaves glibc's defaults;
MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ set in the environment are the user's and kept.

`cpu_bf16()` says whether the CPU multiplies bf16 natively (AMX or AVX512-BF16); elsewhere oneDNN
emulates it, 14 x slower than fp32 on an AVX2 CPU (docs/speed.md), so bf16 is refused there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

from .errors import InputError

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc malloc.h
MMAP_THRESHOLD = 1 << 30                      # blocks below 1 GiB come from the heap
TRIM_THRESHOLD = 2 ** 31 - 1                  # the heap's free top goes back only past 2 GiB

_TUNED: dict = {}


def tune_allocator() -> dict:
    """Set glibc malloc's mmap and trim thresholds for this process (module docstring), once.

    Returns what was done: {"allocator": "glibc", "mmap_threshold": bytes, "trim_threshold": bytes}
    when set, or {"allocator": name, "skipped": reason} (not Linux/glibc, MMSPARSE_MALLOC=system,
    thresholds the user set in the environment, or mallopt refused). Never raises. Child processes
    started by fork (DataLoader workers) inherit the setting; spawned ones import mmsparse again."""
    if _TUNED:
        return dict(_TUNED)
    _TUNED.update(_tune())
    return dict(_TUNED)


def _system_malloc() -> bool:
    """MMSPARSE_MALLOC=system (or off, 0): leave glibc's defaults alone."""
    return os.environ.get("MMSPARSE_MALLOC", "").lower() in ("system", "off", "0")


def _tune() -> dict:
    if _system_malloc():
        return {"allocator": "system", "skipped": "MMSPARSE_MALLOC=system"}
    if not _glibc():
        return {"allocator": sys.platform, "skipped": "not glibc"}
    mine = [k for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ]
    if mine:
        return {"allocator": "glibc", "skipped": f"{mine[0]} set in the environment"}
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    except (OSError, AttributeError):
        ok = False
    if not ok:
        return {"allocator": "glibc", "skipped": "mallopt refused"}
    return {"allocator": "glibc", "mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}


def worker_env() -> dict:
    """Environment variables for worker processes this process starts through Ray (its actors and
    tasks): {"MALLOC_ARENA_MAX": "1"}, or {} under MMSPARSE_MALLOC=system or when the user set
    MALLOC_ARENA_MAX. Why: Ray runs an actor's calls on a worker thread, and glibc gives each
    thread its own arena, whose heaps hold at most 64 MiB; a larger block (a vision tower's
    activations, a sparsify batch) is then mmapped and unmapped on every call whatever the
    thresholds `tune_allocator` set, and the page-fault storm returns (a 2-core actor encoding
    1,000 images: 22 million minor faults, 53.5 s system against 37.6 s user). One arena serves
    every thread from the main heap, where those thresholds hold (0.4 million faults, 1.2 s
    system; docs/ray.md). glibc reads the variable when the process starts, hence an environment
    variable for the workers rather than a mallopt call here."""
    if _system_malloc() or "MALLOC_ARENA_MAX" in os.environ:
        return {}
    return {"MALLOC_ARENA_MAX": "1"}


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a container's cpuset), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """torch intra-op threads by default: every available core."""
    return available_cores()


def default_workers() -> int:
    """Image decoding workers (DataLoader processes) by default: one per 4 available cores, at least
    1 and at most 8. A JPEG costs about 4 ms of decoding and preprocessing against about 35 ms of
    the EfficientNet-Lite0 tower (fp32, per core), so one worker feeds 2-4 cores of model; the
    worker sleeps while the batch it made ahead waits (docs/speed.md measures 2 cores)."""
    return max(1, min(8, available_cores() // 4))


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch.set_num_threads(n) inside the block, restored after (None or 0: unchanged)."""
    if not n:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def cpu_bf16() -> str | None:
    """The CPU's native bf16 matrix unit, "amx_bf16" or "avx512_bf16", or None (then oneDNN
    emulates bf16, far slower than fp32). Reads torch.cpu.get_capabilities()."""
    try:
        import torch
        caps = torch.cpu.get_capabilities()
    except (ImportError, AttributeError, RuntimeError):
        return None
    return next((k for k in ("amx_bf16", "avx512_bf16") if caps.get(k)), None)


PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def native_bf16(device: str) -> bool:
    """Whether `device` (cpu, cuda, cuda:N, mps) runs bf16 matrix work natively: a CUDA GPU that
    supports it, or a CPU with AMX or AVX512-BF16 (cpu_bf16)."""
    dev = str(device)
    if dev.startswith("cuda"):
        import torch
        return bool(torch.cuda.is_bf16_supported())
    return dev == "cpu" and cpu_bf16() is not None


def resolve_precision(precision: str, device: str, flag: str = "--precision") -> str:
    """The precision a run on `device` computes in (fp32 | bf16 | fp16) for `precision` (those or
    auto: bf16 where `native_bf16`, else fp32). InputError naming `flag` where it cannot run:
    fp16 off CUDA, bf16 on a GPU without it, on a CPU without a bf16 matrix unit (oneDNN would
    emulate it: 14 x slower than fp32 on an AVX2 CPU, docs/speed.md) or on another device."""
    if precision not in (*PRECISIONS, "auto"):
        raise InputError(f"{flag} {precision!r}: use one of {', '.join(PRECISIONS)}, auto")
    if precision == "fp32":
        return "fp32"
    dev = str(device)
    native = native_bf16(dev)
    if precision == "auto":
        return "bf16" if native else "fp32"
    if precision == "fp16":
        if not dev.startswith("cuda"):
            raise InputError(f"{flag} fp16: float16 autocast runs on CUDA only, and this run uses {dev}; use fp32 "
                             f"(or bf16 on a CPU with AMX or AVX512-BF16)")
        return "fp16"
    if native:
        return "bf16"
    if dev.startswith("cuda"):
        raise InputError(f"{flag} bf16: this GPU does not support bfloat16; use fp16 or fp32")
    if dev == "cpu":
        raise InputError(f"{flag} bf16: this CPU ({cpu_name()}) has no bf16 matrix unit (AMX or AVX512-BF16), so "
                         f"bf16 would be emulated and slower than fp32; use fp32, or auto for bf16 only where it "
                         f"is native")
    raise InputError(f"{flag} bf16: autocast runs on CUDA and CPU, and this run uses {dev}; use fp32")


def autocast(device: str, precision: str):
    """torch.autocast on `device`'s type with `precision`'s dtype (resolve_precision first), or a
    null context for fp32."""
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    import torch
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    return torch.autocast(device_type=kind, dtype=getattr(torch, PRECISIONS[precision]))


def cpu_avx512() -> bool:
    """Whether the CPU has AVX-512 (oneDNN's channels-last convolutions are faster there)."""
    try:
        import torch
        return bool(torch.cpu.get_capabilities().get("avx512_f"))
    except (ImportError, AttributeError, RuntimeError):
        return False


def cpu_name() -> str:
    """The CPU model as the OS names it (for benchmark records), or platform.processor()."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()
