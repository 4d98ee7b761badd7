"""Pure functions on inventory facts: the layer split, llama-server's argv, the RPC
firewall."""

from __future__ import annotations

import ipaddress
import math
import shlex


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
    argv += _spec_argv(cfg)
    argv += [str(a) for a in cfg.get("extra_args") or []]
    return argv


#: Speculative decoding types of llama.cpp's --spec-type that need a draft model (-md); the others
#: (draft-mtp: the model's own MTP layers; ngram-*: the text so far) need none.
SPEC_DRAFT_MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")


def _spec_argv(cfg):
    """--spec-type, -md and --spec-draft-n-max from spec_type, draft_model, spec_draft_n_max ('' or none: off)."""
    from ansible.errors import AnsibleFilterError

    spec = cfg.get("spec_type") or "none"
    if spec == "none":
        return []
    supported = cfg.get("server_options") or []
    if supported and "--spec-type" not in supported:
        raise AnsibleFilterError(
            "head_server_spec_type=%s: this llama.cpp build's llama-server has no --spec-type; "
            "build a newer build_llamacpp_ref or set head_server_spec_type: none" % spec)
    argv = ["--spec-type", spec]
    if spec in SPEC_DRAFT_MODEL_TYPES:
        if not cfg.get("draft_model"):
            raise AnsibleFilterError(
                "head_server_spec_type=%s needs a draft model: set head_server_draft_model to its GGUF on the head "
                "(download it with a second model_download run), or use an ngram type" % spec)
        argv += ["--spec-draft-model", str(cfg["draft_model"])]
    _flag(argv, "--spec-draft-n-max", cfg.get("spec_draft_n_max"))
    return argv


FIREWALL_CHAIN = "MINIMAX-RPC"
#: Comment of the INPUT rules earlier versions added (removed by the reconcile).
LEGACY_FIREWALL_COMMENT = "minimax-spark"
FIREWALL_TOOLS = {"ipv4": "iptables", "ipv6": "ip6tables"}


def _firewall_port(port):
    try:
        value = int(port)
    except (TypeError, ValueError):
        value = 0
    if not 1 <= value <= 65535 or str(port).strip() != str(value):
        raise ValueError("worker_rpc_port=%s is not a TCP port: give a number from 1 to 65535" % (port,))
    return value


def _firewall_ports(port):
    """One port, or a list of them (the RPC port, then worker_rpc_iperf_port), each checked, in order, no repeats."""
    ports = []
    for one in (port if isinstance(port, (list, tuple)) else [port]):
        value = _firewall_port(one)
        if value not in ports:
            ports.append(value)
    return ports


def rpc_firewall_sources(sources, family="ipv4"):
    """The allowed sources of one family (``ipv4`` or ``ipv6``) as ``iptables -S`` prints them.

    Addresses get their full prefix (``10.20.20.1/32``, ``fd00::1/128``); networks are normalised.
    Anything that is not an address or a network is refused, in every family.

    {{ ['10.20.20.1', 'fd00::1'] | rpc_firewall_sources('ipv6') }}  ->  ['fd00::1/128']
    """
    if family not in FIREWALL_TOOLS:
        raise ValueError("firewall family %r: use ipv4 or ipv6" % (family,))
    if isinstance(sources, (str, bytes)) or not isinstance(sources, (list, tuple)):
        raise ValueError(
            "worker_rpc_allowed_sources must be a list of addresses, not %r: give it as a YAML list "
            "(or JSON with -e)" % (sources,))
    out = []
    for source in sources:
        try:
            network = ipaddress.ip_network(str(source).strip(), strict=False)
        except ValueError:
            raise ValueError(
                "worker_rpc_allowed_sources: %r is not an IP address or network: list the head's fast-link IP"
                % (source,)) from None
        if ("ipv%d" % network.version) == family and str(network) not in out:
            out.append(str(network))
    return out


def rpc_firewall_chain(sources, family="ipv4", chain=FIREWALL_CHAIN):
    """The rules of the RPC chain, as ``iptables -S`` prints them: ACCEPT each source, DROP the rest.

    {{ ['10.20.20.1'] | rpc_firewall_chain }}
      ->  ['-A MINIMAX-RPC -s 10.20.20.1/32 -j ACCEPT', '-A MINIMAX-RPC -j DROP']
    """
    return ["-A %s -s %s -j ACCEPT" % (chain, s) for s in rpc_firewall_sources(sources, family)] + [
        "-A %s -j DROP" % chain]


def rpc_firewall_jump(port, chain=FIREWALL_CHAIN):
    """The INPUT rule sending the RPC port's TCP traffic to the chain, as ``iptables -S`` prints it."""
    return "-A INPUT -p tcp -m tcp --dport %d -j %s" % (_firewall_port(port), chain)


def rpc_firewall_chain_file(sources, family="ipv4", chain=FIREWALL_CHAIN):
    """An ``iptables-restore --noflush`` file that (re)builds the chain in one transaction (no jump).

    The service's pre-start command applies it before every start, so the rules are back after a reboot.
    """
    return "".join(line + "\n" for line in (
        ["# Managed by minimax-spark (worker_rpc). Local changes are overwritten.", "*filter", ":%s - [0:0]" % chain]
        + rpc_firewall_chain(sources, family, chain) + ["COMMIT"]))


def _words(line):
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def rpc_firewall_plan(current, port, sources, enabled=True, family="ipv4", chain=FIREWALL_CHAIN):
    """What turns the rules now in place (``iptables -S`` output) into what the inventory says.

    Returns an ``iptables-restore --noflush`` payload, or ``""`` when the rules are already right, so the
    caller runs nothing and reports no change. On: the chain is (re)built only when its rules differ (declared
    and refilled in the same transaction, so the port is never open in between), exactly one INPUT jump for
    ``port`` (or each port of a list: the RPC port and the link probe's iperf3 port) (stale jumps to the
    chain, e.g. for an old port, are deleted). Off: every jump and the chain are removed. Both: the per-rule
    INPUT rules of earlier versions (comment ``minimax-spark``) are removed.

    {{ iptables_s.stdout | rpc_firewall_plan(50052, ['10.20.20.1'], true, 'ipv4') }}
    """
    lines = [line.strip() for line in (current or "").splitlines() if line.strip()]
    exists = ("-N %s" % chain) in lines
    rules = [line for line in lines if line.startswith("-A %s " % chain)]
    jumps, legacy = [], []
    for line in lines:
        if not line.startswith("-A INPUT "):
            continue
        words = _words(line)
        if any(words[i] in ("-j", "-g") and words[i + 1] == chain for i in range(len(words) - 1)):
            jumps.append(line)
        elif any(words[i] == "--comment" and words[i + 1] == LEGACY_FIREWALL_COMMENT for i in range(len(words) - 1)):
            legacy.append(line)

    body = []
    if enabled:
        wanted = rpc_firewall_chain(sources, family, chain)
        wanted_jumps = [rpc_firewall_jump(p, chain) for p in _firewall_ports(port)]
        if not exists or rules != wanted:
            body += [":%s - [0:0]" % chain] + wanted
        kept = []
        for line in jumps:
            if line in wanted_jumps and line not in kept:
                kept.append(line)
            else:
                body.append("-D" + line[2:])
        body += ["-D" + line[2:] for line in legacy]
        body += ["-I INPUT 1" + jump[len("-A INPUT"):] for jump in wanted_jumps if jump not in kept]
    else:
        body += ["-D" + line[2:] for line in jumps + legacy]
        if exists:
            body += ["-F %s" % chain, "-X %s" % chain]
    if not body:
        return ""
    return "".join(line + "\n" for line in ["*filter"] + body + ["COMMIT"])


def rpc_firewall_start_commands(port, rules_files, chain=FIREWALL_CHAIN):
    """Pre-start commands (argv lists) that put the chain and its jump back before each start.

    ``rules_files`` maps a family to its :func:`rpc_firewall_chain_file`; a missing file (firewall off, or
    that family not filtered) is skipped, so the command stays the same when the firewall is switched on or
    off or the sources change, and only a changed port changes the service's definition.
    """
    jumps = [rpc_firewall_jump(p, chain)[len("-A INPUT "):] for p in _firewall_ports(port)]
    steps = []
    for family in sorted(rules_files):
        tool, path = FIREWALL_TOOLS[family], shlex.quote(str(rules_files[family]))
        ensure = " && ".join(
            f"{{ {tool} -w -C INPUT {jump} 2>/dev/null || {tool} -w -I INPUT 1 {jump}; }}" for jump in jumps)
        steps.append(f"if [ -f {path} ]; then {tool}-restore -w --noflush {path} && {ensure} || exit 1; fi")
    return [["/bin/sh", "-c", "; ".join(steps)]]


class FilterModule:
    def filters(self):
        return {
            "offload_layers": offload_layers,
            "llama_server_argv": llama_server_argv,
            "rpc_firewall_sources": rpc_firewall_sources,
            "rpc_firewall_chain_file": rpc_firewall_chain_file,
            "rpc_firewall_plan": rpc_firewall_plan,
            "rpc_firewall_start_commands": rpc_firewall_start_commands,
        }
