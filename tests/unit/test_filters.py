"""filter_plugins/minimax_spark.py: the --rpc list, the layer split and llama-server's command line.

These three filters decide what the head runs: a wrong endpoint, a split that leaves a device without
layers, or a missing seed-recipe flag shows up only on the cluster, so each is pinned down here.
"""
import re

import jinja2
import pytest

import minimax_spark as ms

# -- offload_layers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_a_gpu_head_offloads_everything(workers):
    assert ms.offload_layers(60, workers, True) == 999


def test_cpu_head_one_worker_four_blocks_counts_the_output_layer():
    # 4 blocks + the output layer = 5 layers; half of them (rounded up) go to the worker.
    assert ms.offload_layers(4, 1, False) == 3


@pytest.mark.parametrize("workers, expected", [(1, 31), (2, 41), (3, 46)])
def test_cpu_head_m3_sixty_blocks(workers, expected):
    # 61 layers shared evenly between the head and its workers, the workers' part rounded up.
    assert ms.offload_layers(60, workers, False) == expected


def test_block_count_from_facts_may_be_a_string():
    assert ms.offload_layers("60", 1, False) == 31


@pytest.mark.parametrize("blocks", [1, 2, 4, 60])
@pytest.mark.parametrize("workers", [1, 2, 7, 64])
def test_cpu_head_keeps_at_least_one_layer_and_gives_the_workers_at_least_one(blocks, workers):
    ngl = ms.offload_layers(blocks, workers, False)
    total = blocks + 1
    assert 1 <= ngl <= total - 1


def test_cpu_head_without_workers_offloads_nothing():
    assert ms.offload_layers(60, 0, False) == 0


# -- llama_server_argv ------------------------------------------------------------------------------------------


def seed_cfg(**overrides):
    """The dict roles/head_server/tasks/main.yml builds, with the role's defaults (the seed recipe)."""
    cfg = {
        "server": "/opt/minimax-spark/llama.cpp/current/bin/llama-server",
        "model": "/var/lib/minimax-spark/models/MiniMax-M3-UD-IQ4_XS-00001-of-00003.gguf",
        "host": "0.0.0.0",
        "port": 8891,
        "alias": "minimax-m3",
        "rpc": ["10.20.20.2:50052", "10.20.20.3:50052"],
        "ngl": 41,
        "devices": [],
        "tensor_split": [],
        "ctx_size": 65536,
        "parallel": 1,
        "flash_attn": "on",
        "cache_type_k": "q8_0",
        "cache_type_v": "q8_0",
        "batch_size": 2048,
        "ubatch_size": 2048,
        "threads": 0,
        "mmap": False,
        "server_options": [],
        "chat_template_file": "/var/lib/minimax-spark/templates/minimax-m3-hybrid.jinja",
        "temp": 1.0,
        "top_p": 0.95,
        "top_k": 40,
        "min_p": "",
        "verbosity": "",
        "api_key_file": "",
        "metrics": True,
        "extra_args": [],
    }
    cfg.update(overrides)
    return cfg


def value(argv, flag):
    """The value after ``flag``, which must appear exactly once."""
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


def test_seed_recipe_flags():
    argv = ms.llama_server_argv(seed_cfg())
    assert argv[0] == "/opt/minimax-spark/llama.cpp/current/bin/llama-server"
    assert value(argv, "--model").endswith("00001-of-00003.gguf")
    assert value(argv, "--host") == "0.0.0.0"
    assert value(argv, "--port") == "8891"
    assert value(argv, "--alias") == "minimax-m3"
    assert value(argv, "--rpc") == "10.20.20.2:50052,10.20.20.3:50052"
    assert value(argv, "--split-mode") == "layer"
    assert value(argv, "--n-gpu-layers") == "41"
    assert value(argv, "--ctx-size") == "65536"
    assert value(argv, "--parallel") == "1"
    assert value(argv, "--flash-attn") == "on"
    assert value(argv, "--cache-type-k") == "q8_0"
    assert value(argv, "--cache-type-v") == "q8_0"
    assert value(argv, "--batch-size") == "2048"
    assert value(argv, "--ubatch-size") == "2048"
    assert value(argv, "--temp") == "1.0"
    assert value(argv, "--top-p") == "0.95"
    assert value(argv, "--top-k") == "40"
    assert argv.count("--jinja") == 1
    assert value(argv, "--chat-template-file") == "/var/lib/minimax-spark/templates/minimax-m3-hybrid.jinja"
    assert argv.count("--metrics") == 1


def test_every_argument_is_a_string():
    cfg = seed_cfg(
        tensor_split=[0.4, 0.3, 0.3], devices=["CUDA0", "RPC0"], threads=20, verbosity=4, min_p=0.05,
        extra_args=["--seed", 42, "--cont-batching", 1.5],
    )
    argv = ms.llama_server_argv(cfg)
    assert all(isinstance(a, str) for a in argv), [a for a in argv if not isinstance(a, str)]
    assert value(argv, "--tensor-split") == "0.4,0.3,0.3"
    assert value(argv, "--device") == "CUDA0,RPC0"
    assert value(argv, "--threads") == "20"
    assert value(argv, "--verbosity") == "4"
    assert value(argv, "--min-p") == "0.05"


@pytest.mark.parametrize(
    "key, flag, empty",
    [(key, flag, empty) for key, flag in [
        ("alias", "--alias"),
        ("chat_template_file", "--chat-template-file"),
        ("api_key_file", "--api-key-file"),
        ("min_p", "--min-p"),
        ("verbosity", "--verbosity"),
        ("ctx_size", "--ctx-size"),
        ("temp", "--temp"),
        ("threads", "--threads"),
    ] for empty in ("", None)]
    + [("devices", "--device", []), ("tensor_split", "--tensor-split", []), ("threads", "--threads", 0)],
)
def test_empty_options_are_left_out(key, flag, empty):
    """The role's defaults leave options empty ("", [], threads 0): llama.cpp's own default applies."""
    argv = ms.llama_server_argv(seed_cfg(**{key: empty}))
    assert flag not in argv
    assert not {"", "None", "[]"} & set(argv)


def test_missing_optional_keys_are_left_out():
    argv = ms.llama_server_argv(
        {"server": "llama-server", "model": "m.gguf", "host": "127.0.0.1", "port": 8080, "rpc": [], "ngl": 0}
    )
    # ngl=0 is a value (all layers on the CPU), kept; --jinja is on unless turned off.
    assert argv == ["llama-server", "--model", "m.gguf", "--host", "127.0.0.1", "--port", "8080",
                    "--n-gpu-layers", "0", "--jinja"]


def test_without_workers_there_is_no_rpc_nor_split_mode():
    argv = ms.llama_server_argv(seed_cfg(rpc=[]))
    assert "--rpc" not in argv
    assert "--split-mode" not in argv


def test_jinja_can_be_turned_off():
    assert "--jinja" not in ms.llama_server_argv(seed_cfg(jinja=False))


def test_no_mmap_uses_load_mode_when_the_build_accepts_it():
    argv = ms.llama_server_argv(seed_cfg(mmap=False, server_options=["--help", "--load-mode", "--model"]))
    assert value(argv, "--load-mode") == "none"
    assert "--no-mmap" not in argv


@pytest.mark.parametrize("options", [[], None, ["--mmap", "--no-mmap"]])
def test_no_mmap_uses_no_mmap_on_older_builds(options):
    argv = ms.llama_server_argv(seed_cfg(mmap=False, server_options=options))
    assert argv.count("--no-mmap") == 1
    assert "--load-mode" not in argv


@pytest.mark.parametrize("mmap", [True, None])
def test_mmap_on_or_unset_adds_no_flag(mmap):
    cfg = seed_cfg(mmap=mmap, server_options=["--load-mode"])
    argv = ms.llama_server_argv(cfg)
    assert "--no-mmap" not in argv and "--load-mode" not in argv


def test_api_key_file():
    argv = ms.llama_server_argv(seed_cfg(api_key_file="/etc/minimax-spark/api-key"))
    assert value(argv, "--api-key-file") == "/etc/minimax-spark/api-key"


def test_metrics_off_adds_no_flag():
    assert "--metrics" not in ms.llama_server_argv(seed_cfg(metrics=False))


def test_extra_args_come_last_so_they_override():
    extra = ["--ctx-size", 32768, "--reasoning-format", "none"]
    argv = ms.llama_server_argv(seed_cfg(extra_args=extra, api_key_file="/k", verbosity=4))
    assert argv[-4:] == ["--ctx-size", "32768", "--reasoning-format", "none"]
    # The recipe's own --ctx-size is still there, earlier: llama.cpp keeps the last one.
    assert argv.index("--ctx-size") < len(argv) - 4


def test_the_config_dict_is_not_modified():
    cfg = seed_cfg(extra_args=["--x"])
    before = repr(cfg)
    ms.llama_server_argv(cfg)
    assert repr(cfg) == before


# -- FilterModule ---------------------------------------------------------------------------------------------


def test_filter_module_maps_the_names_the_roles_use():
    filters = ms.FilterModule().filters()
    assert filters == {
        "offload_layers": ms.offload_layers,
        "llama_server_argv": ms.llama_server_argv,
        "rpc_firewall_sources": ms.rpc_firewall_sources,
        "rpc_firewall_chain_file": ms.rpc_firewall_chain_file,
        "rpc_firewall_plan": ms.rpc_firewall_plan,
        "rpc_firewall_start_commands": ms.rpc_firewall_start_commands,
    }


# -- the RPC firewall -----------------------------------------------------------------------------------------

#: ``iptables -S`` after the role set the firewall up for 10.20.20.1 on 50052.
IN_PLACE = """-P INPUT ACCEPT
-P FORWARD ACCEPT
-P OUTPUT ACCEPT
-N MINIMAX-RPC
-A INPUT -p tcp -m tcp --dport 50052 -j MINIMAX-RPC
-A MINIMAX-RPC -s 10.20.20.1/32 -j ACCEPT
-A MINIMAX-RPC -j DROP
"""
EMPTY = "-P INPUT ACCEPT\n-P FORWARD ACCEPT\n-P OUTPUT ACCEPT\n"


def test_firewall_sources_are_split_by_family_in_the_form_iptables_prints():
    sources = ["10.20.20.1", "fd00::1", "10.20.0.0/16", "10.20.20.1"]
    assert ms.rpc_firewall_sources(sources, "ipv4") == ["10.20.20.1/32", "10.20.0.0/16"]
    assert ms.rpc_firewall_sources(sources, "ipv6") == ["fd00::1/128"]


@pytest.mark.parametrize("sources,match", [
    (["head.local"], "'head.local' is not an IP address or network: list the head's fast-link IP"),
    ("10.20.20.1", "must be a list of addresses"),
])
def test_firewall_sources_refuse_what_is_not_an_address(sources, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        ms.rpc_firewall_sources(sources, "ipv4")


def test_firewall_chain_admits_each_source_then_drops_the_rest():
    assert ms.rpc_firewall_chain(["10.20.20.1", "10.20.20.3"]) == [
        "-A MINIMAX-RPC -s 10.20.20.1/32 -j ACCEPT",
        "-A MINIMAX-RPC -s 10.20.20.3/32 -j ACCEPT",
        "-A MINIMAX-RPC -j DROP",
    ]
    # No source of a family: that family drops everything to the port.
    assert ms.rpc_firewall_chain(["10.20.20.1"], "ipv6") == ["-A MINIMAX-RPC -j DROP"]


def test_firewall_plan_builds_chain_and_jump_in_one_transaction():
    assert ms.rpc_firewall_plan(EMPTY, 50052, ["10.20.20.1"]) == (
        "*filter\n"
        ":MINIMAX-RPC - [0:0]\n"
        "-A MINIMAX-RPC -s 10.20.20.1/32 -j ACCEPT\n"
        "-A MINIMAX-RPC -j DROP\n"
        "-I INPUT 1 -p tcp -m tcp --dport 50052 -j MINIMAX-RPC\n"
        "COMMIT\n")


def test_firewall_plan_for_ipv6_admits_the_ipv6_sources_only():
    assert ms.rpc_firewall_plan(EMPTY, 50052, ["10.20.20.1", "fd00::1"], True, "ipv6") == (
        "*filter\n:MINIMAX-RPC - [0:0]\n-A MINIMAX-RPC -s fd00::1/128 -j ACCEPT\n-A MINIMAX-RPC -j DROP\n"
        "-I INPUT 1 -p tcp -m tcp --dport 50052 -j MINIMAX-RPC\nCOMMIT\n")


def test_firewall_plan_is_empty_when_the_rules_are_in_place():
    assert ms.rpc_firewall_plan(IN_PLACE, 50052, ["10.20.20.1"]) == ""
    assert ms.rpc_firewall_plan(IN_PLACE, "50052", ["10.20.20.1/32"]) == ""


def test_firewall_plan_replaces_a_changed_source_without_touching_the_jump():
    plan = ms.rpc_firewall_plan(IN_PLACE, 50052, ["10.20.20.9"])
    # Declaring the existing chain flushes it inside the transaction: the old ACCEPT is gone, never a gap.
    assert plan == ("*filter\n:MINIMAX-RPC - [0:0]\n-A MINIMAX-RPC -s 10.20.20.9/32 -j ACCEPT\n"
                    "-A MINIMAX-RPC -j DROP\nCOMMIT\n")


def test_firewall_plan_moves_the_jump_to_a_changed_port():
    plan = ms.rpc_firewall_plan(IN_PLACE, 50053, ["10.20.20.1"])
    assert plan == ("*filter\n-D INPUT -p tcp -m tcp --dport 50052 -j MINIMAX-RPC\n"
                    "-I INPUT 1 -p tcp -m tcp --dport 50053 -j MINIMAX-RPC\nCOMMIT\n")


def test_firewall_plan_drops_duplicate_jumps_and_the_old_per_rule_firewall():
    current = IN_PLACE + (
        "-A INPUT -p tcp -m tcp --dport 50052 -j MINIMAX-RPC\n"
        "-A INPUT -s 10.20.20.1/32 -p tcp -m tcp --dport 50052 -m comment --comment minimax-spark -j ACCEPT\n"
        "-A INPUT -p tcp -m tcp --dport 50052 -m comment --comment \"minimax-spark\" -j DROP\n"
        "-A INPUT -p tcp -m tcp --dport 22 -m comment --comment ssh -j ACCEPT\n")
    assert ms.rpc_firewall_plan(current, 50052, ["10.20.20.1"]) == (
        "*filter\n"
        "-D INPUT -p tcp -m tcp --dport 50052 -j MINIMAX-RPC\n"
        "-D INPUT -s 10.20.20.1/32 -p tcp -m tcp --dport 50052 -m comment --comment minimax-spark -j ACCEPT\n"
        "-D INPUT -p tcp -m tcp --dport 50052 -m comment --comment \"minimax-spark\" -j DROP\n"
        "COMMIT\n")


def test_firewall_plan_off_removes_jump_and_chain_and_nothing_else():
    current = IN_PLACE + "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\n"
    assert ms.rpc_firewall_plan(current, 50052, [], False) == (
        "*filter\n-D INPUT -p tcp -m tcp --dport 50052 -j MINIMAX-RPC\n-F MINIMAX-RPC\n-X MINIMAX-RPC\nCOMMIT\n")
    assert ms.rpc_firewall_plan(EMPTY, 50052, [], False) == ""


@pytest.mark.parametrize("port", [0, 70000, "x", -1])
def test_firewall_refuses_a_port_out_of_range(port):
    with pytest.raises(ValueError, match="is not a TCP port: give a number from 1 to 65535"):
        ms.rpc_firewall_plan(EMPTY, port, ["10.20.20.1"])


def test_firewall_chain_file_rebuilds_the_chain_only():
    text = ms.rpc_firewall_chain_file(["10.20.20.1"])
    assert text.splitlines()[1:] == [
        "*filter", ":MINIMAX-RPC - [0:0]", "-A MINIMAX-RPC -s 10.20.20.1/32 -j ACCEPT", "-A MINIMAX-RPC -j DROP",
        "COMMIT"]
    assert "INPUT" not in text


def test_firewall_start_command_depends_on_the_port_only():
    files = {"ipv4": "/etc/minimax-spark/a.rules", "ipv6": "/etc/minimax-spark/b.rules"}
    [command] = ms.rpc_firewall_start_commands(50052, files)
    assert command[:2] == ["/bin/sh", "-c"]
    script = command[2]
    assert ("if [ -f /etc/minimax-spark/a.rules ]; then iptables-restore -w --noflush "
            "/etc/minimax-spark/a.rules") in script
    assert "ip6tables -w -C INPUT -p tcp -m tcp --dport 50052 -j MINIMAX-RPC 2>/dev/null || " \
           "ip6tables -w -I INPUT 1 -p tcp -m tcp --dport 50052 -j MINIMAX-RPC" in script
    # Missing files (firewall off) are skipped: the command itself succeeds without iptables.
    import subprocess
    missing = {"ipv4": "/nonexistent/a", "ipv6": "/nonexistent/b"}
    assert subprocess.run(ms.rpc_firewall_start_commands(50052, missing)[0]).returncode == 0


def test_filters_work_from_jinja_as_the_roles_call_them(project_root):
    """Every filter is used by the roles, and renders through the mapping the way they call it."""
    roles = "\n".join(p.read_text() for p in (project_root / "roles").rglob("*.yml"))
    for name in ms.FilterModule().filters():
        assert re.search(r"\|\s*%s\b" % name, roles), name

    env = jinja2.Environment()
    env.filters.update(ms.FilterModule().filters())
    endpoints = "10.20.20.2:50052 10.20.20.3:50052"
    ngl = env.from_string("{{ 60 | offload_layers(eps | length, false) }}").render(eps=endpoints.split())
    assert ngl == "41"
    first = env.from_string("{{ (cfg | llama_server_argv)[0] }}").render(cfg=seed_cfg())
    assert first.endswith("/llama-server")
