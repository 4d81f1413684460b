"""The towers of a dual encoder run by ONNX Runtime on the CPU (`--runtime onnx`).

mmsparse exports the image and the text tower itself with `torch.onnx.export` (the TorchScript
exporter, opset 17; sentence-transformers' optimum route does not know VisionTextDualEncoderModel),
each wrapped so the graph ends in the stored vector: image `pixel_values` [B, 3, H, W] float32 ->
`vectors` [B, d] (L2-normalised projected pooled state), `pooled` [B, h] (pre-projection) and
`hidden` (the last hidden state: [B, C, H', W'] or [B, P, h]); text the tokenizer's int64 arrays
[B, L] (those the text tower takes) -> `vectors`, `pooled`, `hidden` [B, L, h]. Batch and caption
length are dynamic axes. Every export is checked against PyTorch on a fresh batch (cosine >= 0.9999
per row) before it is kept.

Graphs are cached once per model in $MMSPARSE_CACHE/onnx/KEY/{image,text}.onnx (settings.cache_dir),
KEY a hash of the model's content fingerprint (provenance.model_fingerprint, as dense files record
it), the model class, torch's version and EXPORT_VERSION: a model changed in place gets a new key,
so it is never served a stale graph. Files appear atomically (a second process exporting at the
same time replaces them with the same bytes).

Sessions use the CPUExecutionProvider with intra-op threads = torch's thread setting when they
are created (lazily, per tower, on first use), without spin-waiting (the cores are shared with the
process decoding the next batch). Raises OnnxUnavailable (an InputError) where the
runtime cannot run: onnxruntime not installed, no fingerprint (a hub model outside the local cache),
or a model that does not export or whose graph disagrees with PyTorch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np

from ..errors import InputError

EXPORT_VERSION = 1
OPSET = 17
MIN_COSINE = 0.9999


class OnnxUnavailable(InputError):
    """The ONNX runtime cannot run this backbone here (the message says why, without a fix)."""


def onnxruntime_available() -> bool:
    """Whether onnxruntime and onnx import (the `onnx` extra)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def graph_dir(fingerprint: str, model_class: str) -> Path:
    """The cache directory of a model's graphs: settings.cache_dir()/onnx/KEY (module docstring)."""
    import torch

    from ..settings import cache_dir
    key = hashlib.sha256(f"{fingerprint}|{model_class}|torch {torch.__version__}|v{EXPORT_VERSION}".encode())
    return cache_dir() / "onnx" / key.hexdigest()[:24]


def _wrappers(net, text_inputs: list[str]):
    """torch modules (image, text) returning (vectors, pooled, hidden) as the backbone computes them."""
    import torch

    class Image(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tower, self.proj = net.vision_model, getattr(net, "visual_projection", None)

        def forward(self, pixel_values):
            out = self.tower(pixel_values=pixel_values, return_dict=True)
            pooled = out.pooler_output
            vec = self.proj(pooled) if self.proj is not None else pooled
            return torch.nn.functional.normalize(vec, dim=-1), pooled, out.last_hidden_state

    class Text(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tower, self.proj = net.text_model, getattr(net, "text_projection", None)

        def forward(self, *arrays):
            out = self.tower(**dict(zip(text_inputs, arrays)), return_dict=True)
            pooled = out.pooler_output
            vec = self.proj(pooled) if self.proj is not None else pooled
            return torch.nn.functional.normalize(vec, dim=-1), pooled, out.last_hidden_state

    return Image().eval(), Text().eval()


def _sample_inputs(backbone, rows: int, seed: int):
    """(pixel_values [rows, 3, H, W], text batch) of `rows` random images and captions of two lengths."""
    import torch
    from PIL import Image
    rng = np.random.default_rng(seed)
    ims = [Image.fromarray(rng.integers(0, 256, (48 + 8 * i, 64, 3), dtype=np.uint8)) for i in range(rows)]
    vocab = [w for w in backbone.tokenizer.get_vocab() if w.isalpha()][:50] or ["a"]
    texts = [" ".join(rng.choice(vocab, 2 + 5 * (i % 2))) for i in range(rows)]
    return backbone.preprocess_images(ims).to(torch.float32), backbone.tokenize(texts)


@contextlib.contextmanager
def _quiet_stdout():
    """File descriptor 1 to /dev/null inside the block: the TorchScript exporter's C++ log prints the
    whole graph there when an export fails (torch 2.13 turns that log on whatever it is told)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def export(backbone, out: Path) -> None:
    """Export both towers of `backbone` (an HFDualEncoder) into `out`/{image,text}.onnx + meta.json,
    each checked against PyTorch (module docstring). OnnxUnavailable on any failure."""
    import torch
    net = backbone.net
    names = list(backbone.text_inputs)
    image, text = _wrappers(net, names)
    pv, batch = _sample_inputs(backbone, 2, 0)
    out.mkdir(parents=True, exist_ok=True)
    outs = ["vectors", "pooled", "hidden"]
    try:
        with warnings.catch_warnings(), torch.no_grad(), _quiet_stdout():
            warnings.simplefilter("ignore")
            tmp = out / f"image.onnx.tmp{os.getpid()}"
            torch.onnx.export(image, (pv,), str(tmp), input_names=["pixel_values"], output_names=outs,
                              dynamic_axes={"pixel_values": {0: "batch"}, **{o: {0: "batch"} for o in outs}},
                              opset_version=OPSET, dynamo=False)
            os.replace(tmp, out / "image.onnx")
            tmp = out / f"text.onnx.tmp{os.getpid()}"
            args = tuple(batch[k] for k in names)
            torch.onnx.export(text, args, str(tmp), input_names=names, output_names=outs,
                              dynamic_axes={**{k: {0: "batch", 1: "length"} for k in names},
                                            "vectors": {0: "batch"}, "pooled": {0: "batch"},
                                            "hidden": {0: "batch", 1: "length"}},
                              opset_version=OPSET, dynamo=False)
            os.replace(tmp, out / "text.onnx")
        _check(backbone, out, image, text, names)
    except OnnxUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 — any exporter or runtime failure means "cannot export"
        for f in out.glob("*.onnx*"):
            f.unlink(missing_ok=True)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise OnnxUnavailable(f"{type(e).__name__}: {first}") from None
    (out / "meta.json").write_text(json.dumps({"model": backbone.model, "model_fingerprint": backbone.fingerprint(),
                                               "model_class": type(net).__name__, "opset": OPSET,
                                               "export_version": EXPORT_VERSION, "torch": torch.__version__},
                                              indent=1))


def _check(backbone, out: Path, image, text, names) -> None:
    """OnnxUnavailable unless both graphs give PyTorch's vectors on a batch of another size."""
    import torch
    pv, batch = _sample_inputs(backbone, 3, 1)
    with torch.no_grad():
        want = {"image": image(pv)[0].numpy(), "text": text(*(batch[k] for k in names))[0].numpy()}
    got = {"image": session(out / "image.onnx", 1).run(["vectors"], {"pixel_values": pv.numpy()})[0],
           "text": session(out / "text.onnx", 1).run(["vectors"], {k: batch[k].numpy() for k in names})[0]}
    for tower in want:
        cos = float((want[tower] * got[tower]).sum(1).min())
        if not cos >= MIN_COSINE:
            for f in out.glob("*.onnx"):
                f.unlink(missing_ok=True)
            raise OnnxUnavailable(f"the exported {tower} tower disagrees with PyTorch (cosine {cos:.6f} < "
                                  f"{MIN_COSINE})")


def session(path: Path, threads: int):
    """An onnxruntime InferenceSession of `path` on the CPUExecutionProvider with `threads` intra-op threads."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, int(threads))
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    # no spin-waiting between operators: on a 2-core machine the spinning threads would take the CPU
    # time the DataLoader worker decoding the next batch needs
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class OnnxTowers:
    """Both towers of one backbone as ONNX Runtime sessions (created on first use of each).

    `OnnxTowers.load(backbone, threads, log)` finds the cached graphs or exports them (log: str ->
    None, told when an export happens). image(pixel_values [B, 3, H, W], want) / text(batch, want)
    -> {name: np.ndarray float32} for the outputs named in `want` (vectors, pooled, hidden)."""

    def __init__(self, directory: Path, text_inputs: list[str], threads: int):
        self.dir, self.text_inputs, self.threads = directory, list(text_inputs), threads
        self._sessions: dict = {}

    @classmethod
    def load(cls, backbone, threads: int, log=None) -> "OnnxTowers":
        if not onnxruntime_available():
            raise OnnxUnavailable("onnxruntime is not installed (pip install 'mmsparse[onnx]')")
        fp = backbone.fingerprint()
        if not fp:
            raise OnnxUnavailable("the model has no content fingerprint (a hub model outside the local cache), so "
                                  "its graphs cannot be cached safely")
        d = graph_dir(fp, type(backbone.net).__name__)
        if not ((d / "image.onnx").is_file() and (d / "text.onnx").is_file() and (d / "meta.json").is_file()):
            if log:
                log(f"exporting {backbone.model}'s towers to ONNX once (cached in {d})")
            export(backbone, d)
        return cls(d, backbone.text_inputs, threads)

    def _run(self, tower: str, feed: dict, want) -> dict:
        if tower not in self._sessions:
            self._sessions[tower] = session(self.dir / f"{tower}.onnx", self.threads)
        names = list(want)
        return dict(zip(names, self._sessions[tower].run(names, feed)))

    def image(self, pixel_values, want=("vectors",)) -> dict:
        return self._run("image", {"pixel_values": np.ascontiguousarray(pixel_values.numpy(), np.float32)}, want)

    def text(self, batch: dict, want=("vectors",)) -> dict:
        return self._run("text", {k: batch[k].numpy().astype(np.int64) for k in self.text_inputs}, want)
