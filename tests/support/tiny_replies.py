"""One llama-server process on a tiny model and its greedy reply: what the tests compare a deployment with.

Used by tests/integration/test_tiny_model_weights.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import gguf
import requests

import make_tiny_m3 as tiny

HEAD_BYTES = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def one_process(bin_dir: Path, model: Path, log: Path):
    """llama-server on ``model`` with every layer in its own process; yields its URL; always stopped."""
    port = free_port()
    argv = [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-ngl", "0", "-c", "2048", "-np", "1", "--jinja", "--no-warmup"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, GGML_NO_BACKTRACE="1", LD_LIBRARY_PATH=str(bin_dir)))
    try:
        url = "http://127.0.0.1:%d" % port
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "llama-server exited:\n" + log.read_text(errors="replace")[-3000:]
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "llama-server did not load:\n" + log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def greedy(url: str) -> dict:
    """The chat reply at temperature 0 to the weather question with the weather tool: what a user sees."""
    res = requests.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [tiny.WEATHER_TOOL], "temperature": 0, "max_tokens": 64})
    assert res.status_code == 200, res.text
    msg = res.json()["choices"][0]["message"]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
    return {"content": msg.get("content") or "", "reasoning": msg.get("reasoning_content") or "", "calls": calls}


def reply_of(bin_dir: Path, model: Path, log: Path) -> dict:
    with one_process(bin_dir, model, log) as url:
        return greedy(url)


def rewrite_past_the_head(model: Path, name: str, source: Path | None = None) -> None:
    """Write tensor ``name``'s bytes past its first 4 KiB in place: the same tensor's from ``source`` (another
    file of the same layout), or zeros."""
    t = next(t for t in gguf.GGUFReader(model).tensors if t.name == name)
    offset, size = int(t.data_offset) + HEAD_BYTES, int(t.n_bytes) - HEAD_BYTES
    if source is None:
        data = bytes(size)
    else:
        with open(source, "rb") as handle:
            handle.seek(offset)
            data = handle.read(size)
    with open(model, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
