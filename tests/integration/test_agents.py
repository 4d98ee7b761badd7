"""The real coding agents, from npm, each take one turn against the demo, configured as the documents show them:
Claude Code (Anthropic Messages) with the README's "Use it from an agent" exports and OpenCode (chat completions)
with docs/agents.md's ``opencode.json``, Codex CLI (Responses) with its ``~/.codex/config.toml``; ``HEAD`` is the
demo's 127.0.0.1 and ``MINIMAX_SPARK_KEY`` a placeholder (the demo takes any key).

Each client sends its own first request (its system prompt and tool definitions, tens of thousands of the tiny
model's tokens: docs/agents.md) and ends its turn with an answer: the request is accepted and every reply parsed
without an API error. The clients sample at the server's temperature (1.0), where the tiny model may wander before it
answers (a tool call it makes is refused as unknown or invalid, and after that tool result it says "It is sunny in
Paris."), so the replies are bounded: Claude Code by CLAUDE_CODE_MAX_OUTPUT_TOKENS, OpenCode by
OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX, Codex (which sends no limit) by the demo's --n-predict. The clients reach
nothing but the demo (every proxy variable names a closed port, telemetry and update checks are off) and run in a
throw-away home. The packages are installed once, pinned, into .cache/npm (tests/support/agent_clients.py); the
tests skip only when npm cannot reach its registry.
"""
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from test_demo import API, deployed  # noqa: F401  (the demo deployment, shared fixture)

import agent_clients  # tests/support
from helpers import ROOT

#: Where every address but the demo's goes: a closed port.
NOWHERE = "http://127.0.0.1:9"
#: Bound on each client's turn, a hang guard and no speed target: Claude Code's turn (several requests, the first
#: ~40k tokens) took 291 s on 2 cores of one machine and passed 300 s on the next try there.
TURN_TIMEOUT = 900
#: The largest reply a client may ask for (the scripted reply is 11 tokens).
MAX_OUTPUT = 256
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def clients():
    """The three clients from npm, pinned, in .cache/npm (installed once; tools/test installs them before the node)."""
    found, why = agent_clients.install()
    if not found:
        pytest.skip(why)
    return found


def code_blocks(text, language):
    return re.findall(r"```%s\n(.*?)```" % language, text, re.S)


def readme_section():
    text = (ROOT / "README.md").read_text()
    start = text.index("## Use it from an agent")
    return text[start:text.index("\n## ", start + 1)]


def agents_doc():
    return (ROOT / "docs" / "agents.md").read_text()


def on_the_demo(text):
    return text.replace("HEAD", "127.0.0.1")


def isolated_env(home, **settings):
    """A clean environment: a throw-away home, no proxy but a closed port (only 127.0.0.1 is reached directly),
    no telemetry, no update checks; the key placeholder the documents' settings read."""
    for sub in (".config", ".cache", ".local/share", ".local/state"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "TERM": "dumb",
        "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local/share"), "XDG_STATE_HOME": str(home / ".local/state"),
        "MINIMAX_SPARK_KEY": "demo-any-key-works",
        "npm_config_registry": NOWHERE, "npm_config_offline": "true",
    }
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = NOWHERE
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.update(settings)
    return env


def run_turn(argv, env, cwd):
    started = time.time()
    proc = subprocess.run([str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=TURN_TIMEOUT, stdin=subprocess.DEVNULL)
    print("%s took %.0f s" % (Path(argv[0]).name, time.time() - started))
    return proc


def json_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def test_claude_code_takes_a_turn_with_the_readmes_settings(clients, deployed, tmp_path):  # noqa: F811
    exports = {}
    for block in code_blocks(readme_section(), "bash"):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["export"]:
                exports.update(word.split("=", 1) for word in words[1:])
    assert exports.get("ANTHROPIC_BASE_URL") == "http://HEAD:8891", exports
    env = isolated_env(tmp_path / "home")
    exports = {k: on_the_demo(v).replace("$MINIMAX_SPARK_KEY", env["MINIMAX_SPARK_KEY"]) for k, v in exports.items()}
    env.update(exports, CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(MAX_OUTPUT), DISABLE_TELEMETRY="1",
               DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
    work = tmp_path / "work"
    work.mkdir()
    proc = run_turn([clients["claude"], "-p", QUESTION, "--output-format", "json", "--max-turns", "4"], env, work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json_lines(proc.stdout)[-1]
    assert (result["type"], result["subtype"], result["is_error"]) == ("result", "success", False), result
    assert result["result"].strip() and "API Error" not in result["result"], result
    # its first request (system prompt and tools) is tens of thousands of tokens; later ones come from the cache
    usage = result["usage"]
    print("Claude Code: %d turns, %d input tokens, %d from the prompt cache; said %r" % (
        result["num_turns"], usage["input_tokens"], usage.get("cache_read_input_tokens") or 0, result["result"]))
    assert usage["input_tokens"] > 20_000, usage


def codex_config():
    blocks = [b for b in code_blocks(agents_doc(), "toml") if "[model_providers." in b]
    assert len(blocks) == 1, "docs/agents.md must show one ~/.codex/config.toml"
    return on_the_demo(blocks[0])


def test_codex_takes_a_turn_with_the_documented_config(clients, deployed, tmp_path):  # noqa: F811
    """Codex has no get_weather: the tiny model's scripted call lands on one of Codex's tools and is cut by the
    demo's --n-predict. Its arguments are JSON (project patch m3-final-tool-args), so Codex sends the call and its
    output back with the next request, and the turn ends with the model's answer."""
    config = codex_config()
    assert 'base_url = "http://127.0.0.1:8891/v1"' in config and 'wire_api = "responses"' in config, config
    env = isolated_env(tmp_path / "home", CODEX_HOME=str(tmp_path / "home" / ".codex"))
    (tmp_path / "home" / ".codex").mkdir()
    (tmp_path / "home" / ".codex" / "config.toml").write_text(config)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_turn([clients["codex"], "exec", "--skip-git-repo-check", "--ephemeral", "--json", QUESTION], env, work)
    events = json_lines(proc.stdout)
    errors = [e for e in events if e.get("type") in ("error", "turn.failed")]
    assert proc.returncode == 0 and not errors, (errors, proc.stdout[-3000:], proc.stderr[-3000:])
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    # the one error item Codex shows is its documented warning about a model it does not know
    assert [i for i in items if i["type"] == "error" and "Model metadata for `minimax-m3` not found" not in
            i["message"]] == [], items
    said = [item.get("text") for item in items if item.get("type") == "agent_message"]
    assert said and said[-1].strip(), events
    [done] = [e for e in events if e.get("type") == "turn.completed"]
    print("Codex: items %s, usage %s; said %r" % ([i["type"] for i in items], done["usage"], said[-1]))
    # two requests of ~24,000 tokens (the second with the call and its output); the cut call's 512 tokens (the
    # demo's --n-predict) and the answer
    assert done["usage"]["input_tokens"] > 40_000 and done["usage"]["output_tokens"] > 512, done


def opencode_config():
    blocks = [b for b in code_blocks(agents_doc(), "json") if "opencode.ai/config.json" in b]
    assert len(blocks) == 1, "docs/agents.md must show one opencode.json"
    return on_the_demo(blocks[0])


def test_opencode_takes_a_turn_with_the_documented_config(clients, deployed, tmp_path):  # noqa: F811
    work = tmp_path / "work"
    work.mkdir()
    config = opencode_config()
    provider = json.loads(config)["provider"]["minimax-spark"]
    assert provider["options"]["baseURL"] == "http://127.0.0.1:8891/v1"
    (work / "opencode.json").write_text(config)
    env = isolated_env(tmp_path / "home", OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1",
                       OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1",
                       OPENCODE_DISABLE_DEFAULT_PLUGINS="1", OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX=str(MAX_OUTPUT))
    proc = run_turn([clients["opencode"], "run", "--format", "json", QUESTION], env, work)
    events = json_lines(proc.stdout)
    errors = [e for e in events if e.get("type") == "error" or "error" in (e.get("part") or {})]
    assert proc.returncode == 0 and not errors, (errors, proc.stdout[-3000:], proc.stderr[-3000:])
    steps = [e["part"] for e in events if e.get("type") == "step_finish"]
    texts = [e["part"].get("text") for e in events if e.get("type") == "text"]
    assert steps and steps[-1].get("reason") == "stop" and texts and texts[-1].strip(), events
    print("OpenCode: %d steps, tokens %s; said %r" % (len(steps), [step.get("tokens") for step in steps], texts[-1]))
