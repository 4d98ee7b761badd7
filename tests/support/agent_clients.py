"""The real coding agents the tests drive, from npm, pinned, installed once into .cache/npm.

    python tests/support/agent_clients.py    # install them (tools/test does, before the tests' nodes start: a node
                                             # reaches no network, the checkout's .cache is shared with it)
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The clients, pinned: package@version and the command it installs.
CLIENTS = {
    "claude": "@anthropic-ai/claude-code@2.1.328",
    "codex": "@openai/codex@0.169.0",
    "opencode": "opencode-ai@1.18.33",
}
NPM_DIR = ROOT / ".cache" / "npm"


def installed():
    """{command: path} when every pinned version is in .cache/npm, else None."""
    found = {}
    for command, spec in CLIENTS.items():
        name, version = spec.rsplit("@", 1)
        manifest = NPM_DIR / "node_modules" / name / "package.json"
        binary = NPM_DIR / "node_modules" / ".bin" / command
        if not manifest.exists() or not binary.exists() or json.loads(manifest.read_text())["version"] != version:
            return None
        found[command] = binary
    return found


def install():
    """({command: path}, None) with every client installed, or (None, why not) when npm is missing or cannot reach
    its registry. A failed install raises."""
    found = installed()
    if found:
        return found, None
    npm = shutil.which("npm")
    if not npm:
        return None, "npm is not installed (tools/bootstrap.sh test installs it)"
    ping = subprocess.run([npm, "ping"], capture_output=True, text=True, timeout=60)
    if ping.returncode != 0:
        return None, "npm cannot reach its registry (npm ping: %s): the real-client tests need %s" % (
            (ping.stderr or ping.stdout).strip()[-300:], ", ".join(CLIENTS.values()))
    NPM_DIR.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([npm, "install", "--prefix", str(NPM_DIR), "--no-audit", "--no-fund", "--save-exact",
                          *CLIENTS.values()], capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        raise RuntimeError("npm install %s failed: %s" % (" ".join(CLIENTS.values()), run.stderr[-3000:]))
    found = installed()
    if not found:
        raise RuntimeError("npm installed %s, but not these versions" % ", ".join(CLIENTS.values()))
    return found, None


if __name__ == "__main__":
    clients, why = install()
    print("agents: %s" % (", ".join(CLIENTS.values()) if clients else "not installed: " + why), file=sys.stderr)
