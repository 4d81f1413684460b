"""`mmsparse index`'s options: one dataclass per engine (mmsparse/indexes/options/), the command's
flags and --help made from their fields, the engine's options recorded in mmsparse.json; Seismic's
k-NN graph and posting share and kANNolo's early exit from the command line (real engines, small
seeded collections)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import scipy.sparse as sp

import mmsparse
from mmsparse.errors import InputError
from mmsparse.formats.sparse import write_sparse
from mmsparse.indexes import open_index
from mmsparse.indexes.options import ALL


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    d = tmp_path_factory.mktemp("opts")
    m = sp.random(300, 200, density=0.05, random_state=1, format="csr", dtype=np.float32)
    write_sparse(d / "d.h5", [f"d{i}" for i in range(300)], m, [f"w{j}" for j in range(200)],
                 {"modality": "image", "head": "h", "query_mode": "doc"})
    return d / "d.h5", m


def test_help_lists_every_field_of_every_engine(run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")   # rich shortens long flags in a narrow terminal
    code, out, _ = run_cli("index", "--help")
    flat = " ".join(out.split())
    assert code == 0
    for cls in ALL:
        for f in dataclasses.fields(cls):
            flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
            assert flag in flat, (cls.__name__, flag)


def test_seismic_knn_graph_and_postings_share_from_the_cli(docs, run_cli, tmp_path):
    src, m = docs
    code, _, err = run_cli("index", src, "-o", tmp_path / "s", "--engine", "seismic", "--seismic-postings-share", 0.05,
                           "--seismic-knn", 5, "--seismic-n-knn", 3)
    assert code == 0, err
    meta = json.loads((tmp_path / "s" / "mmsparse.json").read_text())
    st, opts = meta["settings"], meta["options"]["SeismicOptions"]
    assert st["n_postings"] == 15 and st["knn"] == 5 and st["n_knn"] == 3 and st["engine_version"]
    assert opts["seismic_postings_share"] == 0.05 and opts["seismic_knn"] == 5
    s = open_index(tmp_path / "s")
    assert s.n_knn == 3 and s.index.knn_len > 0 and s.search(m[:3], 3)[0][0][0] == 0
    assert open_index(tmp_path / "s", n_knn=0).n_knn == 0
    code, _, err = run_cli("index", src, "-o", tmp_path / "t", "--engine", "seismic", "--seismic-n-knn", 3)
    assert code == 2 and "--seismic-knn" in err and not (tmp_path / "t").exists()


def test_kannolo_graph_settings_and_early_exit_recorded(docs, run_cli, tmp_path):
    src, m = docs
    code, _, err = run_cli("index", src, "-o", tmp_path / "k", "--engine", "kannolo", "--hnsw-m", 8,
                           "--ef-construction", 40, "--early-exit-threshold", 0.5)
    assert code == 0, err
    meta = json.loads((tmp_path / "k" / "mmsparse.json").read_text())
    assert meta["options"]["KannoloOptions"]["early_exit_threshold"] == 0.5
    assert meta["options"]["HnswOptions"]["hnsw_m"] == 8 and meta["settings"]["ef_construction"] == 40
    s = open_index(tmp_path / "k")
    assert s.early_exit == 0.5 and s.search(m[:1], 3)[0][0][0] == 0


def test_api_refuses_unknown_or_out_of_range_options(docs, tmp_path):
    src, _ = docs
    with pytest.raises(InputError, match="unknown option 'bmp_blok_size'"):
        mmsparse.build_index(src, out=tmp_path / "b", engine="bmp", bmp_blok_size=8)
    with pytest.raises(InputError, match="--bmp-bits 9"):
        mmsparse.build_index(src, out=tmp_path / "b", engine="bmp", bmp_bits=9)
    assert not (tmp_path / "b").exists()
    out = mmsparse.build_index(src, out=tmp_path / "b", engine="bmp", bmp_block_size=16)
    meta = json.loads((out / "mmsparse.json").read_text())
    assert meta["options"] == {"BmpOptions": {"bmp_bits": 8, "bmp_block_size": 16, "bmp_compress_range": False}}
    assert meta["settings"]["engine_version"]
