"""The settings of the two services checked in one style: a filter returns every problem, each a sentence naming
the variable and what to give instead (empty: fine), and the role fails once with all of them, before anything
stops. ``minimax_head_settings`` (head_server's ``settings`` entry point), ``minimax_worker_settings``
(worker_rpc)."""
from __future__ import annotations

import ipaddress
import json

EXCERPT = 60


def head_settings(settings, server_options=None):
    """Problems of head_server's settings (``{port, ctx_size, ..., extra_args}`` without the prefix), each a
    sentence naming the variable; empty when they are fine. ``server_options`` (the build manifest's list of
    llama-server's long options) makes unknown ``--flags`` in extra_args a problem too."""
    problems = []

    def number(key):
        value = settings.get(key)
        if isinstance(value, bool):
            return None
        try:
            return int(str(value).strip())
        except (TypeError, ValueError):
            problems.append("head_server_%s=%r is not a whole number" % (key, value))
            return None

    if "port" in settings:
        port = number("port")
        if port is not None and not 1 <= port <= 65535:
            problems.append("head_server_port=%d is not a port (1-65535)" % port)
    if "ctx_size" in settings and str(settings["ctx_size"]).strip().lower() != "max":
        ctx = _whole(settings["ctx_size"])
        if ctx is None:
            problems.append("head_server_ctx_size=%r is not a whole number or max: give a context in tokens "
                            "(e.g. 65536), 0 (the model's own context) or max (the most that fits every node)"
                            % (settings["ctx_size"],))
        elif ctx < 0:
            problems.append("head_server_ctx_size=%d is negative (0 takes the model's own context)" % ctx)
    if "ctx_size_max" in settings:
        cap = _whole(settings["ctx_size_max"])
        if cap is None or cap < 0:
            problems.append("head_server_ctx_size_max=%r is not 0 (no cap) or a context in tokens"
                            % (settings["ctx_size_max"],))
    for key in ("parallel", "batch_size", "ubatch_size", "health_timeout", "health_interval"):
        if key in settings:
            value = number(key)
            if value is not None and value < 1:
                problems.append("head_server_%s=%d must be positive" % (key, value))
    extra = settings.get("extra_args", [])
    if isinstance(extra, str) or not isinstance(extra, (list, tuple)):
        shown = extra if isinstance(extra, str) else json.dumps(extra, sort_keys=True, default=str)
        problems.append(
            "head_server_extra_args is %r, not a list of strings: give a list, e.g. "
            "-e '{\"head_server_extra_args\": [\"--flag\", \"value\"]}'"
            % (shown if len(shown) <= EXCERPT else shown[:EXCERPT] + "...",))
    else:
        known = set(server_options or [])
        for arg in extra:
            if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
                problems.append("head_server_extra_args holds %r, not a string" % (arg,))
                continue
            flag = str(arg).split("=", 1)[0]
            if known and flag.startswith("--") and len(flag) > 2 and flag not in known:
                problems.append("%s in head_server_extra_args is not an option of this llama-server "
                                "(see llama-server --help)" % flag)
    return problems


def _whole(value):
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def worker_settings(settings):
    """Problems of worker_rpc's settings (``{bind_address, port, iperf_port, threads, extra_args, devices, firewall,
    allowed_sources}`` without the prefix), each a sentence naming the variable; empty when they are fine."""
    problems = []
    bind = "" if settings.get("bind_address") is None else str(settings.get("bind_address")).strip()
    if "bind_address" in settings:
        if not bind:
            problems.append("worker_rpc_bind_address is empty: set it (or fast_link_address) "
                            "to the worker's fast-link IP")
        else:
            if not bind.strip("[]").replace("0", "").replace(".", "").replace(":", ""):
                problems.append("worker_rpc_bind_address=%s would expose the unauthenticated RPC port "
                                "on every network: use the fast-link IP" % bind)
    if "port" in settings:
        port = _whole(settings["port"])
        if port is None or not 1 <= port <= 65535:
            problems.append("worker_rpc_port=%s is not a TCP port: give a number from 1 to 65535" % (settings["port"],))
    if "threads" in settings:
        threads = _whole(settings["threads"])
        if threads is None or threads < 0:
            problems.append("worker_rpc_threads=%s is not 0 (the server's default) or a number of threads"
                            % (settings["threads"],))
    if "iperf_port" in settings:
        iperf = _whole(settings["iperf_port"])
        if iperf is None or not 0 <= iperf <= 65535 or (iperf and iperf == _whole(settings.get("port"))):
            problems.append("worker_rpc_iperf_port=%s is not a TCP port other than worker_rpc_port: give a number "
                            "from 1 to 65535 (or 0: no link measurement)" % (settings["iperf_port"],))
    for key in ("extra_args", "devices"):
        if key not in settings:
            continue
        value = settings[key]
        if isinstance(value, (str, bytes, dict)) or not isinstance(value, (list, tuple)) \
                or any(not isinstance(item, str) for item in value):
            problems.append(
                "worker_rpc_%s must be a list of strings (one word each), not %s: write a YAML list in the inventory; "
                "with -e give JSON, e.g. -e '{\"worker_rpc_%s\": [\"--flag\", \"value\"]}'"
                % (key, json.dumps(value), key))
    sources = settings.get("allowed_sources")
    if settings.get("firewall") and not sources:
        problems.append("worker_rpc_firewall is on but worker_rpc_allowed_sources is empty: set fast_link_address on "
                        "the head or list the head's address")
    elif settings.get("firewall"):
        if isinstance(sources, (str, bytes, dict)) or not isinstance(sources, (list, tuple)):
            problems.append("worker_rpc_allowed_sources must be a list of addresses, not %r: give it as a YAML list "
                            "(or JSON with -e)" % (sources,))
        else:
            for source in sources:
                try:
                    ipaddress.ip_network(str(source).strip(), strict=False)
                except ValueError:
                    problems.append("worker_rpc_allowed_sources: %r is not an IP address or network: list the head's "
                                    "fast-link IP" % (source,))
    return problems


class FilterModule:
    def filters(self):
        return {
            "minimax_head_settings": head_settings,
            "minimax_worker_settings": worker_settings,
        }
