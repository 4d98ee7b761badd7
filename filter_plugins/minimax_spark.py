# -*- coding: utf-8 -*-
"""Pure functions on inventory facts: the RPC endpoint list, the layer split, llama-server's argv."""

from __future__ import annotations

import math

DEFAULT_RPC_PORT = 50052


def rpc_endpoints(workers, hostvars):
    """``host:port`` of every worker's RPC server, in inventory order.

    The address is the worker's ``worker_rpc_bind_address`` (else its ``fast_link_address``);
    the port its ``worker_rpc_port`` (else 50052).

    {{ groups['workers'] | rpc_endpoints(hostvars) }}  ->  ['10.20.20.2:50052']
    """
    endpoints = []
    for name in workers:
        hv = hostvars[name]
        address = hv.get("worker_rpc_bind_address") or hv.get("fast_link_address")
        if not address:
            raise ValueError(
                "worker %s has no worker_rpc_bind_address (or fast_link_address): set it to the "
                "worker's fast-link IP in the inventory" % name
            )
        port = int(hv.get("worker_rpc_port") or DEFAULT_RPC_PORT)
        host = "[%s]" % address if ":" in str(address) else address
        endpoints.append("%s:%d" % (host, port))
    return endpoints


def offload_layers(block_count, workers, head_gpu):
    """``-ngl`` for a model of ``block_count`` blocks.

    A GPU head offloads everything (999) and lets ``--tensor-split`` share layers between its
    GPU and the workers. A CPU head is not a device: llama.cpp keeps the first
    ``(block_count + 1) - ngl`` layers (the output layer counts as one) on the head's CPU and
    spreads the rest over the RPC workers, so ``ngl`` is the workers' share of all layers.

    {{ 61 | offload_layers(1, false) }}  ->  31
    """
    if head_gpu:
        return 999
    if workers < 1:
        return 0
    total = int(block_count) + 1
    return max(1, min(total - 1, int(math.ceil(total * workers / (workers + 1.0)))))


def _flag(argv, name, value):
    if value is None or value == "":
        return
    argv += [name, str(value)]


def llama_server_argv(cfg):
    """llama-server's command line from a dict of settings (see roles/head_server/defaults).

    Required keys: server, model, host, port, rpc (list), ngl. Optional keys are left out of the
    command when empty or None. ``server_options`` (the build manifest's list of accepted flags)
    picks between flags that changed name across llama.cpp versions.
    """
    argv = [cfg["server"], "--model", cfg["model"], "--host", str(cfg["host"]), "--port", str(cfg["port"])]
    if cfg.get("alias"):
        argv += ["--alias", cfg["alias"]]
    if cfg.get("rpc"):
        argv += ["--rpc", ",".join(cfg["rpc"]), "--split-mode", "layer"]
    _flag(argv, "--n-gpu-layers", cfg.get("ngl"))
    if cfg.get("devices"):
        argv += ["--device", ",".join(cfg["devices"])]
    if cfg.get("tensor_split"):
        argv += ["--tensor-split", ",".join(str(x) for x in cfg["tensor_split"])]
    _flag(argv, "--ctx-size", cfg.get("ctx_size"))
    _flag(argv, "--parallel", cfg.get("parallel"))
    _flag(argv, "--flash-attn", cfg.get("flash_attn"))
    _flag(argv, "--cache-type-k", cfg.get("cache_type_k"))
    _flag(argv, "--cache-type-v", cfg.get("cache_type_v"))
    _flag(argv, "--batch-size", cfg.get("batch_size"))
    _flag(argv, "--ubatch-size", cfg.get("ubatch_size"))
    _flag(argv, "--threads", cfg.get("threads") or None)
    if cfg.get("mmap") is False:
        # Newer builds replaced --no-mmap with --load-mode; use what this build accepts.
        supported = cfg.get("server_options") or []
        argv += ["--load-mode", "none"] if "--load-mode" in supported else ["--no-mmap"]
    if cfg.get("jinja", True):
        argv.append("--jinja")
    if cfg.get("chat_template_file"):
        argv += ["--chat-template-file", cfg["chat_template_file"]]
    for key, flag in (("temp", "--temp"), ("top_p", "--top-p"), ("top_k", "--top-k"), ("min_p", "--min-p")):
        _flag(argv, flag, cfg.get(key))
    _flag(argv, "--verbosity", cfg.get("verbosity"))
    if cfg.get("api_key_file"):
        argv += ["--api-key-file", cfg["api_key_file"]]
    if cfg.get("metrics"):
        argv.append("--metrics")
    argv += [str(a) for a in cfg.get("extra_args") or []]
    return argv


def rpc_firewall_commands(port, sources, comment="minimax-spark"):
    """Commands (argv lists) that admit ``sources`` to TCP ``port`` and drop everyone else.

    Each command checks for its rule first (``iptables -C``), so running them at every service
    start keeps exactly one copy of each rule, also after a reboot flushed them.

    {{ 50052 | rpc_firewall_commands(['10.20.20.1']) }}
    """
    if not sources:
        raise ValueError("no source addresses to admit to port %s: set fast_link_address on the head" % port)

    def ensure(rule, how):
        spec = "INPUT -p tcp --dport %d %s -m comment --comment %s" % (int(port), rule, comment)
        return ["/bin/sh", "-c", "iptables -C %s 2>/dev/null || iptables %s %s" % (spec, how, spec)]

    commands = [ensure("-s %s -j ACCEPT" % source, "-I") for source in sources]
    commands.append(ensure("-j DROP", "-A"))
    return commands


class FilterModule(object):
    def filters(self):
        return {
            "rpc_endpoints": rpc_endpoints,
            "offload_layers": offload_layers,
            "llama_server_argv": llama_server_argv,
            "rpc_firewall_commands": rpc_firewall_commands,
        }
