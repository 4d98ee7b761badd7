"""tests/support/deployed_load.py: the command lines it times are the deployed one, as head_server wrote it, and that
one without its workers; a deployment without workers is refused with the reason."""
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tests" / "support"))
import deployed_load  # noqa: E402

DEPLOYED = ["/opt/b/llama-server", "--model", "/m/M3.gguf", "--host", "0.0.0.0", "--port", "8080", "--rpc",
            "10.0.0.2:50052,10.0.0.3:50052", "--split-mode", "layer", "--tensor-split", "22,19,20", "--ctx-size",
            "65536", "--load-mode", "none", "--jinja"]


ENV = {"GGML_RPC_HASH_FILE": "/m/M3.gguf.rpc-hashes", "OMP_WAIT_POLICY": "PASSIVE"}


def test_the_deployed_command_line_is_timed_as_it_is_on_a_spare_local_port():
    cmds = deployed_load.commands({"argv": DEPLOYED, "env": ENV}, 8899, {"PATH": "/usr/bin"})
    assert cmds["deployed"] == (DEPLOYED[:3] + DEPLOYED[7:] + ["--host", "127.0.0.1", "--port", "8899"],
                                dict(ENV, PATH="/usr/bin"))
    # the same command line; the environment lacks the hash file only
    assert cmds["no-hash-file"] == (cmds["deployed"][0], {"OMP_WAIT_POLICY": "PASSIVE", "PATH": "/usr/bin"})


def test_one_process_is_the_same_command_line_without_its_workers():
    one, env = deployed_load.commands({"argv": DEPLOYED, "env": ENV}, 8899, {})["one-process"]
    assert env == ENV
    assert "--rpc" not in one and "--tensor-split" not in one and "10.0.0.2:50052,10.0.0.3:50052" not in one
    assert one == ["/opt/b/llama-server", "--model", "/m/M3.gguf", "--split-mode", "layer", "--ctx-size", "65536",
                   "--load-mode", "none", "--jinja", "--host", "127.0.0.1", "--port", "8899"]


def test_a_deployment_without_workers_is_refused():
    argv = deployed_load.without(DEPLOYED, "--rpc")
    with pytest.raises(SystemExit, match="^The deployed llama-server has no --rpc worker .*: there is no split load"):
        deployed_load.commands({"argv": argv}, 8899, {})
