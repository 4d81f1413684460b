"""Issue 10: a stage SIGKILLed mid-way, then rerun, gives the output of an uninterrupted run.

The kill is deterministic: MMSPARSE_TEST_KILL_AFTER=N makes the stage SIGKILL itself at the N-th
`mmsparse.atomic.kill_point()` (one per batch / training step / build phase). The reference
run writes OUT, which is set aside; the killed run and the rerun use the same command line (so
the recorded `command` matches) and the results are compared byte for byte (train-head: the
weights and vocabulary; config.json up to its training time).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import WORDS, mmsparse_main, write_dense_pair  # shared word list, CLI runner, dense pairs



def cli(*args) -> None:
    """Run `mmsparse ARGS` in this process through the real entry point; assert success."""
    code = mmsparse_main(*args)
    assert not code, f"mmsparse {' '.join(map(str, args))} exited {code}"


def killed(*args, after: int) -> None:
    """Run `mmsparse ARGS` in a subprocess that SIGKILLs itself at kill point `after`."""
    env = {**os.environ, "MMSPARSE_TEST_KILL_AFTER": str(after)}
    p = subprocess.run([sys.executable, "-m", "mmsparse.cli", *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr[-2000:])


def same_files(a: Path, b: Path, skip=()) -> None:
    """Every file under a and b has the same relative name and bytes (except names in `skip`)."""
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file()) if a.is_dir() else None
    if fa is None:
        assert a.read_bytes() == b.read_bytes(), f"{a} != {b}"
        return
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert fa == fb, f"only in {a.name}: {sorted(set(fa) - set(fb))}, only in {b.name}: {sorted(set(fb) - set(fa))}"
    for r in fa:
        if r.name not in skip:
            assert (a / r).read_bytes() == (b / r).read_bytes(), r


def no_temps(d: Path) -> bool:
    return not [p for p in d.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


@pytest.fixture(scope="module")
def small(tmp_path_factory, dual_encoder_dir):
    """Dense test files and a real (untrained) D2S head for sparsify and index."""
    from mmsparse.methods.d2s.head import D2SHead
    from mmsparse.vocab import Vocab

    root = tmp_path_factory.mktemp("kill")
    write_dense_pair(root, dual_encoder_dir, 30, "test")
    torch.manual_seed(0)
    head = D2SHead.from_vocab(32, Vocab(WORDS, torch.randn(len(WORDS), 16), None, "unit"),
                              {"backbone": "hf-dual", "model": str(dual_encoder_dir)})
    head.save_pretrained(root / "head")
    cli("sparsify", root / "head", root / "test-images.h5", "-o", root / "docs.h5")
    return root


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, dual_encoder_dir):
    """Tiny random models so the kill tests don't spend their time loading real ones: a CLIP
    (backbone `clip`) and a BERT with the dual encoder's WordPiece tokenizer (a --vocab-model)."""
    from transformers import (AutoTokenizer, BertConfig, BertModel, BertTokenizer, CLIPConfig, CLIPImageProcessor,
                              CLIPModel)

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("models")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    txt = dict(vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=32, eos_token_id=3)
    vis = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
               image_size=32, patch_size=16)
    CLIPModel(CLIPConfig(text_config=txt, vision_config=vis, projection_dim=8)).save_pretrained(root / "clip")
    BertTokenizer(vocab={w: i for i, w in enumerate(words)}).save_pretrained(root / "clip")
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(root / "clip")
    tok = AutoTokenizer.from_pretrained(str(dual_encoder_dir))
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(root / "bert")
    tok.save_pretrained(root / "bert")
    return root


@pytest.mark.slow  # killed and rerun encodes: ~15 s (tiny CLIP), ~20 s (dual encoder)
@pytest.mark.parametrize("model", ["tiny-clip", "dual-encoder"])
def test_encode_dense_killed_and_rerun(flickr8k_dir, dual_encoder_dir, tiny_models, tmp_path, model):
    """Real Flickr8k images and captions (--limit 4), through a tiny CLIP and the real dual encoder."""
    out, ref = tmp_path / "dense", tmp_path / "ref"
    mod = ["--backbone", "clip", "--model", tiny_models / "clip"] if model == "tiny-clip" else \
        ["--model", dual_encoder_dir]
    args = ["encode-dense", flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", "-o", out,
            *mod, "--split", "test", "--limit", "4", "--batch-size", "2", "--workers", "0"]
    cli(*args)
    out.rename(ref)
    killed(*args, after=4)  # 2 image batches done (images file written), killed in the captions
    assert (out / "test-images.h5").is_file() and not (out / "test-captions.h5").exists()
    assert (out / "test-captions.h5.partial").is_dir()
    cli(*args)
    assert not (out / "test-captions.h5.partial").exists() and no_temps(out)
    same_files(ref, out)


def test_train_head_killed_and_resumed(dual_encoder_dir, tiny_models, tmp_path):
    write_dense_pair(tmp_path, dual_encoder_dir, 48)
    out, ref = tmp_path / "head", tmp_path / "ref"
    args = ["train-head", tmp_path / "train-images.h5", tmp_path / "train-captions.h5", "-o", out,
            "--epochs", "3", "--batch-size", "32", "--seed", "3", "--vocab-model", tiny_models / "bert"]
    cli(*args)
    out.rename(ref)
    killed(*args, after=5)  # 3 steps per epoch: killed in epoch 2, after epoch 1's checkpoint
    assert not out.exists() and (tmp_path / "head.ckpt" / "last.pt").is_file()
    cli(*args)
    assert not (tmp_path / "head.ckpt").exists() and no_temps(tmp_path)
    same_files(ref, out, skip=("config.json",))
    a, b = (json.loads((d / "config.json").read_text()) for d in (ref, out))
    for c in (a, b):
        c["training"].pop("seconds")
        for h in c["training"]["history"]:   # wall-clock per epoch
            h.pop("seconds")
    assert a == b and a["provenance"]["seed"] == 3


def test_sparsify_killed_keeps_previous_output_and_rerun(small, tmp_path):
    out = tmp_path / "q.h5"
    args = ["sparsify", small / "head", small / "test-captions.h5", "-o", out, "--batch-size", "8"]
    cli(*args)
    ref = tmp_path / "ref.h5"
    shutil.copy(out, ref)
    killed(*args, after=3)
    same_files(ref, out)  # the previous complete output is untouched (test_index: or none)
    cli(*args)
    assert no_temps(tmp_path)
    same_files(ref, out)


def test_index_killed_and_rerun(small, tmp_path):
    out, ref = tmp_path / "idx", tmp_path / "ref"
    args = ["index", small / "docs.h5", "-o", out]
    cli(*args)
    out.rename(ref)
    killed(*args, after=2)  # inside the build: the temporary directory exists, the index does not
    assert not out.exists() and not no_temps(tmp_path)
    cli(*args)
    assert no_temps(tmp_path)  # the rerun removed the dead process's temporary directory
    same_files(ref, out, skip=("mmsparse.json",))
    a, b = (json.loads((d / "mmsparse.json").read_text()) for d in (ref, out))
    a.pop("build_seconds"), b.pop("build_seconds")
    assert a == b


@pytest.mark.slow  # ~3 min: 3 interruptions of each stage, each rerun compared with a clean run
def test_fault_injection_reruns_equal_clean_runs(flickr8k_dir, dual_encoder_dir):
    """A small run of mmsparse.bench.faults (`make -C examples/flickr8k faults` runs 50 per stage):
    every stage interrupted by SIGKILL or SIGINT at random points, then finished, equals its clean
    run and leaves nothing behind."""
    from mmsparse.bench import faults

    report = faults.run(list(faults.STAGES), kills=3, seed=1, data=flickr8k_dir, model=dual_encoder_dir,
                        progress=lambda m: None)
    for name, s in report["stages"].items():
        assert s["interruptions"] >= 3, name
        assert not s["failures"], (name, s["failures"])
