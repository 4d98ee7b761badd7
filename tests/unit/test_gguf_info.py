"""gguf_info and module_utils/minimax_spark_gguf: the GGUF facts the roles rely on."""
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from ansible.module_utils.minimax_spark_gguf import (
    GGUFError,
    GGUFKeyError,
    GGUFNotFoundError,
    NotAGGUFError,
    open_gguf,
    read_chat_template,
    split_name_info,
    split_shard_paths,
)

import gguf_info
from helpers import run_module

ARCH = "minimax-m3"


def write_model(path, arch=ARCH, template="{{ messages }}", experts=8, split_max_tensors=0, n_tensors=1):
    """A small MiniMax-M3-shaped GGUF (split into one tensor per shard with split_max_tensors=1)."""
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    writer.add_uint32(arch + ".block_count", 5)
    writer.add_uint32(arch + ".context_length", 196608)
    if experts is not None:
        writer.add_uint32(arch + ".expert_count", experts)
    writer.add_float32(arch + ".attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_bool(arch + ".expert_weights_norm", True)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["]~!b[", "[e~[", "a"])
    writer.add_array("tokenizer.ggml.token_type", [3, 3, 1])
    if template is not None:
        writer.add_string("tokenizer.chat_template", template)
    for i in range(n_tensors):
        writer.add_tensor("blk.%d.attn_norm.weight" % i, np.full((16,), i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


@pytest.fixture
def split_model(tmp_path):
    """A model split in three shards, named the way llama.cpp names them."""
    write_model(tmp_path / "MiniMax-M3-tiny.gguf", split_max_tensors=1, n_tensors=3)
    shards = sorted(tmp_path.glob("MiniMax-M3-tiny-*.gguf"))
    assert [p.name for p in shards] == ["MiniMax-M3-tiny-%05d-of-00003.gguf" % i for i in (1, 2, 3)]
    return shards


# ------------------------------------------------------------------------------------------------
# the module
# ------------------------------------------------------------------------------------------------


def test_single_file_facts(tmp_path):
    path = write_model(tmp_path / "model.gguf")
    result = run_module(gguf_info.main, dict(path=str(path)))
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["architecture"] == "minimax-m3"
    assert result["block_count"] == 5
    assert result["context_length"] == 196608
    assert result["expert_count"] == 8
    assert result["split_count"] == 1 and result["split_no"] == 0
    assert result["shards"] == [str(path)]
    assert result["tensor_count"] == 1
    assert result["file_size"] == path.stat().st_size
    assert result["has_chat_template"] is True


def test_dense_model_without_template(tmp_path):
    path = write_model(tmp_path / "model.gguf", template=None, experts=None)
    result = run_module(gguf_info.main, dict(src=str(path)))  # src is an alias of path
    assert not result.get("failed")
    assert result["has_chat_template"] is False
    assert result["expert_count"] is None


def test_split_model_facts_from_shard_one(split_model):
    result = run_module(gguf_info.main, dict(path=str(split_model[0])))
    assert not result.get("failed"), result
    assert result["split_count"] == 3 and result["split_no"] == 0
    assert result["shards"] == [str(p) for p in split_model]
    assert result["tensor_count"] == 3
    assert result["file_size"] == sum(p.stat().st_size for p in split_model)
    assert result["block_count"] == 5 and result["has_chat_template"] is True


def test_other_shard_is_refused(split_model):
    result = run_module(gguf_info.main, dict(path=str(split_model[1])))
    assert result.get("failed")
    assert "shard 2 of 3" in result["msg"]
    assert "00001-of-00003.gguf" in result["msg"]


def test_missing_shard_is_reported(split_model):
    split_model[2].unlink()
    result = run_module(gguf_info.main, dict(path=str(split_model[0])))
    assert result.get("failed")
    assert "1 are missing" in result["msg"] and split_model[2].name in result["msg"]


def test_renamed_shard_one_is_refused(split_model, tmp_path):
    renamed = tmp_path / "model.gguf"
    shutil.copy(split_model[0], renamed)
    result = run_module(gguf_info.main, dict(path=str(renamed)))
    assert result.get("failed")
    assert "original name" in result["msg"] and "-00001-of-00003.gguf" in result["msg"]


def test_missing_file(tmp_path):
    result = run_module(gguf_info.main, dict(path=str(tmp_path / "absent.gguf")))
    assert result.get("failed") and "absent.gguf does not exist" in result["msg"]
    # model_download tells a file that is not there (is_file false) from one that is no usable model
    assert result["is_file"] is False


def test_directory_is_not_a_model(tmp_path):
    result = run_module(gguf_info.main, dict(path=str(tmp_path)))
    assert result.get("failed") and "not a regular file" in result["msg"] and result["is_file"] is False


@pytest.mark.parametrize("content", [b"", b"GG", b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n"])
def test_not_a_gguf(tmp_path, content):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    result = run_module(gguf_info.main, dict(path=str(path)))
    assert result.get("failed") and "is not a GGUF file" in result["msg"]


def test_truncated_gguf(tmp_path):
    good = write_model(tmp_path / "model.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:100])
    result = run_module(gguf_info.main, dict(path=str(cut)))
    assert result.get("failed") and "truncated" in result["msg"] and result["is_file"] is True


def test_missing_block_count_fails(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), ARCH)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = run_module(gguf_info.main, dict(path=str(tmp_path / "m.gguf")))
    assert result.get("failed") and "minimax-m3.block_count" in result["msg"]


def test_check_mode_reports_the_same(tmp_path):
    path = write_model(tmp_path / "model.gguf")
    normal = run_module(gguf_info.main, dict(path=str(path)))
    checked = run_module(gguf_info.main, dict(path=str(path)), check_mode=True)
    assert not checked.get("failed") and checked == normal


# ------------------------------------------------------------------------------------------------
# module_utils/minimax_spark_gguf
# ------------------------------------------------------------------------------------------------


def test_metadata_values_are_plain_python(tmp_path):
    meta = open_gguf(write_model(tmp_path / "model.gguf", template="T\u00e9"))
    assert meta.architecture == "minimax-m3"
    assert meta.get("minimax-m3.block_count") == 5 and isinstance(meta.get("minimax-m3.block_count"), int)
    assert meta.get("minimax-m3.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert meta.get("minimax-m3.expert_weights_norm") is True
    assert meta.get("tokenizer.ggml.tokens") == ["]~!b[", "[e~[", "a"]
    assert meta.get("tokenizer.ggml.token_type") == [3, 3, 1]
    assert meta.value_type("tokenizer.ggml.tokens") == "ARRAY[STRING]"
    assert meta.value_type("minimax-m3.block_count") == "UINT32"
    assert meta.chat_template == "T\u00e9"
    assert meta.chat_template_bytes == "T\u00e9".encode()
    assert read_chat_template(meta.path) == "T\u00e9".encode()
    assert "general.architecture" in meta.keys() and "GGUF.version" not in meta.keys()
    assert meta.get("no.such.key", None) is None


def test_missing_key_error_names_key_and_file(tmp_path):
    path = write_model(tmp_path / "model.gguf", template=None)
    meta = open_gguf(path)
    with pytest.raises(GGUFKeyError) as info:
        meta.get("minimax-m3.rope.freq_base")
    assert "minimax-m3.rope.freq_base" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(GGUFKeyError, match="tokenizer.chat_template"):
        meta.chat_template  # noqa: B018  (reading the property is what raises)
    with pytest.raises(GGUFError, match="not a string"):
        meta.get_bytes("minimax-m3.block_count")


def test_template_missing_from_other_shard_says_so(split_model):
    with pytest.raises(GGUFKeyError, match="shard 2 of 3; metadata lives in shard 1"):
        read_chat_template(split_model[1])


def test_error_classes(tmp_path):
    with pytest.raises(GGUFNotFoundError):
        open_gguf(tmp_path / "nope.gguf")
    (tmp_path / "x.gguf").write_text("hello")
    with pytest.raises(NotAGGUFError):
        open_gguf(tmp_path / "x.gguf")
    assert issubclass(GGUFNotFoundError, GGUFError) and issubclass(NotAGGUFError, GGUFError)


def test_split_names():
    assert split_name_info("/m/MiniMax-M3-UD-IQ4_XS-00001-of-00006.gguf") == ("/m/MiniMax-M3-UD-IQ4_XS", 1, 6)
    assert split_name_info("/m/model.gguf") is None
    assert split_shard_paths("/m/a-00001-of-00002.gguf", 2) == ["/m/a-00001-of-00002.gguf", "/m/a-00002-of-00002.gguf"]
    assert split_shard_paths("/m/model.gguf", 1) == ["/m/model.gguf"]
    with pytest.raises(GGUFError, match="original name"):
        split_shard_paths("/m/a-00001-of-00003.gguf", 2)
    with pytest.raises(GGUFError, match="original name"):
        split_shard_paths(os.path.join("/m", "a-00002-of-00002.gguf"), 2)


# ------------------------------------------------------------------------------------------------
# sizes: layer bytes across shards, non-layer tensors, KV bytes per token (what the plan needs)
# ------------------------------------------------------------------------------------------------
import sparse_m3  # noqa: E402  (tests/support)


@pytest.fixture(scope="module")
def sparse_iq4(tmp_path_factory):
    """UD-IQ4_XS at the real scale: 6 sparse shards, ~208 GB apparent, a few KB on disk."""
    return sparse_m3.write_sparse_model(tmp_path_factory.mktemp("m3"), "UD-IQ4_XS")


def test_sizes_of_the_real_scale_model(sparse_iq4):
    result = run_module(gguf_info.main,
                        dict(path=str(sparse_iq4), sizes=True, cache_type_k="q8_0", cache_type_v="q8_0"))
    assert not result.get("failed"), result
    assert result["split_count"] == 6 and len(result["layer_bytes"]) == 60
    assert 207e9 < result["file_size"] < 209e9
    on_disk = sum(os.stat(p).st_blocks * 512 for p in result["shards"])
    assert on_disk < 10 * 2**20  # sparse: nothing written but headers
    assert set(result["non_layer_bytes"]) == {"token_embd.weight", "output.weight", "output_norm.weight"}
    assert result["tensor_bytes"] == sum(result["layer_bytes"]) + sum(result["non_layer_bytes"].values())
    assert result["file_size"] - result["tensor_bytes"] < 2**20  # headers and padding
    assert result["layer_bytes"][0] < result["layer_bytes"][3]  # dense lead layers are small
    assert result["n_vocab"] == 200064
    kv = result["kv_bytes_per_token"]
    # 60 layers x 4 KV heads x 128 (K and V) in q8_0 (34 bytes per 32) + 57 MSA layers x (128 + 128)
    assert kv["main"] == 60 * 2 * 512 * 34 // 32 == 65280
    assert kv["indexer"] == 57 * 2 * 128 * 34 // 32 == 15504
    assert kv["total"] == 80784 and kv["per_layer"][:4] == [1088, 1088, 1088, 1360]


def test_kv_bytes_follow_the_cache_types(sparse_iq4):
    f16 = run_module(gguf_info.main, dict(path=str(sparse_iq4), sizes=True))["kv_bytes_per_token"]
    assert (f16["main"], f16["indexer"], f16["total"]) == (122880, 29184, 152064)
    mixed = run_module(gguf_info.main, dict(path=str(sparse_iq4), sizes=True, cache_type_k="q8_0"))
    assert mixed["kv_bytes_per_token"]["total"] == (60 * 512 + 57 * 128) * 34 // 32 + (60 * 512 + 57 * 128) * 2


def test_unknown_cache_type_fails_at_validation(sparse_iq4):
    result = run_module(gguf_info.main, dict(path=str(sparse_iq4), sizes=True, cache_type_k="q3_k"))
    assert result.get("failed") and "cache_type_k" in result["msg"] and "q8_0" in result["msg"]


def test_truncated_shard_is_named(tmp_path):
    first = sparse_m3.write_sparse_model(tmp_path, "UD-IQ3_XXS")
    third = first.parent / first.name.replace("00001-of", "00003-of")
    with open(third, "r+b") as handle:
        handle.truncate(third.stat().st_size - 4096)
    result = run_module(gguf_info.main, dict(path=str(first), sizes=True))
    assert result.get("failed")
    assert third.name in result["msg"] and ("truncated" in result["msg"])


def test_sizes_without_sizes_flag_are_not_read(sparse_iq4):
    result = run_module(gguf_info.main, dict(path=str(sparse_iq4)))
    assert "layer_bytes" not in result and result["block_count"] == 60


def test_m3_without_indexer_keys_says_regenerate(tmp_path):
    path = write_model(tmp_path / "old.gguf")  # no attention.indexer.* keys, no layer tensors for 5 blocks
    result = run_module(gguf_info.main, dict(path=str(path), sizes=True))
    assert result.get("failed")
    assert "do not match block_count=5" in result["msg"]
