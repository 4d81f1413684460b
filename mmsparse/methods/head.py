"""Heads: what a method trains, saved and loaded the Hugging Face way.

A head directory holds:
  config.json        {"method": name, "dim": d, "vocab_size": |V|, ...method fields,
                      "training": {inputs, resolved config, chosen epoch, validation figures},
                      "provenance": {mmsparse_version, command, inputs, seed} (provenance.py)}
  model.safetensors  the weights
  vocab.txt          |V| terms, one per line (line i = output dimension i)
  tokenizer/         the vocabulary's tokenizer, for heads whose terms are words

`load_head(dir)` reads config.json's "method" and builds that method's head class through the
registry (mmsparse.methods), so any method's head loads in a fresh interpreter.
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


class SparseHead(nn.Module):
    """Maps a method's inputs to non-negative term weights s [B, |V|] float32.

    Every head is called the same way: `head(x, mask=None, side="image")` with x [B, d] vectors
    (or [B, L, h] position states and mask [B, L], 1 = real position, for heads over states);
    `side` ("image" | "text") picks the tower of two-tower heads (VDR) and is ignored by one-tower
    heads (D2S, joint, the BM25-V autoencoder). Subclasses set `method` (the registry name), build
    their layers from `config` in __init__ and implement `forward`. `config` must be JSON-serialisable and hold at least `dim` and
    `vocab_size`; `vocab` names the |V| output dimensions. `tokenizer` (optional, not part of the
    state dict) maps captions to term ids and is saved in tokenizer/.
    """

    method: ClassVar[str] = ""

    def __init__(self, config: dict, vocab: list[str]):
        super().__init__()
        if len(vocab) != config["vocab_size"]:
            raise ValueError(f"vocab has {len(vocab)} terms, config says {config['vocab_size']}")
        self.config = dict(config)
        self.vocab = list(vocab)
        self.tokenizer = None

    @property
    def dim(self) -> int:
        return int(self.config["dim"])

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                side: str = "image") -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def save_pretrained(self, path: str | Path) -> Path:
        """Write config.json, model.safetensors, vocab.txt (and tokenizer/) into `path`
        atomically: a killed save leaves the previous directory or none. Returns `path`."""
        from ..provenance import record

        with atomic_path(path, directory=True) as tmp:
            cfg = {"method": self.method, **self.config, "provenance": record()}
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True), encoding="utf-8")
            state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
            save_file(state, str(tmp / "model.safetensors"), metadata={"method": self.method})
            (tmp / "vocab.txt").write_text("\n".join(self.vocab) + "\n", encoding="utf-8")
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(str(tmp / "tokenizer"))
        return Path(path)

    @classmethod
    def from_pretrained(cls, path: str | Path, map_location: str = "cpu") -> "SparseHead":
        """Load a head directory written by save_pretrained (its own method's class when called
        on SparseHead). Raises InputError when the directory is malformed or of another method."""
        p = require_dir(path, "head")
        cfg, vocab = read_head_config(p)
        if cls.method:
            klass = cls
            if cfg.get("method") not in (cls.method, None):
                raise InputError(f"{p}/config.json: a {cfg.get('method')!r} head, not {cls.method!r}")
        else:
            from . import get_method
            klass = get_method(cfg.get("method", ""), f"{p}/config.json: method").head_class
        head = klass({k: v for k, v in cfg.items() if k not in ("method", "provenance")}, vocab)
        state = load_file(str(p / "model.safetensors"), device=map_location)
        missing, unexpected = head.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise InputError(f"{p}/model.safetensors: missing keys {missing}, unexpected keys {unexpected}")
        if (p / "tokenizer" / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer
            head.tokenizer = AutoTokenizer.from_pretrained(str(p / "tokenizer"))
        head.eval()
        return head


def read_head_config(path: str | Path) -> tuple[dict, list[str]]:
    """(config dict, vocab list) of a head directory, without loading weights. InputError when
    a file is missing or config.json is not JSON."""
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
    """Any method's head from its directory (the method named in config.json), in eval mode."""
    return SparseHead.from_pretrained(path, map_location)


def require_tokenizer(head: SparseHead, head_dir: str | Path):
    """The head's tokenizer: its own (tokenizer/ in the head directory), else the config's
    `vocab_source` model directory. Raises InputError when neither exists."""
    if head.tokenizer is not None:
        return head.tokenizer
    src = Path(str(head.config.get("vocab_source", "")))
    if str(src) and (src / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer
        head.tokenizer = AutoTokenizer.from_pretrained(str(src))
        return head.tokenizer
    raise InputError(f"{head_dir}: no tokenizer/ and vocab_source {str(src)!r} is not a tokenizer directory; "
                     "needed for caption-term queries")
