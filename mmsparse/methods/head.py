"""Heads: what a method trains, saved and loaded the Hugging Face way.

A head directory holds:
  config.json        {"method": name, "dim": d, "vocab_size": |V|, ...method fields,
                      "training": {inputs, resolved config, chosen epoch, validation figures},
                      "provenance": {mmsparse_version, command, inputs, seed} (provenance.py)}
  model.safetensors  the weights
  vocab.txt          |V| terms, one per line (line i = output dimension i)
  tokenizer/         the vocabulary's tokenizer, for heads whose terms are words
  README.md          a generated model card (model_card: method, backbone, vocabulary, config,
                     training data, validation figures), as the Hugging Face hub shows it

`from_pretrained` takes a directory or a Hugging Face hub id ("user/name", downloaded with
huggingface_hub.snapshot_download into the hub cache); `push_to_hub` uploads a head with
HfApi().create_repo + upload_folder, the path huggingface_hub documents.

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
from .headdir import CARD, HEAD_FILES, read_head_config, resolve_head_path  # noqa: F401 (re-exported)


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
            (tmp / CARD).write_text(model_card(cfg), encoding="utf-8")
        return Path(path)

    @classmethod
    def from_pretrained(cls, path: str | Path, map_location: str = "cpu", *, revision: str | None = None,
                        cache_dir: str | Path | None = None, token: str | bool | None = None) -> "SparseHead":
        """Load a head directory written by save_pretrained (its own method's class when called
        on SparseHead), or a Hugging Face hub id "user/name" (resolve_head_path: `revision`,
        `cache_dir`, `token`). Raises InputError when the directory is malformed or of another
        method, or the hub id cannot be fetched."""
        p = require_dir(resolve_head_path(path, revision=revision, cache_dir=cache_dir, token=token), "head")
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
        head.source_dir = p
        return head

    def push_to_hub(self, repo_id: str, *, token: str | bool | None = None, private: bool | None = None,
                    revision: str | None = None, commit_message: str = "Upload mmsparse sparse head",
                    create_pr: bool = False):
        """Upload this head to the Hugging Face hub repository `repo_id` ("user/name", created if
        missing): HfApi(token).create_repo(repo_id, exist_ok=True) then upload_folder of the head
        directory (config.json, model.safetensors, vocab.txt, tokenizer/, README.md card). A head
        loaded by from_pretrained whose weights are unchanged is uploaded as that directory (its
        training provenance intact, a card added if it has none); otherwise save_pretrained
        writes it first. Returns huggingface_hub's CommitInfo (`.commit_url`). Raises InputError
        when the hub cannot be reached (e.g. HF_HUB_OFFLINE=1) or refuses the upload."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mmsparse-push-") as tmp:
            src = getattr(self, "source_dir", None)
            if src is not None and _same_weights(self, src):
                folder = push_folder(src, Path(tmp) / "head")
            else:
                folder = self.save_pretrained(Path(tmp) / "head")
            return upload_head_folder(folder, repo_id, token=token, private=private, revision=revision,
                                      commit_message=commit_message, create_pr=create_pr)


def to_csr(weights: torch.Tensor):
    """Head outputs [N, |V|] (any device) as a scipy CSR matrix: float32 weights, int32 columns
    sorted within rows, explicit zeros left out; what scipy.sparse.csr_matrix(array) gives, via
    torch's compaction (2 x faster on a [1024, 6740] batch)."""
    import numpy as np
    import scipy.sparse as sp

    w = weights.detach().float().cpu()
    c = w.to_sparse_csr()
    return sp.csr_matrix((c.values().numpy(), c.col_indices().numpy().astype(np.int32),
                          c.crow_indices().numpy().astype(np.int32)), shape=tuple(w.shape))


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


# -- Hugging Face hub and the model card -----------------------------------------------------

def push_folder(head_dir: str | Path, dest: str | Path) -> Path:
    """A copy of head directory `head_dir` at `dest` with a model card README.md (kept when it has
    one, else generated from its config.json): what upload_head_folder sends."""
    import shutil

    cfg, _ = read_head_config(head_dir)
    shutil.copytree(head_dir, dest, ignore=shutil.ignore_patterns(".*"))
    card = Path(dest) / CARD
    if not card.is_file():
        card.write_text(model_card(cfg), encoding="utf-8")
    return Path(dest)


def upload_head_folder(folder: str | Path, repo_id: str, *, token: str | bool | None = None,
                       private: bool | None = None, revision: str | None = None,
                       commit_message: str = "Upload mmsparse sparse head", create_pr: bool = False):
    """HfApi(token).create_repo(repo_id, repo_type="model", private, exist_ok=True), then
    upload_folder(folder_path=folder, repo_id, revision, commit_message, create_pr); returns the
    CommitInfo. InputError when the hub cannot be reached or refuses."""
    read_head_config(folder)  # only head directories go up
    try:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        return api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", revision=revision,
                                 commit_message=commit_message, create_pr=create_pr)
    except Exception as e:  # noqa: BLE001 — offline, auth, network: one message
        raise InputError(f"{repo_id}: upload to the Hugging Face hub failed ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); check your token (huggingface-cli login or "
                         "token=...), the repository id and HF_HUB_OFFLINE") from None


def _same_weights(head: SparseHead, head_dir: Path) -> bool:
    """Whether `head`'s state dict equals the model.safetensors in `head_dir` (and its config)."""
    try:
        saved = load_file(str(Path(head_dir) / "model.safetensors"))
        cfg, vocab = read_head_config(head_dir)
    except (OSError, InputError):
        return False
    state = head.state_dict()
    same_cfg = {k: v for k, v in cfg.items() if k not in ("method", "provenance")} == head.config
    return (same_cfg and vocab == head.vocab and set(saved) == set(state)
            and all(torch.equal(saved[k], state[k].detach().cpu()) for k in state))


def _name(p) -> str:
    """A path as its last component (a card never shows the training machine's paths); hub ids
    and names unchanged."""
    s = str(p or "")
    return Path(s).name if s.startswith(("/", "~", ".")) or "\\" in s else s


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def model_card(config: dict, use: list[str] | None = None, record: str | None = "`config.json` (`training`, `provenance`)") -> str:
    """The README.md model card of a head, from its config.json dict: YAML front matter
    (library_name mmsparse, tags, base_model when the backbone model is a hub id), the method,
    backbone and model, input dimension, the vocabulary (size and source), how to use it, the
    training data (dataset and file names, never local paths), the chosen epoch's validation
    figures and each epoch's, the resolved training config, and the mmsparse version.
    use: the lines of the "Use" section instead of mmsparse's own (an export to another library,
    whose name then heads the front matter: api/exporting.py gives sentence-transformers', with
    pipeline_tag feature-extraction, as sentence-transformers' own sparse encoder cards).
    record: where in the folder the head's full record is (markdown); None: the folder holds none
    (an inference-free query-route export)."""
    method = config.get("method") or "?"
    tr = config.get("training") or {}
    model = tr.get("model") or tr.get("model_name") or ""   # (an export names a local model by name only)
    hub_model = bool(model) and not str(model).startswith(("/", ".", "~")) and "/" in str(model)
    prov = config.get("provenance") or {}
    lines = ["---", f"library_name: {'sentence-transformers' if use else 'mmsparse'}",
             f"tags: [mmsparse, learned-sparse-retrieval, multimodal, sparse-retrieval, {method}"
             + (", sentence-transformers, sparse-encoder]" if use else "]")]
    if hub_model:
        lines.append(f"base_model: {model}")
    if use:
        lines.append("pipeline_tag: feature-extraction")
    lines += ["---", "", f"# {method} sparse head for {tr.get('backbone') or 'a'} {_name(model) or ''}".rstrip(), "",
              f"A learned sparse retrieval head trained with [mmsparse](https://pypi.org/project/mmsparse/) "
              f"(method `{method}`): it maps the dense vectors of a frozen vision-language dual encoder to "
              f"non-negative weights over {config.get('vocab_size', '?')} vocabulary terms, so images and captions "
              "can be served by an inverted index and every match can be read term by term.", "",
              "## Model", "", "| | |", "|---|---|", f"| method | `{method}` |",
              f"| backbone | `{tr.get('backbone', '?')}` |", f"| model | `{_name(model) or '?'}` |",
              f"| input dimension | {config.get('dim', '?')} |",
              f"| vocabulary size | {config.get('vocab_size', '?')} terms |",
              f"| vocabulary source | `{_name(config.get('vocab_source')) or 'learned (no text vocabulary)'}` |"]
    for k in ("omega", "k", "k_doc", "k_query", "image_input", "text_input", "center"):
        if k in config:
            lines.append(f"| {k} | {config[k]} |")
    lines += ["", "## Use", ""]
    lines += use if use else [
        "```bash", "mmsparse sparsify HEAD test-images.h5 -o sparse/test-images.h5",
        "mmsparse index sparse/test-images.h5 -o index/head", 'mmsparse query index/head "a dog running on the beach"',
        "```", "", "```python", "import mmsparse", "head = mmsparse.load_head(\"HEAD\")   # a directory or hub id",
        "```", "", "HEAD is this directory or its Hugging Face hub id. Dense inputs must come from the same "
        "backbone and model (`mmsparse encode-dense`)."]
    lines += ["", "## Training data", ""]
    files = [(k, tr.get(k)) for k in ("train_images", "train_captions", "val_images", "val_captions") if tr.get(k)]
    lines.append(f"- dataset: {tr.get('dataset') or 'unknown'}")
    lines += [f"- {k.replace('_', ' ')}: `{_name(v)}`" for k, v in files]
    for k in ("images", "patches_per_image", "vocab_min_df", "best_epoch"):  # not seconds: cards are reproducible
        if tr.get(k) is not None:
            lines.append(f"- {k.replace('_', ' ')}: {tr[k]}")
    first = ("R@1", "R@5", "R@10", "MRR@10", "FLOPs")
    val = tr.get("val") or {}
    val = {k: val[k] for k in [*[k for k in first if k in val], *sorted(k for k in val if k not in first)]}
    lines += ["", "## Validation", ""]
    if val:
        lines += [f"Chosen epoch {tr.get('best_epoch', '?')} (by `{(tr.get('config') or {}).get('select_metric', 'R@1')}`):",
                  "", "| " + " | ".join(val) + " |", "|" + "---|" * len(val),
                  "| " + " | ".join(_fmt(v) for v in val.values()) + " |"]
        hist = [h for h in tr.get("history") or [] if isinstance(h, dict) and h.get("val")]
        if hist:
            keys = [k for k in first if k in hist[0]["val"]]
            lines += ["", "Every epoch:", "", "| epoch | loss | " + " | ".join(keys) + " |",
                      "|---|---|" + "---|" * len(keys)]
            lines += [f"| {h.get('epoch', '?')} | {_fmt(h.get('loss', ''))} | "
                      + " | ".join(_fmt(h['val'].get(k, '')) for k in keys) + " |" for h in hist]
    else:
        lines.append("No validation figures were recorded (trained without validation files).")
    cfg = tr.get("config")
    lines += ["", "## Configuration", ""]
    lines += (["The resolved training options (`mmsparse train-head --config` reads this head's config.json):", "",
               "```json", json.dumps(cfg, indent=2, sort_keys=True), "```"] if cfg else ["Not recorded."])
    lines += ["", "## Provenance", "", f"- mmsparse version: {prov.get('mmsparse_version', '?')}"]
    if prov.get("seed") is not None:
        lines.append(f"- seed: {prov['seed']}")
    lines.append(f"- full record: {record}" if record else
                 "- full record: not in this folder (the full export's SparseGates config holds it)")
    return "\n".join(lines) + "\n"
