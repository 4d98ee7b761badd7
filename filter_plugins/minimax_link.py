"""The link check's verdict: per head-worker pair, is RPC riding a link fast enough, with the same MTU at both
ends? Pure functions on what the link_info module and the iperf3 probe returned."""
from __future__ import annotations


def _rate(mbps):
    """200000 -> '200G', 1000 -> '1G', 100 -> '100M', None -> '?'."""
    if mbps is None:
        return "?"
    if mbps >= 1000:
        value = mbps / 1000.0
        return ("%dG" % value) if value == int(value) else ("%.1fG" % value)
    return "%dM" % mbps


def _end(info):
    iface = (info or {}).get("interface") or {}
    return iface


def _describe(iface):
    if not iface:
        return "?"
    if iface.get("kind") == "loopback":
        return "%s loopback" % iface.get("name", "lo")
    bond = "" if not iface.get("slaves") else " bond(%s)" % ",".join(
        "%s %s" % (s["name"], _rate(s.get("speed_mbps"))) for s in iface["slaves"])
    return "%s %s mtu %s%s" % (iface.get("name", "?"), _rate(iface.get("speed_mbps")), iface.get("mtu", "?"), bond)


def _faster(info, than_mbps, exclude):
    """This end's up interfaces faster than ``than_mbps`` (unknown speed counts as unknown, not faster)."""
    found = []
    for iface in (info or {}).get("interfaces") or []:
        speed = iface.get("speed_mbps")
        if iface.get("name") == exclude or speed is None:
            continue
        if than_mbps is None or speed > than_mbps:
            found.append(iface)
    return sorted(found, key=lambda i: -(i.get("speed_mbps") or 0))


def _fix_address(worker_end, current_if):
    """The worker's address on its fastest other interface (the one to put in fast_link_address), or None. An
    interface that reports no speed (a veth) comes after those that do."""
    others = [i for i in (worker_end or {}).get("interfaces") or []
              if i.get("name") != current_if and i.get("addresses") and i.get("kind") != "loopback"]
    others.sort(key=lambda i: (i.get("speed_mbps") is None, -(i.get("speed_mbps") or 0)))
    for iface in others:
        return iface["addresses"][0], iface
    return None, None


def link_pair(pair, min_gbit=10, enforce=True, rdma_build=False):
    """One head-worker pair's verdict.

    ``pair``: {worker, address, head: link_info on the head (peer=address), end: link_info on the worker
    (local_address=address), probe: the iperf3 figures or None}. Returns {worker, ok, loopback, problems, fixes,
    row, rdma}: ``problems`` say what is wrong with the numbers, ``fixes`` what to change.
    """
    if pair.get("checked") is False:
        # A what-if over nodes that are not this machine: nothing read, nothing judged, the reason in the row.
        why = pair.get("why") or "not read"
        row = [str(pair.get("worker")), str(pair.get("address")), "-", "-", "-", "-", "-", "not checked"]
        return {"worker": pair.get("worker"), "ok": True, "loopback": False, "problems": [], "fixes": [],
                "row": row, "rdma": None, "checked": False, "why": why}
    head, end, probe = pair.get("head") or {}, pair.get("end") or {}, pair.get("probe") or None
    h_if, w_if = _end(head), _end(end)
    route = head.get("route") or {}
    min_mbps = float(min_gbit) * 1000
    problems, fixes = [], []
    loopback = bool(route.get("local")) or h_if.get("kind") == "loopback"
    if loopback:
        verdict = "ok (loopback: same host)"
    else:
        for side, iface in (("head", h_if), ("worker", w_if)):
            speed = iface.get("speed_mbps")
            if speed is not None and min_mbps > 0 and speed < min_mbps:
                problems.append("the %s's %s reports %s, under %s Gbit/s" % (
                    side, iface.get("name"), _rate(speed), min_gbit))
        if probe and probe.get("gbit_s") is not None and min_mbps > 0 and probe["gbit_s"] * 1000 < min_mbps:
            problems.append("iperf3 measured %.3g Gbit/s head -> worker, under %s Gbit/s" % (probe["gbit_s"], min_gbit))
        if h_if.get("mtu") and w_if.get("mtu") and h_if["mtu"] != w_if["mtu"]:
            problems.append("MTU %s on the head's %s but %s on the worker's %s" % (
                h_if["mtu"], h_if.get("name"), w_if["mtu"], w_if.get("name")))
            fixes.append("set MTU %s on both ends (e.g. `ip link set dev %s mtu %s` on the head and the same on the "
                         "worker's %s, made permanent in netplan/NetworkManager)" % (
                             max(h_if["mtu"], w_if["mtu"]), h_if.get("name"), max(h_if["mtu"], w_if["mtu"]),
                             w_if.get("name")))
        if h_if.get("name") in (head.get("default_devs") or []):
            faster = _faster(head, h_if.get("speed_mbps"), h_if.get("name"))
            if faster:
                problems.append("the head reaches %s over %s, its default route, while %s is faster" % (
                    pair.get("address"), h_if.get("name"), _describe(faster[0])))
        if any("Gbit/s" in p or "default route" in p for p in problems):
            address, iface = _fix_address(end, w_if.get("name"))
            if address:
                fixes.insert(0, "put fast_link_address: %s for %s (its address on %s, %s)" % (
                    address, pair.get("worker"), iface["name"], _rate(iface.get("speed_mbps"))))
            else:
                fixes.insert(0, "give %s an address on its fast port (the 200 GbE QSFP link) and put it in "
                                "fast_link_address; the head needs one in the same subnet" % pair.get("worker"))
            fixes.append("for a lab link, lower link_min_gbit (now %s) or set link_enforce: false" % min_gbit)
        verdict = "ok" if not problems else ("REFUSED" if enforce else "slow (link_enforce off)")
    rdma = (end.get("rdma") or [])
    if not rdma_build:
        rdma_text = "off (build without RDMA)"
    elif not rdma:
        rdma_text = "off (no RDMA device on %s)" % w_if.get("name", "?")
    else:
        rdma_text = "%s gid %s (%s)" % (rdma[0]["device"], rdma[0].get("gid_index"), rdma[0].get("type") or "?")
    probe_text = "-" if not probe else "%.3g Gbit/s, rtt %s ms" % (
        probe.get("gbit_s", 0), "?" if probe.get("mean_rtt_ms") is None else "%.3g" % probe["mean_rtt_ms"])
    row = [str(pair.get("worker")), str(pair.get("address")), _describe(h_if), _describe(w_if),
           "yes" if h_if.get("name") in (head.get("default_devs") or []) else "no", probe_text, rdma_text, verdict]
    return {"worker": pair.get("worker"), "ok": not problems or not enforce, "loopback": loopback,
            "problems": problems, "fixes": fixes, "row": row,
            "rdma": rdma[0] if rdma_build and rdma and not loopback else None, "checked": True, "why": ""}


HEADER = ["worker", "address", "head interface", "worker interface", "default route", "iperf3", "RDMA", "verdict"]


def link_verdict(pairs, min_gbit=10, enforce=True, rdma_build=False):
    """All pairs: {ok, table, message, warnings, unchecked, pairs}. ``message`` (empty when ok) gives the numbers
    and the fix per refused worker; ``unchecked`` one line per pair that was not read (``checked: false``, a
    what-if over nodes that are not this machine) saying why.

    {{ pairs | link_verdict(link_min_gbit, link_enforce, rdma_build) }}
    """
    results = [link_pair(p, min_gbit, enforce, rdma_build) for p in pairs or []]
    rows = [HEADER] + [r["row"] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    table = "\n".join(["The link (RPC head -> worker; threshold %s Gbit/s):" % min_gbit] + lines)
    refused = [r for r in results if r["problems"] and enforce]
    message = ""
    if refused:
        message = "RPC would ride a slow or mismatched link, so nothing is started. " + " ".join(
            "%s: %s. Fix: %s." % (r["worker"], "; ".join(r["problems"]), "; ".join(r["fixes"])) for r in refused)
    warnings = ["%s: %s" % (r["worker"], "; ".join(r["problems"])) for r in results if r["problems"] and not enforce]
    unchecked = ["link not checked for %s (%s): %s" % (r["worker"], p.get("address"), r["why"])
                 for r, p in zip(results, pairs or []) if not r["checked"]]
    return {"ok": not refused, "table": table, "message": message, "warnings": warnings, "unchecked": unchecked,
            "pairs": results}


def rpc_transports(log_text, worker="", rdma_build=False, rdma_env=None):
    """Which transport each connection negotiated, from ggml-rpc-server's own log (since its last start):
    ``Accepted client connection`` opens one, ``RDMA activated`` in it means RDMA, anything else TCP
    (``RDMA activate failed, staying on TCP`` included). Returns {connections: ["RDMA"|"TCP", ...],
    rdma_enabled: the server's ``transport :`` line says RDMA auto-negotiate, line: one sentence}.

    {{ log | rpc_transports(inventory_hostname, true, link_rdma_env) }}
    """
    lines = (log_text or "").splitlines()
    starts = [i for i, line in enumerate(lines) if "Starting RPC server" in line]
    lines = lines[starts[-1]:] if starts else lines
    enabled = None
    connections = []
    for line in lines:
        if "transport" in line and ":" in line and "TCP" in line:
            enabled = "RDMA auto-negotiate enabled" in line
        elif "Accepted client connection" in line:
            connections.append("TCP")
        elif "RDMA activated" in line and connections:
            connections[-1] = "RDMA"
    rdma = connections.count("RDMA")
    if not connections:
        line = "%s: no connection yet in the RPC server's log" % worker
    elif rdma:
        line = "%s: llama.cpp negotiated RDMA on %d of %d connection(s)%s" % (
            worker, rdma, len(connections),
            " (%s gid %s)" % (rdma_env["GGML_RDMA_DEV"], rdma_env.get("GGML_RDMA_GID")) if rdma_env else "")
    else:
        why = ("build without RDMA" if not rdma_build or enabled is False
               else "no RDMA device on the link" if not rdma_env
               else "RDMA negotiation failed, see the RPC server's log")
        line = "%s: TCP on %d connection(s); RDMA off: %s" % (worker, len(connections), why)
    return {"connections": connections, "rdma_enabled": enabled, "line": line}


class FilterModule:
    """The link check's filters."""

    def filters(self):
        return {"link_verdict": link_verdict, "rpc_transports": rpc_transports}
