"""The head interface every method implements, and Hugging Face style persistence.

A head directory holds:
  config.json        {"method": ..., "dim": d, "vocab_size": |V|, ...method fields,
                      "training": {provenance of the dense files it was trained on},
                      "provenance": {mmsparse_version, command, inputs, seed} (see provenance.py)}
  model.safetensors  the weights
  vocab.txt          |V| terms, one per line (line i = output dimension i)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..atomic import atomic_path
from ..errors import InputError, require_dir

HEADS: dict[str, type["SparseHead"]] = {}


def register_head(name: str):
    """Class decorator: make a head class loadable by its `method` name."""
    def deco(cls):
        cls.method = name
        HEADS[name] = cls
        return cls
    return deco


class SparseHead(nn.Module):
    """Maps dense vectors z [B, d] float32 to non-negative term weights s [B, |V|] float32.

    Subclasses set `method` (via @register_head), build their layers from `config` in
    __init__, and implement `forward`. `config` must be JSON-serialisable and hold at least
    `dim` and `vocab_size`.
    """

    method: ClassVar[str] = ""

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__()
        if len(vocab) != config["vocab_size"]:
            raise ValueError(f"vocab has {len(vocab)} terms, config says {config['vocab_size']}")
        self.config = dict(config)
        self.vocab = list(vocab)

    @property
    def dim(self) -> int:
        return int(self.config["dim"])

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def save_pretrained(self, path: str | Path) -> None:
        """Write config.json, model.safetensors and vocab.txt into `path` atomically."""
        with atomic_path(path, directory=True) as tmp:
            from ..provenance import record
            cfg = {"method": self.method, **self.config, "provenance": record()}  # inputs, command, seed
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
            state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
            save_file(state, str(tmp / "model.safetensors"), metadata={"method": self.method})
            (tmp / "vocab.txt").write_text("\n".join(self.vocab) + "\n", encoding="utf-8")

    @classmethod
    def from_pretrained(cls, path: str | Path, map_location: str = "cpu") -> "SparseHead":
        """Load a head directory written by save_pretrained. Raises InputError if malformed."""
        p = require_dir(path, "head")
        cfg, vocab = read_head_config(p)
        klass = cls if cls.method else HEADS.get(cfg.get("method", ""))
        if klass is None:
            raise InputError(f"{p}/config.json: unknown method {cfg.get('method')!r}; known: {sorted(HEADS)}")
        cfg = {k: v for k, v in cfg.items() if k != "method"}
        head = klass(cfg, vocab)
        state = load_file(str(p / "model.safetensors"), device=map_location)
        missing, unexpected = head.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise InputError(f"{p}/model.safetensors: missing keys {missing}, unexpected keys {unexpected}")
        head.eval()
        return head


def read_head_config(path: str | Path) -> tuple[dict, list[str]]:
    """(config dict, vocab list) of a head directory, without loading weights."""
    p = require_dir(path, "head")
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        if not (p / name).is_file():
            raise InputError(f"{p}: not a head directory (no {name}); train one with `mmsparse train-head`")
    try:
        cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{p}/config.json: invalid JSON ({e})") from None
    vocab = (p / "vocab.txt").read_text(encoding="utf-8").split("\n")[: cfg.get("vocab_size", 0)]
    return cfg, vocab


def load_head(path: str | Path, map_location: str = "cpu") -> SparseHead:
    """Load any registered head from its directory (imports the built-in methods first)."""
    from . import d2s  # noqa: F401  (registers built-in heads)
    from . import vdr  # noqa: F401  (registers the VDR head)
    return SparseHead.from_pretrained(path, map_location)
