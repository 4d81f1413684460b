"""mmsparse.runtime: the allocator setting made at import, thread and worker defaults, precision
choices, and a short real encode that must not spend its time in the kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mmsparse import runtime
from mmsparse.errors import InputError

GLIBC = pytest.mark.skipif(not runtime._glibc(), reason="the allocator setting is for glibc's malloc")


def _python(code: str, **env) -> dict:
    """Run `code` in a fresh interpreter (env added to this one's); it prints one JSON line."""
    e = {**os.environ, **env}
    for k in [k for k, v in env.items() if v is None]:
        e.pop(k)
    p = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# Allocate, touch and free a 64 MiB block 40 times; count the page faults that took.
FAULTS = """
import json, resource, torch
import mmsparse
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    a = torch.empty(64 << 20, dtype=torch.uint8).fill_(1)
    del a
print(json.dumps({"faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0,
                  "tuned": mmsparse.runtime.tune_allocator()}))
"""


@GLIBC
def test_import_keeps_freed_blocks_in_the_process():
    """A 64 MiB block freed and allocated again reuses its pages once `import mmsparse` has run (after
    at most 8 rounds here, while the heap's holes settle); with glibc's defaults (MMSPARSE_MALLOC=
    system) each allocation maps fresh pages and faults them in: above 32 MiB a block is always mapped
    anew, and a batch of 64 images through the EfficientNet tower holds 100 MiB activations."""
    unset = {"MALLOC_MMAP_THRESHOLD_": None, "MALLOC_TRIM_THRESHOLD_": None}
    tuned = _python(FAULTS, MMSPARSE_MALLOC="", **unset)
    plain = _python(FAULTS, MMSPARSE_MALLOC="system", **unset)
    assert tuned["tuned"] == {"allocator": "glibc", "mmap_threshold": 1 << 30, "trim_threshold": 2 ** 31 - 1}
    assert plain["tuned"]["skipped"] == "MMSPARSE_MALLOC=system"
    pages = 40 * (64 << 20) // 4096
    assert plain["faults"] > 0.9 * pages, plain             # every block faulted in again
    assert tuned["faults"] < 0.3 * pages, tuned             # the first rounds only
    mine = _python(FAULTS, MALLOC_TRIM_THRESHOLD_="1000000", MMSPARSE_MALLOC="")
    assert mine["tuned"]["skipped"] == "MALLOC_TRIM_THRESHOLD_ set in the environment"

# The same on a worker thread (as a Ray actor's calls run), with 96 MiB blocks: above the 64 MiB
# heaps of a thread's own arena.
THREAD_FAULTS = """
import json, resource, threading, torch
import mmsparse
out = {}
def work():
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        a = torch.empty(96 << 20, dtype=torch.uint8).fill_(1)
        del a
    out["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
t = threading.Thread(target=work)
t.start()
t.join()
print(json.dumps(out))
"""


@GLIBC
def test_worker_env_keeps_freed_blocks_on_worker_threads(monkeypatch):
    """A worker thread's blocks above 64 MiB are mapped anew on every allocation even after `import
    mmsparse` (its own malloc arena cannot hold them), unless the process started with
    runtime.worker_env(), which Ray workers get (distributed.init_ray)."""
    unset = {"MALLOC_MMAP_THRESHOLD_": None, "MALLOC_TRIM_THRESHOLD_": None, "MALLOC_ARENA_MAX": None}
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MMSPARSE_MALLOC", raising=False)
    env = runtime.worker_env()
    assert env == {"MALLOC_ARENA_MAX": "1"}
    pages = 40 * (96 << 20) // 4096
    plain = _python(THREAD_FAULTS, MMSPARSE_MALLOC="", **unset)
    one = _python(THREAD_FAULTS, MMSPARSE_MALLOC="", **{**unset, **env})
    assert plain["faults"] > 0.9 * pages, plain             # every block faulted in again
    assert one["faults"] < 0.3 * pages, one                 # the first rounds only
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")             # the user's setting is kept
    assert runtime.worker_env() == {}
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setenv("MMSPARSE_MALLOC", "system")
    assert runtime.worker_env() == {}



ENCODE = """
import json, resource, sys
import mmsparse
from mmsparse.backbones import load_backbone
from mmsparse.backbones.encode import encode_images_file
from mmsparse.data import read_karpathy
data, model, out = sys.argv[1:4]
recs = read_karpathy(data + "/dataset_flickr8k.json", data + "/images")["test"].images[:160]
bb = load_backbone("hf-dual", model, "cpu")
attrs = {"modality": "image", "dataset": "t", "split": "test"}
encode_images_file(bb, recs[:32], out + ".warm", attrs, batch_size=32, workers=0)   # the heap grows once
r0 = resource.getrusage(resource.RUSAGE_SELF)
encode_images_file(bb, recs[32:], out, attrs, batch_size=32, workers=0)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"user": r1.ru_utime - r0.ru_utime, "system": r1.ru_stime - r0.ru_stime}))
"""


@GLIBC
def test_short_encode_is_not_kernel_bound(flickr8k_dir, dual_encoder_dir, tmp_path):
    """128 real Flickr8k images through the real image tower (4 batches of 32, decoded in this
    process, after one batch that grows the heap): the kernel's share of the CPU time stays small
    (1-4 % on 2 cores with the other core busy). With glibc's defaults it is 56 % there
    (MMSPARSE_MALLOC=system: the tower's activations are faulted in again every batch; docs/speed.md)."""
    e = {**os.environ, "MMSPARSE_MALLOC": ""}
    e.pop("MALLOC_MMAP_THRESHOLD_", None), e.pop("MALLOC_TRIM_THRESHOLD_", None)
    p = subprocess.run([sys.executable, "-c", ENCODE, str(flickr8k_dir), str(dual_encoder_dir), str(tmp_path / "o.h5")],
                       env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    t = json.loads(p.stdout.strip().splitlines()[-1])
    assert t["system"] < 0.25 * (t["user"] + t["system"]), t


def test_thread_and_worker_defaults_follow_the_cores(monkeypatch):
    for cores, workers in ((1, 1), (2, 1), (4, 1), (8, 2), (16, 4), (64, 8)):
        monkeypatch.setattr(runtime, "available_cores", lambda c=cores: c)
        assert runtime.default_threads() == cores and runtime.default_workers() == workers
    monkeypatch.undo()
    assert 1 <= runtime.available_cores() <= (os.cpu_count() or 1)


def test_precision_choices(monkeypatch):
    assert runtime.resolve_precision("fp32", "cpu") == "fp32"
    with pytest.raises(InputError, match=r"--precision fp16: float16 autocast runs on CUDA only"):
        runtime.resolve_precision("fp16", "cpu")
    with pytest.raises(InputError, match=r"--amp 'fp8': use one of fp32, bf16, fp16, auto"):
        runtime.resolve_precision("fp8", "cpu", flag="--amp")
    for unit, want in ((None, "fp32"), ("amx_bf16", "bf16"), ("avx512_bf16", "bf16")):
        monkeypatch.setattr(runtime, "cpu_bf16", lambda u=unit: u)
        assert runtime.resolve_precision("auto", "cpu") == want
        if unit is None:
            with pytest.raises(InputError, match="has no bf16 matrix unit"):
                runtime.resolve_precision("bf16", "cpu")
        else:
            assert runtime.resolve_precision("bf16", "cpu") == "bf16"
            with runtime.autocast("cpu", "bf16"):
                assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with runtime.autocast("cpu", "fp32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_torch_threads_restores():
    n = torch.get_num_threads()
    with runtime.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == n
