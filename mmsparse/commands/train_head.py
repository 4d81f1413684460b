"""`mmsparse train-head`: train any method's sparse head (mmsparse.api.training).

The method options are not written out here: every field of every registered method's config
dataclass (mmsparse/methods/*/config.py) becomes a `--flag`, shared fields in one panel and each
method's own fields in its panel, so a new method's options appear without editing this file.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import List, Optional

import typer

from ..methods import get_config_class, method_names
from ..methods.base import TrainConfig, VocabConfig

SHARED_PANELS = {TrainConfig: "Training (every method)", VocabConfig: "Vocabulary (d2s, joint, vdr)"}
TYPES = {"bool": bool, "int": int, "float": float}


def _owner(cls, name: str):
    """The class in cls's MRO that first declares field `name`."""
    for c in reversed(cls.__mro__):
        if name in c.__dict__.get("__annotations__", {}):
            return c
    return cls


def _option_table() -> dict:
    """{field name: {"field", "defaults": {method: default}, "owner": class, "methods": [...],
    "helps": {method: its own help text where it differs from the first method's}}}."""
    table: dict = {}
    for m in method_names():
        cls = get_config_class(m)
        for f in dataclasses.fields(cls):
            e = table.setdefault(f.name, {"field": f, "defaults": {}, "owner": _owner(cls, f.name), "methods": []})
            e["defaults"][m] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            e["methods"].append(m)
            own = f.metadata.get("help", "")
            if own and own != e["field"].metadata.get("help", ""):   # e.g. --target-flops: d2s vs vdr
                e.setdefault("helps", {})[m] = own
    return table


def _help(e: dict) -> str:
    meta = e["field"].metadata
    vals = set(map(repr, e["defaults"].values()))
    if len(vals) == 1:
        dflt = f"default {next(iter(e['defaults'].values()))}"
    else:
        dflt = "default " + ", ".join(f"{m} {d}" for m, d in e["defaults"].items())
    extra = [dflt]
    if meta.get("paper"):
        extra.append(f"paper: {meta['paper']}")
    owner = SHARED_PANELS.get(e["owner"])
    if owner is None and len(e["methods"]) > 1:
        extra.append("methods: " + ", ".join(e["methods"]))
    others = "".join(f" {m}: {h}" for m, h in e.get("helps", {}).items())
    return f"{meta.get('help', '')} ({'; '.join(extra)}){others}"


def _param(name: str, e: dict) -> inspect.Parameter:
    f, meta = e["field"], e["field"].metadata
    kind = str if meta.get("text") else next((t for k, t in TYPES.items() if k in str(f.type)), str)
    flag = meta.get("flag") or "--" + name.replace("_", "-")
    if kind is bool and "/" not in flag:
        flag = f"{flag}/--no-{flag[2:]}"
    panel = SHARED_PANELS.get(e["owner"]) or f"{e['methods'][0].upper()} options"
    opt = typer.Option(None, flag, *meta.get("aliases", ()), help=_help(e), rich_help_panel=panel,
                       show_default=False)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=Optional[kind])


def _run(train_images, train_captions, out, method, preset, val_images, val_captions, qrels, val_qrels, backbone,
         config, set_values, device, threads, restart, keep_checkpoint, **options) -> None:
    from ..api.training import train_head
    from ..cli_ui import RichReporter
    from ..errors import InputError

    given = {}
    for item in set_values or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise InputError(f"--set {item!r}: expected KEY=VALUE, e.g. --set eta=1e-3")
        given[key.strip()] = _value(value)
    given.update({k: v for k, v in options.items() if v is not None})
    train_head(train_images, train_captions, out=out, method=method, val_images=val_images,
               val_captions=val_captions, qrels=qrels, val_qrels=val_qrels, backbone=backbone, config=config,
               device=device, threads=threads, restart=restart, keep_checkpoint=keep_checkpoint,
               preset=preset, progress=RichReporter(), **given)


def _value(text: str):
    """--set values: JSON numbers, booleans and null as such, anything else as a string."""
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _build():
    base = [
        ("train_images", Optional[Path], typer.Argument(None, help="Dense HDF5 of the training images (omit with "
                                                        "--backbone). bm25v: images with patch_states, no captions.")),
        ("train_captions", Optional[Path], typer.Argument(None, help="Dense HDF5 of the training captions, with "
                                                          "`texts` and `image_ids` (or pass --qrels).")),
        ("out", Path, typer.Option(..., "-o", "--out", help="Head directory to write (replaced atomically); "
                                   "OUT.ckpt/ holds the resumable checkpoint while training.")),
        ("method", str, typer.Option("d2s", "--method", help="d2s (D2S, eq. 4-7), inference-free (D2S's image head "
                                     "and a term-weight table for queries), joint (joint sparse-dense self-distillation "
                                     "with the towers' final layers; files of `encode-dense --final-layer-inputs`), vdr "
                                     "(VDR over the towers' final layers, or over token/patch states), dense (the dense "
                                     "baseline VDR is judged against: CLIP's loss on the same final layers and "
                                     "projections), bm25v (BM25-V visual words: a top-k sparse autoencoder on "
                                     "patch_states). Installed: " + ", ".join(method_names()) + ".")),
        ("preset", str, typer.Option("default", "--preset", help="default: every option at its default, the "
                                     "settings that work best on validation (each default's --help names the "
                                     "paper's value beside it); paper: each paper's settings wherever the defaults "
                                     "differ (D2S: 200 epochs, L1 η 1e-3, full vocabulary, no gates, ...). "
                                     "--config and flags override it.")),
        ("val_images", Optional[Path], typer.Option(None, "--val-images", help="Dense HDF5 of validation images: "
                                                    "caption->image retrieval each epoch picks the saved epoch.")),
        ("val_captions", Optional[Path], typer.Option(None, "--val-captions", help="Dense HDF5 of validation captions.")),
        ("qrels", Optional[Path], typer.Option(None, "--qrels", help="Training caption id -> image id (TREC qrels), "
                                               "if the captions file has no `image_ids` dataset.")),
        ("val_qrels", Optional[Path], typer.Option(None, "--val-qrels", help="Validation caption id -> image id.")),
        ("backbone", Optional[str], typer.Option(None, "--backbone", help="Read inputs from $MMSPARSE_WORK (default "
                                                 "./work)/dense/NAME/{train,val}-{images,captions}.h5 and .qrels.")),
        ("config", Optional[Path], typer.Option(None, "--config", help="TOML or JSON file of method options (keys "
                                                "as the flags without dashes), or a head's config.json to train with "
                                                "its config; flags override it.")),
        ("set_values", Optional[List[str]], typer.Option(None, "--set", help="KEY=VALUE option, repeatable "
                                                         "(e.g. --set eta=1e-3); overrides --config.")),
        ("device", str, typer.Option("cpu", "--device", help="cpu, cuda or cuda:N.")),
        ("threads", Optional[int], typer.Option(None, "--threads", min=1, help="torch CPU threads (default: every CPU "
                                               "core this process may use).")),
        ("restart", bool, typer.Option(False, "--restart", help="Ignore an existing OUT.ckpt checkpoint (default: "
                                       "resume from it when its settings and inputs match).")),
        ("keep_checkpoint", bool, typer.Option(False, "--keep-checkpoint", help="Keep OUT.ckpt/ after success.")),
    ]
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=t)
              for n, t, d in base]
    table = _option_table()
    order = [TrainConfig, VocabConfig]
    params += [_param(name, e) for name, e in sorted(table.items(), key=lambda kv: order.index(kv[1]["owner"])
                                                      if kv[1]["owner"] in order else len(order))]

    def main(**kw) -> None:
        """Train a sparse head: D2S by default (dense vectors -> W1, LayerNorm, W2, log(1+ReLU);
        loss eq. 7; probabilistic expansion control), or --method inference-free, joint, vdr, dense,
        bm25v. Options from --preset, then --config, then --set, then flags; the head's config.json
        records the resolved config."""
        _run(**{n: kw.pop(n) for n, _, _ in base}, **kw)

    main.__signature__ = inspect.Signature(params)
    return main


main = _build()
