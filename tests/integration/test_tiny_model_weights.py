"""The tiny model's expert tensors decide its reply, in a real llama-server (one process, no RPC).

tools/make_tiny_m3.py routes the scripted signal through the experts, so the tensors over 10 MiB that an RPC
worker's cache serves (``--expert-ff 2688``) matter to the greedy reply: one of them with other bytes past its
first 4 KiB (what a stale cache entry holds after the GGUF was rewritten in place) and llama-server replies
otherwise. Without that, "same reply as one process" would pass whatever bytes a worker holds. About 30 s.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import gguf
import pytest

import make_tiny_m3 as tiny
from tiny_replies import reply_of, rewrite_past_the_head

LAYERS, EXPERT_FF = 3, 2688


@pytest.fixture(scope="module")
def models(tmp_path_factory, m3_template):
    d = tmp_path_factory.mktemp("tiny-weights")
    kw = dict(template_text=m3_template, layers=LAYERS, expert_ff=EXPERT_FF)
    return (tiny.write_tiny_m3(d / "original.gguf", "m3", **kw)[0],
            tiny.write_tiny_m3(d / "rewritten.gguf", "m3", rewritten=True, **kw)[0])


def test_one_large_expert_tensor_with_other_bytes_changes_the_reply(tmp_path, llamacpp_bin, models):
    original, rewritten = models
    bin_dir = Path(llamacpp_bin)
    big = {t.name for t in gguf.GGUFReader(original).tensors if int(t.n_bytes) > 10 * 1024 * 1024}
    assert {"blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight"} <= big

    reference = reply_of(bin_dir, original, tmp_path / "original.log")
    assert reference == {"content": "", "reasoning": tiny.THOUGHT_CALL,
                         "calls": [("get_weather", tiny.TOOL_ARGUMENTS)]}, reference

    # one routed-expert down projection from the rewritten model: the thought changes, the tool call stays
    down = tmp_path / "one-down.gguf"
    subprocess.run(["cp", "--reflink=never", str(original), str(down)], check=True)
    rewrite_past_the_head(down, "blk.1.ffn_down_exps.weight", rewritten)
    got = reply_of(bin_dir, down, tmp_path / "one-down.log")
    assert got == dict(reference, reasoning=tiny.rewritten_thought("m3")), got

    # one routed-expert up projection zeroed past its first 4 KiB: the script is gone, the decoy is said
    up = tmp_path / "one-up.gguf"
    subprocess.run(["cp", "--reflink=never", str(original), str(up)], check=True)
    rewrite_past_the_head(up, "blk.1.ffn_up_exps.weight")
    got = reply_of(bin_dir, up, tmp_path / "one-up.log")
    assert got == {"content": tiny.DECOY, "reasoning": "", "calls": []}, got

    # the whole rewritten file, as tools/make_tiny_m3.py writes it
    whole = reply_of(bin_dir, rewritten, tmp_path / "rewritten.log")
    assert whole == dict(reference, reasoning=tiny.rewritten_thought("m3")), whole
