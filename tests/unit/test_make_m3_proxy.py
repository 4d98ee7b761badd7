"""tools/make_m3_proxy.py: the M3-shaped proxy tools/gpu-check loads on the GPU machine. The figures it gives
are only worth something if the file has M3's tensors at M3's sizes and types, loads (finite scales), and
its tensors are distinct (the RPC cache keys them by hash); a bad size is refused before anything is written."""
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import make_m3_proxy  # noqa: E402

SMALL = dict(layers=4, dense=1, embd=512, experts=4, expert_ff=256, ff=1024, vocab=1024)
TEMPLATE = "{{ messages[0].content }} M3 template stand-in"


def _fnv(data):
    h = 0xCBF29CE484222325
    for b in data[:4096]:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("proxy") / "proxy.gguf"
    res = make_m3_proxy.write_proxy(path, TEMPLATE, hp=make_m3_proxy.hparams(**SMALL))
    return path, res, gguf.GGUFReader(str(path))


def test_the_default_proxy_has_m3s_real_tensors_and_the_size_asked_for():
    table = {name: (shape, q) for name, shape, q, _ in make_m3_proxy.plan()}
    assert table["token_embd.weight"] == ((6144, 200064), Q.Q4_K)
    assert table["output.weight"] == ((6144, 200064), Q.Q6_K)
    assert table["blk.0.ffn_up.weight"] == ((6144, 12288), Q.Q8_0)          # a dense lead layer
    assert table["blk.3.ffn_gate_exps.weight"] == ((6144, 3072, 128), Q.IQ4_XS)
    assert table["blk.3.ffn_down_exps.weight"] == ((3072, 6144, 128), Q.IQ4_XS)
    assert table["blk.7.attn_q.weight"] == ((6144, 8192), Q.Q8_0)
    assert table["blk.7.indexer.k_proj.weight"] == ((6144, 128), Q.Q8_0)
    assert "blk.8.attn_q.weight" not in table and "blk.2.ffn_gate_exps.weight" not in table
    total = sum(size for *_, size in make_m3_proxy.plan())
    assert 20e9 < total < 25e9


def test_the_written_file_reads_back_with_the_planned_shapes_types_and_keys(small):
    path, res, reader = small
    planned = {name: (shape, q, size) for name, shape, q, size in make_m3_proxy.plan(hp=make_m3_proxy.hparams(**SMALL))}
    got = {t.name: (tuple(int(x) for x in t.shape), t.tensor_type, int(t.n_bytes)) for t in reader.tensors}
    assert got == planned
    assert res["tensors"] == len(planned) and res["bytes"] == path.stat().st_size
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "minimax-m3"
    assert bytes(fields["tokenizer.chat_template"].parts[-1]).decode() == TEMPLATE
    assert int(fields["minimax-m3.block_count"].parts[-1][0]) == 4
    assert int(fields["minimax-m3.leading_dense_block_count"].parts[-1][0]) == 1
    assert (len(fields["tokenizer.ggml.tokens"].data) == SMALL["vocab"]
            == int(fields["minimax-m3.vocab_size"].parts[-1][0]))


def test_every_quantised_block_has_a_finite_small_scale(small):
    _, _, reader = small
    for t in reader.tensors:
        if t.tensor_type == Q.F32:
            assert np.isfinite(np.asarray(t.data)).all()
            continue
        _, bsize = gguf.constants.GGML_QUANT_SIZES[t.tensor_type]
        blocks = np.asarray(t.data).reshape(-1)[: (int(t.n_bytes) // bsize) * bsize].reshape(-1, bsize)
        for off in make_m3_proxy.SCALE_OFFSETS[t.tensor_type]:
            scales = blocks[:, off:off + 2].copy().view("<f2").astype(np.float32)
            assert np.isfinite(scales).all(), t.name
            assert (np.abs(scales) <= make_m3_proxy.SCALE_RANGE[1] * 1.01).all(), t.name


def test_tensors_of_the_same_shape_hold_different_bytes(small):
    _, _, reader = small
    by = {t.name: np.asarray(t.data).tobytes() for t in reader.tensors}
    same = [by["blk.%d.ffn_up_exps.weight" % i] for i in (1, 2, 3)] + [by["blk.1.ffn_gate_exps.weight"]]
    assert len({_fnv(b) for b in same}) == len(same)
    assert len(set(same)) == len(same)


def test_the_same_arguments_give_the_same_bytes(small, tmp_path):
    path, _, _ = small
    again = tmp_path / "again.gguf"
    make_m3_proxy.write_proxy(again, TEMPLATE, hp=make_m3_proxy.hparams(**SMALL))
    assert again.read_bytes() == path.read_bytes()


def _cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "make_m3_proxy.py"), *args], capture_output=True,
                          text=True)


def test_a_size_that_cannot_be_quantised_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "bad.gguf"
    res = _cli(str(out), "--template", "/dev/null", "--embd", "500")
    assert res.returncode == 2
    assert res.stderr.strip() == ("make_m3_proxy: token_embd.weight: row of 500 is not a multiple of Q4_K's block "
                                  "of 256: pick other sizes")
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_proxy_without_moe_layers_is_refused(tmp_path):
    res = _cli(str(tmp_path / "x.gguf"), "--template", "/dev/null", "--layers", "3", "--dense", "3")
    assert res.returncode == 2
    assert "need at least one dense layer and one MoE layer (dense >= 1, layers > dense)" in res.stderr
    assert not list(tmp_path.iterdir())


def test_dry_run_prints_the_sizes_and_writes_nothing(tmp_path):
    out = tmp_path / "p.gguf"
    res = _cli(str(out), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "136 tensors, 22.92 GB; 57 over 10 MiB (22.83 GB)"
    assert "  blk.3 4.032 GB" in res.stdout
    assert not out.exists()


def test_a_vocabulary_too_small_for_m3s_special_tokens_is_refused(tmp_path):
    res = _cli(str(tmp_path / "x.gguf"), "--template", "/dev/null", "--vocab", "100", "--embd", "512", "--experts", "4",
               "--expert-ff", "256", "--ff", "1024")
    assert res.returncode == 2
    assert res.stderr.strip() == "make_m3_proxy: vocab must be at least 297 (the byte and special tokens)"
    assert not list(tmp_path.iterdir())
