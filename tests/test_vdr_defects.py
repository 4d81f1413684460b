"""Issue 52's six defects of VDR and its dense baseline, each checked where it lived: the max pool's
sparse backward builds valid CSR tensors (torch's invariant check on) and survives a second backward;
the text head's random init is never silent; bags of words of another tokenizer than the one that
stored token_ids are refused in one line; docs/vdr.md states what was measured; the dense baseline honours
--weight-decay. Plus the hooks a FLOPs controller uses: k read from the head's config at call time,
and the ungated validation vectors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import mmsparse
from mmsparse.errors import InputError
from mmsparse.formats.dense import read_dense
from mmsparse.methods.vdr.head import DSTHead, VDRHead, elu1p
from mmsparse.vocab import Vocab

from conftest import WORDS
from test_vdr import _write_split

ROOT = Path(__file__).resolve().parents[1]


def _reference(h: DSTHead, x: torch.Tensor, mask) -> torch.Tensor:
    """V(x) of the dense definition (autograd through every position)."""
    u = F.layer_norm(x, (x.shape[-1],)) @ h.proj.weight.T + h.proj.bias
    keep = torch.ones(x.shape[:2], dtype=torch.bool) if mask is None else mask.bool()
    return elu1p(u.masked_fill(~keep.unsqueeze(-1), float("-inf")).amax(1))


def test_max_pool_backward_builds_csr_tensors_torch_accepts(monkeypatch):
    """Defect 1: every CSR tensor of the backward passes torch's check_invariants=True (sorted, distinct
    columns per row), for padded text rows in chunks and for equal-length image rows, and dx, dW
    still equal autograd's."""
    made = []
    plain = torch.sparse_csr_tensor

    def checked(*args, **kwargs):
        made.append(1)
        return plain(*args, **{**kwargs, "check_invariants": True})

    monkeypatch.setattr(torch, "sparse_csr_tensor", checked)
    torch.manual_seed(3)
    for masked in (True, False):
        h = DSTHead(8, 60)
        h.chunk = 2
        x = torch.randn(6, 9, 8, requires_grad=True)
        mask = (torch.rand(6, 9) > 0.3).float() if masked else None
        if mask is not None:
            mask[:, 0] = 1
        g = torch.randn(6, 60) * (torch.rand(6, 60) > 0.3)
        (h(x, mask) * g).sum().backward()
        x2 = x.detach().clone().requires_grad_()
        w = h.proj.weight.detach().clone().requires_grad_()
        h2 = DSTHead(8, 60)
        with torch.no_grad():
            h2.proj.weight.copy_(w)
            h2.proj.bias.copy_(h.proj.bias)
        (_reference(h2, x2, mask) * g).sum().backward()
        assert torch.allclose(x.grad, x2.grad, atol=1e-6)
        assert torch.allclose(h.proj.weight.grad, h2.proj.weight.grad, atol=1e-5)
    assert made   # the backward did build CSR tensors under the check


def test_a_second_backward_works_or_is_refused():
    """Defect 2: with retain_graph the second backward gives the first one's gradients again (it
    returned dx = 0 and no dW); without it, torch refuses it."""
    torch.manual_seed(4)
    h = DSTHead(8, 40)
    x = torch.randn(4, 5, 8, requires_grad=True)
    out = (h(x) * torch.randn(4, 40)).sum()
    gx1, gw1 = torch.autograd.grad(out, (x, h.proj.weight), retain_graph=True)
    gx2, gw2 = torch.autograd.grad(out, (x, h.proj.weight))
    assert float(gx1.abs().sum()) > 0 and torch.equal(gx1, gx2) and torch.equal(gw1, gw2)
    out = (h(x) * torch.randn(4, 40)).sum()
    out.backward()
    with pytest.raises(RuntimeError, match="second time"):
        out.backward()


def test_a_text_head_without_the_embeddings_init_says_so(capsys):
    """Defect 3: a text tower narrower or wider than the vocabulary's embeddings starts random, with
    a one-line warning and config text_init "random"; equal widths start from the embeddings."""
    terms = [f"t{i}" for i in range(20)]
    voc = Vocab(terms, torch.randn(20, 16), None, "tiny-model")
    head = VDRHead.from_vocab(voc, 8, 16, 12, "token_states", "patch_states")
    assert head.config["text_init"] == "embeddings" and capsys.readouterr().err == ""
    assert torch.equal(head.text.proj.weight.detach(), voc.embeddings)
    head = VDRHead.from_vocab(voc, 8, 24, 12, "token_states", "patch_states")
    err = capsys.readouterr().err.strip().splitlines()
    assert head.config["text_init"] == "random"
    assert len(err) == 1 and "random" in err[0] and "h=24" in err[0] and "ω=16" in err[0] and "--vocab-model" in err[0]


@pytest.fixture(scope="module")
def other_tokenizer_files(tmp_path_factory, dual_encoder_dir):
    """Caption files whose token_ids are the backbone's (BERT WordPiece), and a --vocab-model with
    another tokenizer: the same words at other ids (a real BertTokenizer over a word list)."""
    from transformers import AutoTokenizer, BertConfig, BertModel, BertTokenizer
    root = tmp_path_factory.mktemp("vdr-tok")
    tok = AutoTokenizer.from_pretrained(str(dual_encoder_dir))
    _write_split(root, "train", 30, dual_encoder_dir, tok, 0)
    _write_split(root, "val", 8, dual_encoder_dir, tok, 1)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "zebra", *reversed(WORDS)]
    (root / "vocab.txt").write_text("\n".join(words) + "\n")
    other = BertTokenizer(str(root / "vocab.txt"))
    model = root / "other-model"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=37)).save_pretrained(str(model))
    other.save_pretrained(str(model))
    assert tok.convert_tokens_to_ids("dog") != other.convert_tokens_to_ids("dog")
    return root, model


def test_bags_of_words_of_another_tokenizer_are_refused(other_tokenizer_files, dual_encoder_dir, run_cli):
    """Defect 4 (as CHANGELOG states it): under a --vocab-model with another tokenizer than the one
    the caption files' token_ids come from, training is refused in one line (exit 2, no head), not
    run on texts re-tokenised in silence; caption_token_sets refuses those ids for the other
    tokenizer and keeps them (its own) for the backbone's."""
    from mmsparse.methods.vdr.data import caption_token_sets
    from transformers import AutoTokenizer
    root, model = other_tokenizer_files
    head = root / "head"
    code, _, err = run_cli("train-head", root / "train-images.h5", root / "train-captions.h5", "-o", head,
                           "--method", "vdr", "--epochs", "1", "--vocab-model", model, "--batch-size", "16",
                           "--vdr-train-k", "4", "--vdr-query-k", "3", "--vdr-doc-k", "5")
    errors = [ln for ln in err.splitlines() if ln.startswith("mmsparse: error")]
    assert code == 2 and len(errors) == 1, err
    assert "token_ids are another tokenizer's" in errors[0] and "--vocab-model" in errors[0]
    assert not head.exists()
    other = AutoTokenizer.from_pretrained(str(model))
    with pytest.raises(InputError, match="another tokenizer's"):
        caption_token_sets(root / "val-captions.h5", other, set(other.all_special_ids))
    dual = AutoTokenizer.from_pretrained(str(dual_encoder_dir))
    ids = caption_token_sets(root / "val-captions.h5", dual, set(dual.all_special_ids))
    texts = read_dense(root / "val-captions.h5").texts
    assert [sorted(dual.convert_ids_to_tokens(a.tolist())) for a in ids] == [sorted(set(t.split())) for t in texts]


def test_docs_state_what_was_measured():
    """Defect 5: docs/vdr.md's mask sentence agrees with its own FLOPs, the bag-of-words entry is
    said to be scored against the contrast-masked image vectors, the paper's vocabulary is 29,522."""
    text = (ROOT / "docs" / "vdr.md").read_text()
    assert "it lowers FLOPs" not in text and "30,522 BERT terms" not in text
    assert "29,522" in text
    row = next(line for line in text.splitlines() if line.startswith("| SCE of"))
    assert "contrast-masked" in row and "same (" not in row


@pytest.fixture(scope="module")
def final_states(tmp_path_factory, flickr8k_dir, dual_encoder_dir):
    """val: the first 6 Flickr8k images and their 30 captions with final-layer inputs."""
    root = tmp_path_factory.mktemp("dense-wd")
    mmsparse.encode_dense(flickr8k_dir / "dataset_flickr8k.json", flickr8k_dir / "images", out=root / "dense",
                          model=dual_encoder_dir, split=["val"], limit=6, workers=0, final_layer_inputs=True)
    return root, root / "dense"


def test_dense_baseline_honours_weight_decay(final_states):
    """Defect 6: --weight-decay reaches the projections (it was 0 in every group): the same run with
    a large decay ends with smaller projection weights, and the optimizer's group holds it."""
    from safetensors.torch import load_file
    from mmsparse.methods.base import TrainInputs
    from mmsparse.methods.dense.config import DenseConfig
    from mmsparse.methods.dense.method import Dense
    from mmsparse.trainer import make_optimizer

    root, dense = final_states
    norms = {}
    for wd in (0.0, 0.5):
        out = mmsparse.train_head(dense / "val-images.h5", dense / "val-captions.h5", out=root / f"wd{wd}",
                                  method="dense", epochs=1, batch_size=10, lr=1e-2, weight_decay=wd)
        w = load_file(str(out / "model.safetensors"))
        norms[wd] = float(w["image_proj.weight"].norm() + w["text_proj.weight"].norm())
    assert norms[0.5] < norms[0.0] * 0.999
    cfg = DenseConfig(weight_decay=0.3)
    method = Dense(cfg)
    head, _, _ = method.setup(TrainInputs(dense / "val-images.h5", dense / "val-captions.h5"))
    opt = make_optimizer(method.param_groups(head), cfg.lr, cfg.weight_decay)
    proj = {id(p) for p in head.proj_params()}
    assert [g["weight_decay"] for g in opt.param_groups if {id(p) for p in g["params"]} & proj] == [0.3]
