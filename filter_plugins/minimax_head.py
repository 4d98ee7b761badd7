"""Where the head answers and whom it reaches: derived once, from head_server's settings and the facts.

``head_server``'s ``settings`` entry point sets ``head_server_url`` with ``minimax_head_url``; its
``head_server_rpc_endpoints`` default reads the workers' ``minimax_rpc`` facts with ``minimax_worker_endpoints``.
"""
from __future__ import annotations

ALL_INTERFACES = ("0.0.0.0", "::", "")


def _bracket(address):
    address = str(address)
    return "[%s]" % address if ":" in address and not address.startswith("[") else address


def head_url(host, port, node=None):
    """Base URL of llama-server listening at ``host:port``.

    Asked from the head itself (``node`` None), an all-interfaces listener is reached at the loopback
    address; asked from elsewhere, at ``node`` (the head's ``ansible_host``).

    {{ head_server_host | minimax_head_url(head_server_port) }}  ->  'http://127.0.0.1:8891'
    {{ '0.0.0.0' | minimax_head_url(8891, 'spark-1') }}          ->  'http://spark-1:8891'
    """
    listen = "" if host is None else str(host).strip()
    if listen in ALL_INTERFACES:
        address = "127.0.0.1" if node in (None, "") else str(node)
    else:
        address = listen
    return "http://%s:%d" % (_bracket(address), int(port))


def _recorded_endpoint(hostvars, name):
    return ((hostvars[name].get("ansible_local") or {}).get("minimax_rpc") or {}).get("endpoint")


def worker_endpoints(workers, hostvars):
    """``host:port`` of every worker's RPC server, in inventory order, as each worker recorded it
    (``ansible_local.minimax_rpc.endpoint``, written by worker_rpc where the server runs). A worker that has
    recorded none is left out (``minimax_workers_unrecorded`` names it; head_server refuses to start then).

    {{ groups['workers'] | minimax_worker_endpoints(hostvars) }}  ->  ['10.20.20.2:50052']
    """
    return [str(_recorded_endpoint(hostvars, name)) for name in workers or [] if _recorded_endpoint(hostvars, name)]


def workers_unrecorded(workers, hostvars):
    """The workers that have recorded no RPC endpoint (no ``ansible_local.minimax_rpc``)."""
    return [name for name in workers or [] if not _recorded_endpoint(hostvars, name)]


class FilterModule:
    def filters(self):
        return {
            "minimax_head_url": head_url,
            "minimax_worker_endpoints": worker_endpoints,
            "minimax_workers_unrecorded": workers_unrecorded,
        }
