"""Tool calls end to end: scripted tiny MiniMax-M3 models through a real llama-server head and a
real ggml-rpc-server worker on 127.0.0.1, with the project's serving flags.

The models come from tools/make_tiny_m3.py: at temperature 0 they write a short thought and one
``get_weather(city="Paris")`` call (in the native M3 format or the M2-style hybrid format), and
after a tool result a plain answer. What is checked is what a user of the API relies on:
structured ``tool_calls``, reasoning kept out of ``content``, the right llama.cpp parser, a
multi-turn conversation that renders, and the silent failure when model and template disagree.
"""
import contextlib
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests
from ansible.module_utils.minimax_spark_template import make_hybrid

import make_tiny_m3 as tiny

N_LAYERS = 4
#: -ngl counts the output layer: 3 = output + blk.2 + blk.3 on the worker (RPC0); blk.0 and blk.1
#: stay on the head's CPU, which is not a device of its own.
N_GPU_LAYERS = 3
CTX = 4096
START_TIMEOUT = 90.0
REQUEST_TIMEOUT = 120.0

USER_QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def _rpc_server_binary(bin_dir: Path) -> Path:
    for name in ("ggml-rpc-server", "rpc-server"):  # renamed in June 2026
        if (bin_dir / name).is_file():
            return bin_dir / name
    raise AssertionError(f"no ggml-rpc-server in {bin_dir}")


class Served:
    """A llama-server head with one RPC worker; ``log`` is the head's log file."""

    def __init__(self, base_url: str, log: Path, worker_log: Path, rpc_endpoint: str):
        self.base_url = base_url
        self.log = log
        self.worker_log = worker_log
        self.rpc_endpoint = rpc_endpoint

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout: float = 10.0) -> re.Match:
        """The head logs through a background thread: poll for a line."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.log_text(), re.MULTILINE)
            if m or time.monotonic() > deadline:
                assert m, f"{pattern!r} not in the server log:\n{_tail(self.log)}"
                return m
            time.sleep(0.1)

    def chat(self, messages, **extra) -> requests.Response:
        payload = {"messages": messages, "tools": [tiny.WEATHER_TOOL], "temperature": 0, **extra}
        return requests.post(f"{self.base_url}/v1/chat/completions", json=payload, timeout=REQUEST_TIMEOUT)


@contextlib.contextmanager
def serve(bin_dir: Path, model: Path, template_file: Path, workdir: Path):
    """Start a worker, then a head that offloads part of the layers to it; always stop both."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GGML_NO_BACKTRACE="1")  # no gdb attach if something aborts
    rpc_port, http_port = free_port(), free_port()
    worker_log, head_log = workdir / "rpc-server.log", workdir / "llama-server.log"
    procs = []
    try:
        with open(worker_log, "wb") as out:
            worker = subprocess.Popen(
                [str(_rpc_server_binary(bin_dir)), "-H", "127.0.0.1", "-p", str(rpc_port), "-t", "1"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )
        procs.append(worker)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert worker.poll() is None, f"ggml-rpc-server exited:\n{_tail(worker_log)}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", rpc_port)) == 0:
                    break
            assert time.monotonic() < deadline, f"ggml-rpc-server did not listen:\n{_tail(worker_log)}"
            time.sleep(0.1)

        argv = [
            str(bin_dir / "llama-server"), "-m", str(model),
            "--host", "127.0.0.1", "--port", str(http_port),
            "--rpc", f"127.0.0.1:{rpc_port}", "-ngl", str(N_GPU_LAYERS),
            "-fa", "on", "--parallel", "1", "-ctk", "q8_0", "-ctv", "q8_0",
            "--jinja", "--chat-template-file", str(template_file),
            "-c", str(CTX),
            # 5 (debug): the per-layer "assigned to device" lines; 4 (trace) has "chat format:"
            "--verbosity", "5",
        ]
        with open(head_log, "wb") as out:
            head = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(env, OMP_WAIT_POLICY="PASSIVE"),  # head and worker share the cores
            )
        procs.insert(0, head)  # stop the head before its worker: a lost worker aborts the head
        base = f"http://127.0.0.1:{http_port}"
        while True:
            assert head.poll() is None, f"llama-server exited ({head.returncode}):\n{_tail(head_log)}"
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"llama-server not ready:\n{_tail(head_log)}"
            time.sleep(0.1)
        yield Served(base, head_log, worker_log, f"127.0.0.1:{rpc_port}")
    finally:
        for proc in procs:
            _stop(proc)


# --- models, templates, servers -----------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tool_calls")


@pytest.fixture(scope="module")
def native_template_file(workdir: Path, m3_template: str) -> Path:
    path = workdir / "MiniMax-M3.jinja"
    path.write_text(m3_template)
    return path


@pytest.fixture(scope="module")
def hybrid_template_file(workdir: Path, m3_template: str) -> Path:
    path = workdir / "MiniMax-M3-hybrid.jinja"
    path.write_text(make_hybrid(m3_template))
    return path


@pytest.fixture(scope="module")
def m3_model(workdir: Path, m3_template: str) -> Path:
    return tiny.write_tiny_m3(workdir / "tiny-m3.gguf", "m3", template_text=m3_template, layers=N_LAYERS)[0]


@pytest.fixture(scope="module")
def hybrid_model(workdir: Path, m3_template: str) -> Path:
    return tiny.write_tiny_m3(workdir / "tiny-hybrid.gguf", "hybrid", template_text=m3_template, layers=N_LAYERS)[0]


@pytest.fixture(scope="module")
def native_server(llamacpp_bin, m3_model, native_template_file, workdir):
    """M3-format model, native M3 template: what the project's auto mode serves for real M3."""
    with serve(Path(llamacpp_bin), m3_model, native_template_file, workdir / "native") as served:
        yield served


@pytest.fixture(scope="module")
def hybrid_server(llamacpp_bin, hybrid_model, hybrid_template_file, workdir):
    """Hybrid-format model, hybrid template (M3 template with M2's tool-call block)."""
    with serve(Path(llamacpp_bin), hybrid_model, hybrid_template_file, workdir / "hybrid") as served:
        yield served


@pytest.fixture(scope="module")
def mismatch_server(llamacpp_bin, m3_model, hybrid_template_file, workdir):
    """M3-format model served with the hybrid template: the mismatch auto mode prevents."""
    with serve(Path(llamacpp_bin), m3_model, hybrid_template_file, workdir / "mismatch") as served:
        yield served


@pytest.fixture(scope="module")
def split_server(llamacpp_bin, workdir, m3_template, native_template_file):
    """The M3-format model written as 3 shards, loaded from shard 1."""
    shards = tiny.write_tiny_m3(workdir / "split" / "tiny-m3.gguf", "m3", template_text=m3_template,
                                layers=N_LAYERS, split=3)
    with serve(Path(llamacpp_bin), shards[0], native_template_file, workdir / "split-served") as served:
        yield served


@pytest.fixture(params=["native", "hybrid"])
def matched_server(request):
    return request.getfixturevalue(f"{request.param}_server")


# --- checks -------------------------------------------------------------------------------------

def _message(resp: requests.Response) -> dict:
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return dict(choice["message"], finish_reason=choice["finish_reason"])


def assert_weather_call(msg: dict) -> None:
    assert msg["finish_reason"] == "tool_calls"
    calls = msg.get("tool_calls") or []
    assert len(calls) == 1, msg
    assert calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == tiny.TOOL_NAME
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0].get("id")
    # the thought is reasoning, kept out of content; no markup leaks into content
    assert msg["reasoning_content"] == tiny.THOUGHT_CALL
    content = msg.get("content") or ""
    for markup in ("<mm:think>", "</mm:think>", "]<]minimax[>[", "<invoke", "<minimax:tool_call>"):
        assert markup not in content, msg
    assert content.strip() == ""


def layer_devices(log: str) -> dict:
    """Layer -> device from the last model load in the log (the server first probes a fit)."""
    devices = {}
    for m in re.finditer(r"load_tensors: layer +(\d+) assigned to device (\S+?),", log):
        layer = int(m.group(1))
        if layer == 0:
            devices = {}
        devices[layer] = m.group(2)
    return devices


@pytest.mark.parametrize("which", ["native", "hybrid"])
def test_layers_are_split_between_head_and_worker(request, which):
    served = request.getfixturevalue(f"{which}_server")
    log = served.log_text()
    devices = layer_devices(log)
    # N_LAYERS repeating layers plus the output layer (index N_LAYERS)
    assert sorted(devices) == list(range(N_LAYERS + 1)), log
    repeating = [devices[i] for i in range(N_LAYERS)]
    assert "CPU" in repeating and "RPC0" in repeating, devices
    assert devices == {0: "CPU", 1: "CPU", 2: "RPC0", 3: "RPC0", 4: "RPC0"}
    assert f"offloaded {N_GPU_LAYERS}/{N_LAYERS + 1} layers to GPU" in log
    # both hold weights: the head's CPU buffer and the worker's RPC0 buffer are not empty
    sizes = dict(re.findall(r"load_tensors: +(\S+?)(?:\[[^\]]*\])? model buffer size = +([\d.]+) MiB", log))
    assert float(sizes["CPU_Mapped"]) > 0 and float(sizes["RPC0"]) > 0, sizes
    assert re.search(r"RPC0\[" + re.escape(served.rpc_endpoint) + r"\] model buffer size", log)
    assert "Accepted client connection" in served.worker_log.read_text()
    # one slot: the M3 graph runs its sparse attention (MSA), not the silent dense fallback
    assert "DENSE attention" not in log


def test_native_template_and_m3_model_give_structured_tool_calls(native_server):
    """(a) The native M3 template makes llama.cpp pick its M3 parser, which turns the model's
    ]<]minimax[>[ tool-call block into structured tool_calls."""
    msg = _message(native_server.chat([USER_QUESTION]))
    assert_weather_call(msg)
    native_server.wait_for_log(r"chat format: peg-minimax-m3$")


def test_hybrid_template_and_hybrid_model_give_structured_tool_calls(hybrid_server):
    """(b) The hybrid template falls through to llama.cpp's generic (autoparser) format, which
    parses the M2-style <minimax:tool_call> block."""
    msg = _message(hybrid_server.chat([USER_QUESTION]))
    assert_weather_call(msg)
    hybrid_server.wait_for_log(r"chat format: peg-native$")
    assert "chat format: peg-minimax-m3" not in hybrid_server.log_text()


def test_multi_turn_with_a_tool_result_renders_and_answers(matched_server):
    """(c) user -> assistant tool call -> tool result: the template renders the whole history and
    the model, seeing the result, answers in text instead of calling the tool again."""
    first = _message(matched_server.chat([USER_QUESTION]))
    call = first["tool_calls"][0]
    history = [
        USER_QUESTION,
        {
            "role": "assistant",
            "content": first.get("content") or "",
            "reasoning_content": first["reasoning_content"],
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"forecast": "sunny", "temperature_c": 24})},
    ]
    msg = _message(matched_server.chat(history))
    assert msg["finish_reason"] == "stop"
    assert not msg.get("tool_calls")
    assert msg["content"] == tiny.ANSWER
    assert msg["reasoning_content"] == tiny.THOUGHT_ANSWER
    # the rendered prompt held the earlier call and the result
    prompt = requests.post(
        f"{matched_server.base_url}/apply-template",
        json={"messages": history, "tools": [tiny.WEATHER_TOOL]}, timeout=REQUEST_TIMEOUT,
    )
    assert prompt.status_code == 200, prompt.text
    rendered = prompt.json()["prompt"]
    assert '<invoke name="get_weather">' in rendered
    assert '<response>{"forecast": "sunny", "temperature_c": 24}</response>' in rendered


def test_split_model_loads_from_shard_one_and_calls_tools(split_server):
    """A multi-shard model (what real M3 GGUFs are) loads from shard 1 and behaves the same."""
    assert_weather_call(_message(split_server.chat([USER_QUESTION])))
    log = split_server.log_text()
    assert re.search(r"additional 2 GGUFs metadata loaded", log), _tail(split_server.log)
    assert layer_devices(log) == {0: "CPU", 1: "CPU", 2: "RPC0", 3: "RPC0", 4: "RPC0"}


def test_m3_model_with_hybrid_template_returns_no_tool_calls(mismatch_server):
    """(d) The failure the project exists to prevent: a model writing native M3 tool calls, served
    with a template whose tool-call syntax differs, answers HTTP 200 with no tool_calls and the
    raw call as text. Nothing errors, so only choosing the template by the model (auto mode)
    avoids it."""
    msg = _message(mismatch_server.chat([USER_QUESTION]))
    assert not msg.get("tool_calls")
    assert msg["finish_reason"] == "stop"
    assert '<invoke name="get_weather">' in msg["content"]
    assert "]<]minimax[>[<tool_call>" in msg["content"]
    mismatch_server.wait_for_log(r"chat format: peg-native$")


# --- what the project reports matches what llama-server does ----------------------------------------

@pytest.fixture(scope="module")
def m2_server(llamacpp_bin, llamacpp_tree, workdir):
    """An M2-format model whose GGUF embeds MiniMax-M2's template, served with that template as shipped."""
    m2_template = (llamacpp_tree / "models" / "templates" / "MiniMax-M2.jinja").read_text()
    model = tiny.write_tiny_m3(workdir / "tiny-m2.gguf", "m2", template_text=m2_template, layers=N_LAYERS)[0]
    template = workdir / "MiniMax-M2.jinja"
    template.write_text(m2_template)
    with serve(Path(llamacpp_bin), model, template, workdir / "m2") as served:
        served.gguf = model
        yield served


@pytest.mark.parametrize("which, model_fixture, mode, parser", [
    ("native", "m3_model", "native", True),
    ("hybrid", "hybrid_model", "hybrid", True),
    ("mismatch", "m3_model", "hybrid", True),
    ("m2", None, "native", True),
])
def test_reported_family_and_chat_format_are_the_servers(request, tmp_path, which, model_fixture, mode, parser):
    """gguf_chat_template's family and chat format (what hybrid_template reports and verify prints) equal
    llama-server's own `chat format:` line for the same GGUF and template."""
    from gguf_chat_template import main as gct_main
    from helpers import run_module

    served = request.getfixturevalue(f"{which}_server")
    gguf_path = served.gguf if model_fixture is None else request.getfixturevalue(model_fixture)
    result = run_module(gct_main, dict(src=str(gguf_path), dest=str(tmp_path / "t.jinja"), mode=mode, m3_parser=parser))
    assert result["family"] == ("m2" if which == "m2" else "m3")
    _message(served.chat([USER_QUESTION]))
    served.wait_for_log(r"chat format: " + re.escape(result["chat_format"]) + "$")


@pytest.mark.parametrize("which, kind", [("native", "ok"), ("hybrid", "ok"), ("m2", "ok"), ("mismatch", "markup")])
def test_canary_verdict_on_real_replies(request, which, kind):
    """The verify role's verdict filter on what llama-server really returns."""
    from ansible.module_utils.minimax_spark_canary import canary_verdict

    served = request.getfixturevalue(f"{which}_server")
    resp = served.chat([USER_QUESTION], max_tokens=512)
    verdict = canary_verdict({"status": resp.status_code, "json": resp.json()}, mode="x", chat_format="y", url="u")
    assert verdict["kind"] == kind, verdict["msg"]
    if kind == "markup":
        assert verdict["msg"].startswith("Tool-call canary failed on /v1/chat/completions: tool-call or reasoning "
                                         "markup ]<]minimax[>[, <tool_call>, <invoke name= in content "
                                         "(finish_reason=stop, ")


def test_a_reply_cut_at_max_tokens_is_named(native_server):
    from ansible.module_utils.minimax_spark_canary import canary_verdict

    resp = native_server.chat([USER_QUESTION], max_tokens=5)
    verdict = canary_verdict({"status": resp.status_code, "json": resp.json()}, max_tokens=5)
    assert verdict["kind"] == "length", verdict["msg"]
    assert "cut at max_tokens=5 (finish_reason=length" in verdict["msg"]


# --- a tool call cut by the token limit (project patch m3-final-tool-args) ---------------------------------------

#: An agent's tool the scripted model does not know: the tool-call grammar steers its get_weather call onto it, and
#: the model writes its decoy into ``command`` until the token limit cuts the reply inside the call.
AGENT_TOOL = {"type": "function", "function": {
    "name": "shell", "description": "Runs a shell command and returns its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
CUT = 60
TOOL_OUTPUT = "sh: 1: not found"


@pytest.fixture(scope="module")
def stock_server(builds, m3_model, native_template_file, workdir):
    """The native server on stock llama.cpp (build_llamacpp_project_patches: [])."""
    with serve(Path(builds["unpatched"]), m3_model, native_template_file, workdir / "stock") as served:
        yield served


def cut_call(served):
    """A reply cut inside a tool call on /v1/chat/completions: (the call, the streamed arguments joined)."""
    payload = {"messages": [USER_QUESTION], "tools": [AGENT_TOOL], "temperature": 0, "max_tokens": CUT}
    msg = _message(requests.post(f"{served.base_url}/v1/chat/completions", json=payload, timeout=REQUEST_TIMEOUT))
    assert msg["finish_reason"] == "length" and len(msg["tool_calls"]) == 1, msg
    call = msg["tool_calls"][0]
    assert call["function"]["name"] == "shell", call
    streamed = ""
    with requests.post(f"{served.base_url}/v1/chat/completions", json=dict(payload, stream=True), stream=True,
                       timeout=REQUEST_TIMEOUT) as resp:
        assert resp.status_code == 200, resp.text
        for line in resp.iter_lines(decode_unicode=True):
            if line and line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    for delta in choice["delta"].get("tool_calls") or []:
                        streamed += delta.get("function", {}).get("arguments") or ""
    return call, streamed


def send_back(served, call):
    """The next request of the conversation: the cut call and its result in the history."""
    history = [USER_QUESTION, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": call["id"], "content": TOOL_OUTPUT}]
    return requests.post(f"{served.base_url}/v1/chat/completions", timeout=REQUEST_TIMEOUT,
                         json={"messages": history, "tools": [AGENT_TOOL], "temperature": 0, "max_tokens": 64})


def responses_turn(served):
    """Codex's flow on /v1/responses: a reply cut inside a function_call, then the history sent back with the
    call's output. (the function_call item, the second response)"""
    tool = dict(AGENT_TOOL["function"], type="function")
    first = requests.post(f"{served.base_url}/v1/responses", timeout=REQUEST_TIMEOUT, json={
        "input": [{"role": "user", "content": USER_QUESTION["content"]}], "tools": [tool], "temperature": 0,
        "max_output_tokens": CUT})
    assert first.status_code == 200, first.text
    output = first.json()["output"]
    [call] = [item for item in output if item["type"] == "function_call"]
    second = requests.post(f"{served.base_url}/v1/responses", timeout=REQUEST_TIMEOUT, json={
        "input": [{"role": "user", "content": USER_QUESTION["content"]}, *output,
                  {"type": "function_call_output", "call_id": call["call_id"], "output": TOOL_OUTPUT}],
        "tools": [tool], "temperature": 0, "max_output_tokens": 64})
    return call, second


def test_a_tool_call_cut_by_the_token_limit_is_json_and_the_conversation_goes_on(native_server):
    call, streamed = cut_call(native_server)
    arguments = call["function"]["arguments"]
    assert set(json.loads(arguments)) == {"command"}, arguments
    assert streamed == arguments  # the last delta closes what the stream opened
    again = send_back(native_server, call)
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["message"]["content"] == tiny.ANSWER
    item, second = responses_turn(native_server)
    assert set(json.loads(item["arguments"])) == {"command"}, item
    assert second.status_code == 200, second.text
    texts = [part["text"] for out in second.json()["output"] if out["type"] == "message" for part in out["content"]]
    assert texts == [tiny.ANSWER], second.json()


def test_without_the_patch_the_cut_call_is_not_json_and_the_next_request_fails(stock_server):
    """What m3-final-tool-args fixes, on stock llama.cpp: the open arguments, then HTTP 500 for the history."""
    call, streamed = cut_call(stock_server)
    arguments = call["function"]["arguments"]
    assert arguments.startswith('{"command":"') and streamed == arguments, arguments
    with pytest.raises(ValueError):
        json.loads(arguments)
    again = send_back(stock_server, call)
    assert again.status_code == 500 and "Failed to parse tool call arguments as JSON" in again.text, again.text
    item, second = responses_turn(stock_server)
    assert second.status_code == 500 and "Failed to parse tool call arguments as JSON" in second.text, second.text
