"""What llama-server's own log says of a start: which RPC workers hold the model, which were lost and why, and
the context each slot really has. The engine of the llama_server_log module.

llama.cpp (common/arg.cpp add_rpc_devices, ggml-rpc.cpp) connects to every ``--rpc`` endpoint before it loads.
What it logs when a worker is not what the head needs (FACTS.md, "Seen this month"):

- a port that answers but is no RPC server: ``Remote RPC server crashed or returned malformed response`` (abort,
  no address in the line);
- an RPC server of another protocol: ``RPC server version mismatch: 8.0.0``, then (the vendored tree)
  ``RPC handshake failed for HOST:PORT`` and an abort; newer builds (upstream #26392) go on without the device;
- no connection: ``Failed to connect to HOST:PORT`` (abort here; newer builds go on without the device);
- an RPC server that offers no device: nothing at all: the endpoint adds no device and the model loads on the
  head alone.

Once loaded, every worker that took its share logs ``load_tensors: RPC0[HOST:PORT] model buffer size = X MiB``
(the device index is the worker's own). A worker in ``--rpc`` without that line holds nothing: the head serves
alone. The served context per slot is /props' ``default_generation_settings.n_ctx``; llama-server logs
``the slot context (N) exceeds the training context of the model (M) - capping`` when it cut it.

Everything here is pure (text and dicts in, dicts out) except ``probe_rpc``, which asks an endpoint the RPC hello
the way llama-server does, to say what answers there.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import socket
import struct
import subprocess

from ansible.module_utils.minimax_spark_service import UNIT_DIR, systemd_running
from ansible.module_utils.urls import open_url

#: ggml-rpc's commands the probe sends (ggml-rpc.cpp ``enum rpc_cmd``: HELLO is always 14).
RPC_CMD_HELLO = 14
RPC_CMD_DEVICE_COUNT = 15
#: ``rpc_msg_hello_req``: the connection capabilities (all zero: plain TCP).
RPC_CONN_CAPS_SIZE = 24
#: ``rpc_msg_hello_rsp``: major, minor, patch, padding, the capabilities.
HELLO_RSP_SIZE = 4 + RPC_CONN_CAPS_SIZE

BUFFER_RE = re.compile(
    r"load_tensors:\s+(?P<buffer>RPC\d+\[(?P<endpoint>[^\]]+)\]\S*) model buffer size =\s*(?P<mib>[\d.]+) MiB")
MISMATCH_RE = re.compile(r"RPC server version mismatch: (?P<version>\d+\.\d+\.\d+)")
CONNECT_RE = re.compile(r"Failed to connect to (?P<endpoint>\S+?)(?:\s|$)")
HANDSHAKE_RE = re.compile(r"RPC handshake failed for (?P<endpoint>\S+?)(?:\s|$)")
MALFORMED = "Remote RPC server crashed or returned malformed response"
CAPPING_RE = re.compile(r"the slot context \((?P<asked>\d+)\) exceeds the training context of the model "
                        r"\((?P<train>\d+)\) - capping")
LOADER_RE = re.compile(r"llama_model_loader: loaded meta data with .* tensors from (?P<path>.+?) \(version ")
SLOT_CTX_RE = re.compile(r"initializing, n_slots = (?P<slots>\d+), n_ctx_slot = (?P<n_ctx>\d+)")
#: how much of a start's log is read (its load comes first)
LIMIT_BYTES = 16 << 20
MIB = 1 << 20
GIB = 1 << 30


class ServerLogError(Exception):
    """Input the check cannot read (a command line without llama-server's options)."""


def current_start(text):
    """The part of a supervised log written by the last start: from the supervisor's last ``starting:`` line on
    (all of ``text`` when it holds none)."""
    starting = text.rfind(" starting: ")
    if starting < 0:
        return text
    return text[text.rfind("\n", 0, starting) + 1:]


def _rfind(handle, needle, end, chunk=1 << 20):
    """Absolute offset of the last ``needle`` in the file before ``end`` (-1: none), reading backwards in chunks."""
    pos, carry = end, b""
    while pos > 0:
        step = min(chunk, pos)
        pos -= step
        handle.seek(pos)
        block = handle.read(step) + carry
        found = block.rfind(needle)
        if found >= 0:
            return pos + found
        carry = block[:len(needle) - 1]
    return -1


def last_start_offset(handle, marker=b" starting: "):
    """Byte offset of the line holding the supervisor's last ``starting:`` (0 when there is none): a long-running
    server's log can be large, so it is searched from the end."""
    handle.seek(0, 2)
    found = _rfind(handle, marker, handle.tell())
    if found < 0:
        return 0
    return _rfind(handle, b"\n", found) + 1


def read_log_file(path, offset=-1, limit=LIMIT_BYTES):
    """At most ``limit`` bytes of a supervised log from ``offset`` (negative: from the last start's line): a load's
    lines come first, whatever a long-running server logged after them."""
    with open(path, "rb") as handle:
        if offset < 0:
            offset = last_start_offset(handle)
        handle.seek(offset)
        return handle.read(limit).decode(errors="replace")


def where(service, manager="auto", run_dir="/opt/minimax-spark/services", log_dir="/var/log/minimax-spark",
          log=None):
    """(log file or None, systemd unit or None, definition file or None) of a service minimax_service runs (its
    ``manager`` as that module decides it), or of a log file given as such."""
    if log:
        return log, None, None
    if manager == "auto":
        manager = "systemd" if systemd_running() else "supervisor"
    if manager == "systemd":
        return None, service, os.path.join(UNIT_DIR, service + ".service")
    return os.path.join(log_dir, service + ".log"), None, os.path.join(run_dir, service + ".json")


def _systemctl_show(unit, prop):
    return subprocess.run(["systemctl", "show", "-p", prop, "--value", unit], capture_output=True,
                          text=True).stdout.strip()


def _journal(argv, limit):
    proc = subprocess.Popen(argv + ["-o", "cat", "--no-pager"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out = proc.stdout.read(limit)
    finally:
        proc.kill()
        proc.wait()
    return out.decode(errors="replace")


def read_journal(unit, since=0, loaded=True, limit=LIMIT_BYTES):
    """The first ``limit`` bytes a systemd unit logged: of its current run (a loaded server: its invocation, or,
    where journald does not tag lines with it, since its main process started), else since ``since`` (epoch
    seconds: every restart of a failed start)."""
    if loaded or not since:
        inv = _systemctl_show(unit, "InvocationID")
        text = _journal(["journalctl", "_SYSTEMD_INVOCATION_ID=" + inv], limit) if inv else ""
        if text.strip():
            return text
        started = _systemctl_show(unit, "ExecMainStartTimestamp")
        if started and started != "n/a":
            return _journal(["journalctl", "-u", unit, "--since", started], limit)
    return _journal(["journalctl", "-u", unit, "--since", "@%d" % int(since)], limit)


def served_context(url, key_file="", timeout=10):
    """The context per slot llama-server serves (/props ``default_generation_settings.n_ctx``; None when it does
    not say)."""
    headers = {}
    if key_file:
        with open(key_file) as handle:
            headers["Authorization"] = "Bearer " + handle.read().strip()
    reply = json.loads(open_url(url.rstrip("/") + "/props", headers=headers, timeout=timeout).read())
    return (reply.get("default_generation_settings") or {}).get("n_ctx")


def parse_log(text, model=None):
    """What a start's log says: ``buffers`` (endpoint -> MiB of ``model``'s weights on it), ``failures`` (each a
    dict: ``kind`` version|connect|handshake|malformed, ``line``, ``endpoint`` or None, ``version``), the capping
    line and the context per slot llama-server logged. ``model``: the command line's ``--model``; the buffers of
    another model it loads (a speculative draft) are not its share."""
    out = {"buffers": {}, "failures": [], "capping": None, "capped_to": None, "n_ctx_slot": None,
           "load_logged": False}
    by_buffer = {}
    loading = None
    for raw in text.splitlines():
        line = raw.strip()
        if "load_tensors:" in line:
            out["load_logged"] = True
        m = LOADER_RE.search(line)
        if m:
            loading = m.group("path")
            continue
        m = BUFFER_RE.search(line)
        if m:
            if model and loading and loading != model:
                continue
            # llama-server sizes its buffers in a dry pass first (0.00 MiB), then loads: the load counts
            name = m.group("buffer")
            mib = max(float(m.group("mib")), by_buffer.get(name, ("", 0.0))[1])
            by_buffer[name] = (m.group("endpoint"), mib)
            continue
        m = MISMATCH_RE.search(line)
        if m:
            out["failures"].append({"kind": "version", "line": line, "endpoint": None, "version": m.group("version")})
            continue
        m = HANDSHAKE_RE.search(line)
        if m:
            out["failures"].append({"kind": "handshake", "line": line, "endpoint": m.group("endpoint"),
                                    "version": None})
            continue
        m = CONNECT_RE.search(line)
        if m:
            out["failures"].append({"kind": "connect", "line": line, "endpoint": m.group("endpoint"), "version": None})
            continue
        if MALFORMED in line:
            out["failures"].append({"kind": "malformed", "line": line, "endpoint": None, "version": None})
            continue
        m = CAPPING_RE.search(line)
        if m:
            out["capping"], out["capped_to"] = line, int(m.group("train"))
            continue
        m = SLOT_CTX_RE.search(line)
        if m:
            out["n_ctx_slot"] = int(m.group("n_ctx"))
    out["failures"] = merge_handshakes(out["failures"])
    for endpoint, mib in by_buffer.values():
        if mib > 0:
            out["buffers"][endpoint] = round(out["buffers"].get(endpoint, 0.0) + mib, 2)
    return out


def merge_handshakes(failures):
    """The vendored tree logs a version mismatch without the address and then ``RPC handshake failed for
    HOST:PORT`` (in either order: the abort is written at once, the log line by llama.cpp's log thread): one
    failure of kind ``version`` with the address and both lines."""
    out = list(failures)
    for f in out:
        if f["kind"] != "version" or f["endpoint"]:
            continue
        mate = next((h for h in out if h["kind"] == "handshake"), None)
        if mate is None:
            continue
        first, second = (f, mate) if failures.index(f) < failures.index(mate) else (mate, f)
        f["endpoint"], f["line"] = mate["endpoint"], first["line"] + " / " + second["line"]
        out.remove(mate)
    return out


def _option(argv, names, default=None):
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return default


def command_settings(argv):
    """llama-server's settings the check needs, from its command line: the ``--rpc`` endpoints in order, the
    model, the tensor split, ``--ctx-size``, ``--parallel`` and whether the KV cache is unified."""
    argv = [str(a) for a in argv or []]
    if not argv:
        raise ServerLogError("the command line is empty")
    rpc = _option(argv, ["--rpc"], "")
    ctx = _option(argv, ["--ctx-size", "-c"])
    parallel = _option(argv, ["--parallel", "-np"], "1")
    split = _option(argv, ["--tensor-split", "-ts"], "")
    try:
        return {
            "rpc": [e.strip() for e in rpc.split(",") if e.strip()],
            "model": _option(argv, ["--model", "-m"], ""),
            "tensor_split": [float(x) for x in re.split(r"[,/]", split) if x.strip()],
            "ctx_size": int(ctx) if ctx is not None else None,
            "parallel": max(1, int(parallel)),
            "kv_unified": any(a in ("--kv-unified", "-kvu") for a in argv),
        }
    except ValueError as exc:
        raise ServerLogError("llama-server's command line has a value that is not a number: %s" % exc) from exc


def argv_from_definition(text):
    """The command line of a service definition: the supervisor's JSON (``argv``) or a systemd unit
    (``ExecStart=``, quoted as minimax_service writes it)."""
    text = text or ""
    if text.lstrip().startswith("{"):
        return [str(a) for a in json.loads(text).get("argv") or []]
    m = re.search(r"^ExecStart=(.*)$", text, re.M)
    if not m:
        raise ServerLogError("the service definition has no command line (no argv, no ExecStart=)")
    return [a.replace("%%", "%").replace("$$", "$") for a in shlex.split(m.group(1))]


def _pad(n, to=256):
    return -(-int(n) // to) * to


def slot_context(settings):
    """The context per slot llama-server gives this command line (llama_context: n_ctx padded to 256, split
    among the slots unless the KV cache is unified, each padded to 256); None for ``--ctx-size 0`` (the
    model's own) or no ``--ctx-size``."""
    ctx = settings.get("ctx_size")
    if not ctx:
        return None
    n_ctx = _pad(ctx)
    if settings.get("kv_unified"):
        return n_ctx
    return _pad(n_ctx // settings.get("parallel", 1))


def planned_shares(plan, settings):
    """Bytes of model weights the plan gives each ``--rpc`` endpoint (its worker rows in order), or None when the
    recorded plan is not the one this command line runs (another model or split: a restored deployment)."""
    plan = plan or {}
    workers = [r for r in plan.get("nodes") or [] if r.get("role") == "worker"]
    if not workers or len(workers) != len(settings["rpc"]):
        return None
    if plan.get("model_path") and settings.get("model") and plan["model_path"] != settings["model"]:
        return None
    split = [float(x) for x in plan.get("tensor_split") or []]
    if settings.get("tensor_split") and split and split != settings["tensor_split"]:
        return None
    return {e: int(float(r.get("weights_gib") or 0) * GIB) for e, r in zip(settings["rpc"], workers)}


def share_near(observed_bytes, planned_bytes, tolerance):
    """Is a worker's model buffer near its planned share? The plan rounds to 0.01 GiB: that much is slack too."""
    slack = tolerance * planned_bytes + 0.01 * GIB
    return abs(observed_bytes - planned_bytes) <= slack


# -- the RPC probe -------------------------------------------------------------------------------------------


def _recv(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def split_endpoint(endpoint):
    host, _, port = str(endpoint).rpartition(":")
    return host.strip("[]"), int(port)


def probe_rpc(endpoint, timeout=5.0):
    """Ask ``endpoint`` the RPC hello (and its device count) as llama-server does; what answered, as a dict:
    ``kind`` refused|closed|silent|garbage|rpc, ``version``, ``devices``, ``sample`` (the first bytes of a reply
    that is not RPC)."""
    out = {"kind": None, "version": None, "devices": None, "sample": "", "error": ""}
    try:
        sock = socket.create_connection(split_endpoint(endpoint), timeout=timeout)
    except OSError as exc:
        out.update(kind="refused", error=str(exc))
        return out
    try:
        sock.settimeout(timeout)
        sock.sendall(struct.pack("<BQ", RPC_CMD_HELLO, RPC_CONN_CAPS_SIZE) + b"\0" * RPC_CONN_CAPS_SIZE)
        head = _recv(sock, 8)
        if not head:
            out["kind"] = "closed"
            return out
        size = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if size != HELLO_RSP_SIZE:
            try:
                head += sock.recv(56)
            except OSError:
                pass
            out.update(kind="garbage", sample=head[:64].decode("latin-1"))
            return out
        body = _recv(sock, HELLO_RSP_SIZE)
        if len(body) != HELLO_RSP_SIZE:
            out.update(kind="garbage", sample=(head + body)[:64].decode("latin-1"))
            return out
        out.update(kind="rpc", version="%d.%d.%d" % tuple(body[:3]))
        try:
            sock.sendall(struct.pack("<BQ", RPC_CMD_DEVICE_COUNT, 0))
            reply = _recv(sock, 12)
            if len(reply) == 12 and struct.unpack("<Q", reply[:8])[0] == 4:
                out["devices"] = struct.unpack("<I", reply[8:])[0]
        except OSError:
            pass
        return out
    except socket.timeout:
        out["kind"] = "silent"
        return out
    except OSError as exc:
        out.update(kind="closed", error=str(exc))
        return out
    finally:
        sock.close()


def describe_answer(answer, timeout=5):
    """What a probe found, in words."""
    kind = (answer or {}).get("kind")
    if kind == "refused":
        return "refuses the connection (%s)" % answer.get("error") if answer.get("error") else "refuses the connection"
    if kind == "closed":
        return "accepts the connection and closes it without answering the RPC hello"
    if kind == "silent":
        return ("accepts the connection but says nothing within %d s of the RPC hello (an RPC server serves one "
                "client at a time: another may hold it; or another program listens there)" % timeout)
    if kind == "garbage":
        return "answers the RPC hello with bytes that are not RPC: %r" % answer.get("sample", "")
    if kind == "rpc":
        devices = answer.get("devices")
        return "is an RPC server of protocol %s with %s device%s" % (
            answer.get("version"), "?" if devices is None else devices, "" if devices == 1 else "s")
    return "was not asked"


def fix_for(kind, answer, worker, endpoint):
    """What to do, for one worker: from what llama.cpp logged (``kind``) and what answers at its address."""
    name, service = worker.get("name") or endpoint, worker.get("service") or "its RPC server"
    port = split_endpoint(endpoint)[1]
    answered = (answer or {}).get("kind")
    rerun = "then run site.yml (or --tags worker_rpc,head_server) again"
    if answered == "refused" or kind == "connect":
        return ("start the worker's RPC server (site.yml --tags worker_rpc) and check that %s is its fast-link "
                "address, the link is up and its firewall admits the head" % endpoint)
    if answered in ("closed", "garbage") or (kind == "malformed" and answered == "silent"):
        return ("another program than ggml-rpc-server listens on %s's port %d: stop it (`ss -ltnp 'sport = :%d'` "
                "on %s names it), %s" % (name, port, port, name, rerun))
    if kind == "version" or (answered == "rpc" and answer.get("version") and kind == "handshake"):
        return ("%s's RPC server is of another llama.cpp than the head's llama-server: build one llama.cpp for every "
                "node (site.yml --tags build_llamacpp,worker_rpc,head_server), or point both at the same "
                "build_llamacpp_ref" % name)
    if answered == "rpc" and answer.get("devices") == 0:
        return ("%s's RPC server offers no device (started without a backend, or another program speaking RPC): "
                "restart it with site.yml --tags worker_rpc, then --tags head_server" % name)
    if kind == "malformed":
        return ("%s's RPC server dropped the connection while the head loaded (out of memory is the usual cause): "
                "read the log of %s on %s, %s" % (name, service, name, rerun))
    return "run site.yml --tags head_server again; if it recurs, read the log of %s on %s" % (service, name)


# -- the verdict ---------------------------------------------------------------------------------------------


def _who(endpoint, workers):
    for w in workers or []:
        if str(w.get("endpoint")) == endpoint:
            return w
    return {"name": "", "endpoint": endpoint, "service": ""}


def _label(worker, endpoint):
    return ("worker %s (%s)" % (worker["name"], endpoint)) if worker.get("name") else (
        "the RPC endpoint %s (no worker recorded it)" % endpoint)


def attribute(failures, endpoints, buffers, answers):
    """Give every logged failure its endpoint: the one the line names; the only endpoint; those whose answer is
    not a usable RPC server; those without a model buffer; else all of them."""
    bad_answer = [e for e in endpoints if (answers.get(e) or {}).get("kind") not in (None, "rpc")
                  or (answers.get(e) or {}).get("devices") == 0]
    missing = [e for e in endpoints if e not in buffers]
    out = []
    for f in failures:
        if f["endpoint"]:
            out.append(dict(f, endpoints=[f["endpoint"]]))
            continue
        if f["kind"] == "version":
            other = [e for e in endpoints if (answers.get(e) or {}).get("version") == f["version"]]
            if other:
                out.append(dict(f, endpoints=other))
                continue
        for group in ([endpoints] if len(endpoints) == 1 else []) + [bad_answer, missing, endpoints]:
            if group:
                out.append(dict(f, endpoints=list(group)))
                break
        else:
            out.append(dict(f, endpoints=[]))
    return out


def to_check(parsed, endpoints, loaded=True):
    """The endpoints worth asking what answers there: those the log blames, and after a load those that hold
    nothing (a probe of a worker the head holds would queue: an RPC server serves one client at a time)."""
    named = {f["endpoint"] for f in parsed["failures"] if f["endpoint"]}
    unnamed = any(not f["endpoint"] for f in parsed["failures"])
    holds_nothing = loaded and parsed["load_logged"]
    return [e for e in endpoints if e in named or unnamed or (holds_nothing and e not in parsed["buffers"])]


WHAT = {
    "version": "its RPC server speaks another RPC protocol than this llama-server",
    "handshake": "the RPC handshake with it failed",
    "connect": "llama-server could not connect to it",
    "malformed": "llama-server aborted: the worker's port answered something that is not a working RPC server",
}


def verdict(parsed, settings, workers=None, shares=None, tolerance=0.1, answers=None, served_ctx=None,
            loaded=True, probe_timeout=5):
    """The problems of a start, each a dict (``worker``, ``endpoint``, ``kind``, ``line``, ``answered``, ``fix``,
    ``text``), and the context check. ``loaded``: llama-server answered /health (every endpoint must hold its
    share); false: the start failed (name the worker that made it fail, if one did)."""
    answers = answers or {}
    endpoints = settings["rpc"]
    problems = []
    seen = set()
    for f in attribute(parsed["failures"], endpoints, parsed["buffers"], answers):
        for e in f["endpoints"] or [""]:
            if (e, f["kind"]) in seen:
                continue
            seen.add((e, f["kind"]))
            worker = _who(e, workers) if e else {"name": "", "service": ""}
            answer = answers.get(e)
            kind = f["kind"]
            if kind == "handshake" and (answer or {}).get("kind") == "rpc":
                kind = "version"  # the mismatch line is lost when the abort comes first: the worker's answer tells
            text = "%s: %s. llama.cpp logged: `%s`." % (
                _label(worker, e) if e else "an RPC worker", WHAT[kind], f["line"])
            if answer:
                text += " %s %s." % (e, describe_answer(answer, probe_timeout))
            fix = fix_for(kind, answer, worker, e) if e else "start every worker's RPC server (--tags worker_rpc)"
            problems.append({"worker": worker.get("name", ""), "endpoint": e, "kind": kind, "line": f["line"],
                             "answered": describe_answer(answer, probe_timeout) if answer else "",
                             "fix": fix, "text": text + " Fix: " + fix + "."})
    if loaded and endpoints and not parsed["load_logged"]:
        fix = ("leave head_server_verbosity empty (the role then runs llama-server at verbosity 4) or set it to 4 "
               "or more, and run --tags head_server again")
        problems.append({"worker": "", "endpoint": "", "kind": "unlogged", "line": "", "answered": "", "fix": fix,
                         "text": "llama-server logged nothing of its load (no load_tensors line: its verbosity is "
                                 "below 4), so nothing proves that its workers hold their share. Fix: %s." % fix})
    elif loaded:
        blamed = {p["endpoint"] for p in problems}
        for e in endpoints:
            worker = _who(e, workers)
            answer = answers.get(e)
            if e not in parsed["buffers"]:
                text = ("%s holds no part of the model: llama-server logged no model buffer on it, so the layers "
                        "planned there were loaded on the head alone" % _label(worker, e))
                if answer:
                    text += "; %s %s" % (e, describe_answer(answer, probe_timeout))
                fix = fix_for("missing", answer, worker, e)
                if e not in blamed:
                    problems.append({"worker": worker["name"], "endpoint": e, "kind": "missing", "line": "",
                                     "answered": describe_answer(answer, probe_timeout) if answer else "",
                                     "fix": fix, "text": text + ". Fix: " + fix + "."})
                continue
            if shares and e in shares:
                observed = int(parsed["buffers"][e] * MIB)
                if not share_near(observed, shares[e], tolerance):
                    fix = ("the split llama-server loaded is not the plan's: run site.yml (the plan play and the head "
                           "together) and leave head_server_tensor_split empty or equal to the plan's")
                    problems.append({
                        "worker": worker["name"], "endpoint": e, "kind": "share", "line": "",
                        "answered": "", "fix": fix,
                        "text": "%s holds %.1f MiB of the model; the plan gives it %.1f MiB (tolerance %d%%). Fix: %s."
                                % (_label(worker, e), observed / MIB, shares[e] / MIB, round(tolerance * 100), fix)})
    ctx = {"expected": slot_context(settings), "served": served_ctx, "capping": parsed["capping"],
           "ctx_size": settings.get("ctx_size"), "parallel": settings.get("parallel")}
    if loaded and ctx["expected"] is not None and served_ctx is not None and int(served_ctx) != ctx["expected"]:
        text = ("llama-server serves %d tokens of context per slot, and its command line asks for %d "
                "(--ctx-size %d / --parallel %d)" % (int(served_ctx), ctx["expected"], ctx["ctx_size"],
                                                    ctx["parallel"]))
        if parsed["capping"]:
            text += "; llama-server logged: `%s`" % parsed["capping"]
            fix = ("give a context the model was trained for: head_server_ctx_size at most %d per slot "
                   "(x head_server_parallel), or lift the model's window on purpose" % (parsed["capped_to"]))
        else:
            fix = "read llama-server's log for why, and give head_server_ctx_size a context it serves"
        problems.append({"worker": "", "endpoint": "", "kind": "context", "line": parsed["capping"] or "",
                         "answered": "", "fix": fix, "text": text + ". Fix: " + fix + "."})
    return {"ok": not problems, "problems": problems, "context": ctx}


def message(result, loaded=True):
    """One message for a verdict with problems ('' when it has none)."""
    problems = result["problems"]
    if not problems:
        return ""
    workers = [p for p in problems if p["kind"] != "context"]
    if loaded and workers:
        head = "llama-server answered /health but does not serve on every worker in --rpc: "
    elif loaded:
        head = "llama-server does not serve the context it was started with: "
    else:
        head = "llama-server could not load onto its workers: "
    return head + " ".join(p["text"] for p in problems)
