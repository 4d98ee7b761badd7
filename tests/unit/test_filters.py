"""filter_plugins/minimax_spark.py: the --rpc list, the layer split and llama-server's command line.

These three filters decide what the head runs: a wrong endpoint, a split that leaves a device without
layers, or a missing seed-recipe flag shows up only on the cluster, so each is pinned down here.
"""
import re

import jinja2
import pytest

import minimax_spark as ms

# -- rpc_endpoints -------------------------------------------------------------------------------------------


def test_rpc_endpoints_follow_the_workers_order_with_the_default_port():
    hostvars = {
        "spark-c": {"worker_rpc_bind_address": "10.20.20.4"},
        "spark-a": {"worker_rpc_bind_address": "10.20.20.2"},
        "spark-b": {"worker_rpc_bind_address": "10.20.20.3"},
    }
    assert ms.rpc_endpoints(["spark-a", "spark-b", "spark-c"], hostvars) == [
        "10.20.20.2:50052",
        "10.20.20.3:50052",
        "10.20.20.4:50052",
    ]
    assert ms.rpc_endpoints(["spark-c", "spark-a"], hostvars) == ["10.20.20.4:50052", "10.20.20.2:50052"]


def test_rpc_endpoints_use_the_worker_port_even_as_a_string():
    hostvars = {
        "w1": {"worker_rpc_bind_address": "10.0.0.2", "worker_rpc_port": 50060},
        "w2": {"worker_rpc_bind_address": "10.0.0.3", "worker_rpc_port": "50061"},
        "w3": {"worker_rpc_bind_address": "10.0.0.4", "worker_rpc_port": ""},
    }
    assert ms.rpc_endpoints(["w1", "w2", "w3"], hostvars) == ["10.0.0.2:50060", "10.0.0.3:50061", "10.0.0.4:50052"]


def test_rpc_endpoints_fall_back_to_the_fast_link_address():
    hostvars = {
        "w1": {"fast_link_address": "192.168.100.2"},
        # An explicit bind address wins over the fast link.
        "w2": {"fast_link_address": "192.168.100.3", "worker_rpc_bind_address": "10.9.9.3"},
        # An empty bind address (a common inventory default) is no address.
        "w3": {"worker_rpc_bind_address": "", "fast_link_address": "192.168.100.4"},
    }
    assert ms.rpc_endpoints(["w1", "w2", "w3"], hostvars) == [
        "192.168.100.2:50052",
        "10.9.9.3:50052",
        "192.168.100.4:50052",
    ]


def test_rpc_endpoints_bracket_ipv6_addresses():
    hostvars = {"w1": {"worker_rpc_bind_address": "fd00:20::2", "worker_rpc_port": 50053}, "w2": {"fast_link_address": "::1"}}
    assert ms.rpc_endpoints(["w1", "w2"], hostvars) == ["[fd00:20::2]:50053", "[::1]:50052"]


def test_rpc_endpoints_without_an_address_name_the_worker_and_the_variable():
    hostvars = {"spark-a": {"worker_rpc_bind_address": "10.0.0.2"}, "spark-b": {"worker_rpc_port": 50052}}
    with pytest.raises(ValueError) as info:
        ms.rpc_endpoints(["spark-a", "spark-b"], hostvars)
    message = str(info.value)
    assert "spark-b" in message
    assert "spark-a" not in message
    assert "worker_rpc_bind_address" in message
    assert "fast_link_address" in message


def test_no_workers_no_endpoints():
    assert ms.rpc_endpoints([], {}) == []


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
        "rpc_endpoints": ms.rpc_endpoints,
        "offload_layers": ms.offload_layers,
        "llama_server_argv": ms.llama_server_argv,
        "rpc_firewall_commands": ms.rpc_firewall_commands,
    }


def test_firewall_admits_each_source_then_drops_the_rest():
    commands = ms.rpc_firewall_commands(50052, ["10.20.20.1", "10.20.20.3"])
    assert all(c[:2] == ["/bin/sh", "-c"] and isinstance(c[2], str) for c in commands)
    scripts = [c[2] for c in commands]
    assert len(scripts) == 3
    assert "-s 10.20.20.1 -j ACCEPT" in scripts[0] and "iptables -I INPUT" in scripts[0]
    assert "-s 10.20.20.3 -j ACCEPT" in scripts[1]
    assert "--dport 50052 -j DROP" in scripts[2] and "iptables -A INPUT" in scripts[2]
    # Each rule is checked before it is added, so a restart never stacks duplicates.
    assert all(s.startswith("iptables -C INPUT") and "||" in s for s in scripts)


def test_firewall_refuses_an_empty_source_list():
    with pytest.raises(ValueError, match="fast_link_address"):
        ms.rpc_firewall_commands(50052, [])


def test_filters_work_from_jinja_as_the_roles_call_them(project_root):
    """Every filter is used by the roles, and renders through the mapping the way they call it."""
    roles = "\n".join(p.read_text() for p in (project_root / "roles").rglob("*.yml"))
    for name in ms.FilterModule().filters():
        assert re.search(r"\|\s*%s\b" % name, roles), name

    env = jinja2.Environment()
    env.filters.update(ms.FilterModule().filters())
    hostvars = {"w1": {"fast_link_address": "10.20.20.2"}, "w2": {"fast_link_address": "10.20.20.3"}}
    endpoints = env.from_string("{{ groups['workers'] | rpc_endpoints(hostvars) | join(' ') }}").render(
        groups={"workers": ["w1", "w2"]}, hostvars=hostvars
    )
    assert endpoints == "10.20.20.2:50052 10.20.20.3:50052"
    ngl = env.from_string("{{ 60 | offload_layers(eps | length, false) }}").render(eps=endpoints.split())
    assert ngl == "41"
    first = env.from_string("{{ (cfg | llama_server_argv)[0] }}").render(cfg=seed_cfg())
    assert first.endswith("/llama-server")
