"""What the nodes' recorded llama.cpp builds say about each other: pure functions on the facts.

``head_server`` refuses, before anything stops, workers whose recorded build (``ansible_local.minimax_llamacpp``,
written by build_llamacpp) speaks another RPC protocol than the head's build: llama-server does not fail on a
version mismatch, it loads without that worker, on the head alone.

``build_llamacpp`` names the files of an install folder by their path in it: ``minimax_sha256_by_path`` turns a
``find`` result (``get_checksum``) into the map the build's manifest and the node's fact use.
"""
from __future__ import annotations

import os


def _build(hostvars, name):
    return ((hostvars[name].get("ansible_local") or {}).get("minimax_llamacpp")) or {}


def rpc_protocol_mismatch(workers, hostvars, head_build):
    """The workers whose recorded build's RPC protocol differs from ``head_build``'s (the head's
    ``minimax_llamacpp``), in inventory order: ``{worker, rpc_protocol, build_id}`` each. A side that records no
    protocol (a build made before builds recorded it) is not compared.

    {{ groups['workers'] | minimax_rpc_protocol_mismatch(hostvars, ansible_local.minimax_llamacpp) }}
      ->  [{'worker': 'spark-2', 'rpc_protocol': '8.0.0', 'build_id': '3f2a9c0d1e2b4a5c'}]
    """
    head = (head_build or {}).get("rpc_protocol")
    if not head:
        return []
    out = []
    for name in workers or []:
        build = _build(hostvars, name)
        theirs = build.get("rpc_protocol")
        if theirs and str(theirs) != str(head):
            out.append({"worker": name, "rpc_protocol": str(theirs), "build_id": build.get("build_id") or "?"})
    return out


def sha256_by_path(files, folder):
    """``{path relative to folder: checksum}`` of the files of an ``ansible.builtin.find`` result run with
    ``get_checksum: true`` (sha256): what the manifest's and the fact's ``files`` / ``installed`` hold.

    {{ _found.files | minimax_sha256_by_path('/opt/minimax-spark/llama.cpp/266212a1f60c007c') }}
      ->  {'bin/llama-server': '9f2c...', 'manifest.json': '41d0...'}
    """
    return {os.path.relpath(f["path"], folder): f["checksum"] for f in files or []}


class FilterModule:
    def filters(self):
        return {"minimax_rpc_protocol_mismatch": rpc_protocol_mismatch,
                "minimax_sha256_by_path": sha256_by_path}
