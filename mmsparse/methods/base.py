"""The interface every method implements, and the configuration fields they share.

A method is one package under mmsparse/methods/ (d2s, vdr, joint, bm25v) holding:
  config.py   a dataclass of its training options (no torch import: `--help` reads it)
  head.py     its head class (a `SparseHead`: config.json + model.safetensors + vocab.txt)
  method.py   a `Method` subclass: data, batches, loss, validation, resume state, sparsify
The registry (mmsparse/methods/__init__.py) lists the built-ins; `mmsparse.trainer.fit` trains any
of them with one loop. Options are dataclass fields made by `option()`, whose metadata (help,
units, bounds, choices, the paper's setting) the command line turns into `--flags`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Iterator

from ..errors import InputError
from ..options import check_options, option  # noqa: F401 (re-exported: every method's config.py uses option)


@dataclass
class TrainConfig:
    """Options every method's trainer (mmsparse.trainer.fit) uses. `sparsify_options`: the
    method's extra options of sparsify, {name: (default, help[, type when default is None])}
    (here so --help needs no torch)."""

    sparsify_options: ClassVar[dict] = {}
    PAPER: ClassVar[dict] = {}   # `--preset paper`: the fields whose default is not the paper's, at the paper's value

    epochs: int = option(6, "Passes over the training data.", min=1)
    batch_size: int = option(512, "Training examples per optimizer step.", min=1)
    lr: float = option(1e-3, "AdamW peak learning rate.", min=0.0)
    weight_decay: float = option(0.01, "AdamW weight decay.", min=0.0)
    lr_schedule: str = option("linear", "Learning rate after warm-up: linear (to 0 at the last step), cosine "
                              "(to 0) or constant.", choices=("linear", "cosine", "constant"))
    lr_warmup: float = option(0.0, "Linear learning-rate warm-up: optimizer steps (>= 1) or a fraction of all "
                              "steps (< 1).", min=0.0)
    seed: int = option(0, "Seed of initialisation, shuffling and random masks (runs are deterministic).")
    amp: str = option("none", "Mixed precision: none, bf16 (autocast of the forward pass, the matrix products in "
                      "bf16; on CUDA, or on a CPU with AMX or AVX512-BF16, refused elsewhere), or auto (bf16 where "
                      "it is native, else none; the run says which).", choices=("none", "bf16", "auto"))
    select_metric: str = option("R@1", "Validation metric that picks the saved epoch.",
                                choices=("R@1", "R@5", "R@10", "MRR@10"))
    max_val_flops: float | None = option(None, "Only epochs whose validation FLOPs (eq. 1) are <= this may be "
                                         "saved (else the lowest-FLOPs epoch).", min=0.0)

    def validate(self) -> None:
        """InputError naming the first option outside its bounds or choices."""
        check_options(self)


@dataclass
class VocabConfig:
    """Options of methods whose terms are a text vocabulary (d2s, joint, vdr)."""

    vocab_model: str | None = option(None, "Local text model directory (e.g. a BERT masked LM) whose tokenizer and "
                                     "input embeddings give the vocabulary and W2's init. Default: the text "
                                     "tower of the dense files' `model`.")
    vocab_min_df: int = option(0, "Keep only terms in >= N training captions (0 = the whole tokenizer "
                               "vocabulary, the papers' setting).", min=0, paper="0 (full vocabulary)")


PRESETS = ("default", "paper")


def preset_values(config_class: type, preset: str) -> dict:
    """The option values `--preset NAME` sets before a config file and flags: {} for "default"
    (the defaults: what works best on validation), the method's PAPER dict for "paper" (each
    paper's settings). InputError on another name."""
    if preset not in PRESETS:
        raise InputError(f"--preset {preset!r}: choose one of {', '.join(PRESETS)}")
    return dict(config_class.PAPER) if preset == "paper" else {}


def make_config(config_class: type, values: dict, source: str = "options") -> Any:
    """`config_class(**values)` after checking every key is a field (InputError naming the unknown
    key and the valid ones) and every value is within bounds."""
    names = {f.name for f in fields(config_class)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise InputError(f"{source}: unknown option {unknown[0]!r} for this method; known: {', '.join(sorted(names))}")
    cfg = config_class(**values)
    cfg.validate()
    return cfg


@dataclass
class TrainInputs:
    """The files a training run reads. Captions-free methods (bm25v) use only train_images."""

    train_images: Path
    train_captions: Path | None = None
    val_images: Path | None = None
    val_captions: Path | None = None
    qrels: Path | None = None
    val_qrels: Path | None = None


@dataclass
class Sparsified:
    """What a method's sparsify returns: row ids, CSR [N, |V|] float32 weights, caption texts
    (or None), and attributes to record in the sparse file (query mode, top-k, ...)."""

    ids: list
    matrix: Any
    texts: list | None
    attrs: dict


class Method:
    """One learned sparse retrieval method, trained by mmsparse.trainer.fit.

    Class attributes: `name`, `config_class` (a TrainConfig subclass), `head_class`,
    `query_modes` (sparsify modes for captions; the first is the default), `batch_size` (sparsify's
    default rows per pass), `compat_keys` (dense-file attributes that must match the head's
    training files).
    An instance lives for one training run: `__init__(cfg)`, then `setup(inputs)` loads data and
    builds the head; `fit` calls the hooks below. State that must survive an interruption (beyond
    model, optimizer, scheduler and RNG, which fit saves) goes through state_dict/load_state_dict.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type] = TrainConfig
    head_class: ClassVar[type] = object
    query_modes: ClassVar[tuple[str, ...]] = ("expand",)
    batch_size: ClassVar[int] = 1024
    compat_keys: ClassVar[tuple[str, ...]] = ("backbone", "model")
    output: ClassVar[str] = "sparse"   # "dense": sparsify writes the dense HDF5 file OUT itself (methods/dense)

    def __init__(self, cfg):
        self.cfg = cfg
        self.training: dict = {}      # recorded in the head's config.json "training"
        self.fingerprint: dict = {}   # a checkpoint resumes only with the same fingerprint and config

    # -- data and head --------------------------------------------------------------------
    def setup(self, inputs: TrainInputs, progress=None):
        """Read and check the inputs, build a fresh head (seeded). Returns (head, train, val);
        val None without validation files. Records `self.training`: provenance of the inputs
        stored in the head's config, and `self.fingerprint`: what a checkpoint must match."""
        raise NotImplementedError

    def place(self, data, device):
        """`data` (train or val) on `device`; default: data.to(device) where it has one."""
        return data.to(device) if hasattr(data, "to") else data

    def param_groups(self, head) -> list[dict]:
        """AdamW parameter groups (each may set lr, weight_decay); default: one group."""
        return [{"params": [p for p in head.parameters() if p.requires_grad]}]

    def prepare(self, head, train) -> None:
        """Called once before the first epoch of a fresh run (e.g. data-dependent init)."""

    def resumed(self, head) -> None:
        """Called once after a run resumes from a checkpoint (weights and load_state_dict restored):
        put back on the head what its state dict does not hold (e.g. the budget's gates)."""

    def load_epoch(self, head, record: dict) -> None:
        """Called after the saved epoch's weights are loaded, with that epoch's history record: put
        back on the head what the epoch trained with beyond its weights (e.g. the budget's gates)."""

    def steps_per_epoch(self, train) -> int:
        raise NotImplementedError

    def start_epoch(self, epoch: int) -> None:
        """Called before epoch `epoch` (0-based), also when resuming."""

    def batches(self, train, generator, epoch: int) -> Iterator[Any]:
        """One epoch of batches, drawn with `generator` (a CPU torch.Generator)."""
        raise NotImplementedError

    def loss(self, head, batch, step: int, generator, device) -> tuple[Any, dict]:
        """(scalar loss tensor, {name: float} parts to log) of one batch at optimizer step `step`."""
        raise NotImplementedError

    def after_step(self, head) -> None:
        """Called after each optimizer step (e.g. re-normalise a decoder)."""

    def finish(self, head, train, progress=None) -> None:
        """Called once on the CPU after the saved epoch's weights are loaded, before the head is
        written (e.g. cuts estimated on the training data)."""

    def validate(self, head, val) -> dict:
        """Validation figures: at least the select metrics (R@1, ...) and FLOPs; {} = none."""
        return {}

    def end_epoch(self, head, train, val, record: dict) -> None:
        """Called by fit after each epoch's steps with the epoch's history record: validates into
        record["val"] when there is a validation split. Methods may measure or adapt more here
        (e.g. the FLOPs budget of --target-flops, mmsparse.methods.budget)."""
        if val is not None:
            record["val"] = self.validate(head, val)

    def val_flops_limit(self) -> float | None:
        """The most validation FLOPs a saved epoch may have (pick_epoch): --max-val-flops; None = any."""
        return self.cfg.max_val_flops

    supports_path: ClassVar[bool] = False   # train-head --target-flops A,B,C (a budget path)

    def retarget(self, target: float, record: dict) -> None:
        """A budget path's next stage: move to FLOPs budget `target` from the head the last epoch
        (history record `record`, with its "val" figures) left. Only for methods with
        supports_path; InputError otherwise."""
        raise InputError(f"--method {self.name}: no budget path (several --target-flops budgets); give one budget")

    def val_flops_floor(self) -> float | None:
        """The fewest validation FLOPs a saved epoch should have where an epoch has them (pick_epoch):
        the lower edge of a budget's band; None = any."""
        return None

    def sample_figures(self, head, train, n: int = 1000) -> dict:
        """`validate`'s figures of the trained head on a seeded sample of at most `n` training images
        and their captions (at least d_nnz, the terms per image, where the method has them) and
        "images", the sample's size, for a run without validation files; {} when the method has none."""
        return {}

    def epoch_figures(self) -> dict:
        """Extra figures for an epoch's history record (e.g. the expansion probability)."""
        return {}

    def eligible(self, record: dict) -> bool:
        """Whether an epoch may be saved (e.g. not before the sparsity warm-up ends)."""
        return True

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def epoch_line(self, record: dict) -> str:
        """One human-readable line about a finished epoch."""
        v = record.get("val") or {}
        val = f" | val R@1 {v['R@1']:.4f} R@10 {v['R@10']:.4f} FLOPs {v['FLOPs']:.1f}" if "R@1" in v else ""
        return f"epoch {record['epoch']}: loss {record['loss']:.4f}{val} ({record['seconds']:.0f}s)"

    # -- inference ------------------------------------------------------------------------
    @classmethod
    def query_mode(cls, modality: str, query_mode: str | None, path) -> str:
        """The sparsify mode for a file of `modality`: "doc" for images; for captions `query_mode`
        or the default. InputError when it does not apply."""
        if modality == "image":
            if query_mode not in (None, "doc", *cls.query_modes[:1]):
                raise InputError(f"{path}: --query-mode {query_mode} applies to captions; this is an image file")
            return "doc"
        mode = query_mode or (cls.query_modes[0] if cls.query_modes else None)
        if mode not in cls.query_modes:
            raise InputError(f"--query-mode {mode!r}: a {cls.name} head takes {', '.join(cls.query_modes) or 'no queries'}")
        return mode

    @classmethod
    def sparsify(cls, head, head_dir: Path | None, dense: Path, out: Path, mode: str, options: dict,
                 batch_size: int, progress) -> Sparsified:
        """Rows of dense HDF5 `dense` through `head` in `mode` ("doc" or a query mode). `out` is
        where the caller writes the result (for methods with side outputs); `progress` a Reporter."""
        raise NotImplementedError
