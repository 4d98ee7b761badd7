"""Speculative decoding on the demo (inventory/local, supervised services), through site.yml as a user runs it.

Without the m3-layer-inputs project patch, a spec type that reads layer inputs is refused before anything
stops (and the unpatched graph really aborts on it); a start whose speculation llama-server could not set up
is a failed start (the verified deployment is put back); with the patch, the tiny M3 runs draft-eagle3 with
a tiny EAGLE-3 draft made offline and replies exactly as without speculation at temperature 0; a draft that
is not an EAGLE-3 model is refused before anything stops.
"""
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml

from helpers import failed_tasks, run_playbook

FACTS = Path("/etc/ansible/facts.d")
RUN_DIR = Path("/opt/minimax-spark/services")
API = "http://127.0.0.1:8891"
NGRAM = "ngram-mod, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-cache"
KEEPS_SERVING = "Nothing was changed: the running llama-server (if any) keeps serving."
PROBE = "]~b]user\nWhat is the weather in Paris?[e~[\n]~b]ai\n"
DEFAULT_PATCHES = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles/build_llamacpp/defaults/main.yml")
                                 .read_text())["build_llamacpp_project_patches"]


def fact(name):
    path = FACTS / ("minimax_%s.fact" % name)
    return json.loads(path.read_text()) if path.exists() else None


def serving_pid():
    return (RUN_DIR / "minimax-llama-server.pid").read_text().strip()


def served_argv():
    return json.loads((RUN_DIR / "minimax-llama-server.json").read_text())["argv"]


def message(runner):
    failures = failed_tasks(runner)
    return failures[-1][2] if failures else ""


def replies():
    """What the served model says at temperature 0: a raw completion and a chat turn with a tool."""
    from make_tiny_m3 import WEATHER_TOOL

    completion = requests.post(API + "/completion", json={"prompt": PROBE, "n_predict": 64, "temperature": 0,
                                                          "cache_prompt": False}, timeout=120)
    assert completion.status_code == 200, completion.text
    chat = requests.post(API + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}], "temperature": 0,
        "tools": [WEATHER_TOOL]})
    assert chat.status_code == 200, chat.text
    message_ = chat.json()["choices"][0]["message"]
    calls = [call["function"] for call in message_.get("tool_calls") or []]  # each call's id is random
    return completion.json(), {"content": message_.get("content"), "reasoning": message_.get("reasoning_content"),
                               "calls": calls}


def head(models, **extravars):
    return run_playbook("site.yml", tags=["head_server"], extravars=dict(
        {"head_server_health_interval": 1, "head_server_settle": 2}, **extravars))


@pytest.fixture(scope="module")
def models(tmp_path_factory, llamacpp_tree):
    """The tiny M3 (target), a tiny EAGLE-3 draft for it, and a draft whose vocabulary does not match (BOS)."""
    import gguf

    from make_tiny_eagle3 import write_tiny_eagle3
    from make_tiny_m3 import write_tiny_m3

    root = tmp_path_factory.mktemp("speculative")
    template = (llamacpp_tree / "models" / "templates" / "MiniMax-M3.jinja").read_text()
    target = str(write_tiny_m3(root / "tiny-m3.gguf", "m3", template_text=template)[0])
    mismatched = root / "tiny-m3-bos.gguf"
    shutil.copy(target, mismatched)
    reader = gguf.GGUFReader(str(mismatched), "r+")
    field = reader.fields["tokenizer.ggml.add_bos_token"]
    field.parts[field.data[0]][0] = True
    reader.data.flush()
    del reader
    return {"target": target, "eagle3": str(write_tiny_eagle3(root / "tiny-eagle3.gguf")), "bos": str(mismatched)}


@pytest.fixture(scope="module")
def unpatched(models, llamacpp_archive):
    """The demo on a build without the project patch, verified."""
    runner = run_playbook("site.yml", extravars={"model_download_local_file": models["target"],
                                                 "build_llamacpp_project_patches": []})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
    assert fact("llamacpp")["m3_layer_inputs"] is False and fact("llamacpp")["patches"] == []
    return runner


def test_without_the_patch_layer_input_types_are_refused_before_anything_stops(unpatched, models):
    pid = serving_pid()
    for spec in ("draft-eagle3", "draft-dflash"):
        runner = head(models, head_server_spec_type=spec, head_server_draft_model=models["eagle3"])
        assert runner.status == "failed"
        assert message(runner) == (
            "head_server_spec_type=%s reads the target's layer inputs, and this llama.cpp build (%s) does not record "
            "them in the MiniMax-M3 graph: llama-server would abort on GGML_ASSERT(t_layer_inp[il] != nullptr) at the "
            "first request. Build with the m3-layer-inputs project patch (build_llamacpp_project_patches, on by "
            "default: run the build_llamacpp tag), or use a draft-free n-gram type (%s). %s"
            % (spec, fact("llamacpp")["build_id"], NGRAM, KEEPS_SERVING))
        assert serving_pid() == pid and "--spec-type" not in served_argv()
    assert requests.get(API + "/health", timeout=10).status_code == 200


def test_without_the_patch_the_m3_graph_aborts_on_draft_eagle3(unpatched, models, tmp_path):
    """What the refusal prevents: the unpatched llama-server, asked directly, dies at the first request."""
    log = tmp_path / "llama-server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([fact("llamacpp")["server"], "-m", models["target"], "--port", "18993", "-c", "4096",
                                 "--spec-type", "draft-eagle3", "--spec-draft-model", models["eagle3"]],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(120):  # it aborts at its start, or at the first request it decodes
            if proc.poll() is not None:
                break
            try:
                if requests.get("http://127.0.0.1:18993/health", timeout=2).status_code == 200:
                    with pytest.raises(requests.ConnectionError):
                        requests.post("http://127.0.0.1:18993/completion", json={"prompt": PROBE, "n_predict": 8},
                                      timeout=60)
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        assert proc.wait(timeout=30) != 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert 'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed' in log.read_text()


def test_a_start_without_the_speculation_asked_for_puts_the_verified_deployment_back(unpatched, models):
    """llama-server logs why it could not set speculation up and serves without it: a failed start."""
    verified = fact("deployment")["command"]
    runner = head(models, head_server_spec_type="draft-simple", head_server_draft_model=models["bos"])
    assert runner.status == "failed"
    msg = message(runner)
    assert msg.startswith("llama-server started without the speculative decoding it was asked for "
                          "(head_server_spec_type=draft-simple) and would serve every request without it: "), msg
    assert ("failed to initialize speculative decoding context: draft model vocab type must match target model to "
            "use speculation") in msg
    assert "Now serving: the last verified deployment again (template mode native" in msg
    assert "--spec-type" not in served_argv() and fact("deployment")["command"] == verified
    assert requests.get(API + "/health", timeout=10).status_code == 200


@pytest.fixture(scope="module")
def patched(unpatched, models):
    """The same demo rebuilt with the project patches (the default), verified, without speculation."""
    runner = run_playbook("site.yml", tags=["build_llamacpp", "head_server", "verify"],
                          extravars={"head_server_health_interval": 1, "head_server_settle": 2})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
    build = fact("llamacpp")
    assert build["m3_layer_inputs"] is True
    # the default build carries every project patch, in the role's order. The build id follows the patched source
    # tree: a build cached from patch files that differ only in their DEP-3 header is the same build, and its
    # manifest keeps the sha256 of the patch files it was first made from.
    assert [p["name"] for p in build["patches"]] == [p["name"] for p in DEFAULT_PATCHES]
    assert "m3-layer-inputs" in [p["name"] for p in build["patches"]]
    return build


def test_with_the_patch_draft_eagle3_runs_and_replies_as_without_speculation(patched, models):
    plain_completion, plain_chat = replies()
    runner = head(models, head_server_spec_type="draft-eagle3", head_server_draft_model=models["eagle3"])
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
    argv = served_argv()
    assert argv[argv.index("--spec-type") + 1] == "draft-eagle3"
    assert [s["speculative"] for s in requests.get(API + "/slots", timeout=10).json()] == [True]
    completion, chat = replies()
    assert completion["content"] == plain_completion["content"]
    assert chat == plain_chat and chat["calls"] == [{"name": "get_weather", "arguments": '{"city":"Paris"}'}]
    # the draft did draft (its proposals were checked by the M3 target, which did not abort)
    assert completion["timings"]["draft_n"] > 0, completion["timings"]
    assert requests.get(API + "/health", timeout=10).status_code == 200


def test_with_the_patch_a_draft_that_is_not_eagle3_is_refused_before_anything_stops(patched, models):
    pid = serving_pid()
    argv = served_argv()
    runner = head(models, head_server_spec_type="draft-eagle3", head_server_draft_model=models["target"])
    assert runner.status == "failed"
    assert message(runner) == (
        "head_server_draft_model=%s is not an EAGLE-3 draft for this model (architecture minimax-m3, extract layers "
        "[]; draft-eagle3 needs architecture eagle3 with 3 eagle3.target_layers below the target's 4 layers): "
        "llama-server would serve without speculation. Point head_server_draft_model at an EAGLE-3 GGUF made for this "
        "model, use draft-simple for a small model of the same vocabulary, or a draft-free n-gram type (%s). %s"
        % (models["target"], NGRAM, KEEPS_SERVING))
    assert serving_pid() == pid and served_argv() == argv
    assert requests.get(API + "/health", timeout=10).status_code == 200
