"""What the controller knows about itself, without a process per use.

* ``minimax_controller_uid``: the controller's effective user id. The local inventory's ``ansible_become`` is
  templated for every task (``lookup('pipe', 'id -u')`` ran ``sh -c 'id -u'`` about twice per task).
* ``minimax_controller_sha256``: the sha256 of a file on the controller, '' when it is not a regular file. The
  llama.cpp source archive is named by it on every run (a ``stat`` module run cost each rerun about half a second;
  ``lookup('file')`` reads text only).
* ``minimax_controller_package``: where a Python package of the controller's ansible-playbook lives and its
  version ({path, version}; {} when it has none), found without importing it (a ``command`` running
  ``python -c 'import gguf'`` cost each rerun most of a second).

    ansible_become: "{{ none | minimax_controller_uid != 0 }}"   # root needs no sudo
    archive_sha256: "{{ build_llamacpp_archive | minimax_controller_sha256 }}"
    gguf: "{{ 'gguf' | minimax_controller_package }}"          # {'path': '.../site-packages/gguf', 'version': ...}
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os


def controller_uid(_=None):
    """The effective user id of the controller (``id -u`` of ansible-playbook's user)."""
    return os.geteuid()


def controller_sha256(path):
    """The sha256 (hex) of the regular file ``path`` on the controller; '' when there is none."""
    path = os.path.expanduser(str(path))
    if not os.path.isfile(path):
        return ""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def controller_package(name):
    """The folder and distribution version of the top-level package ``name`` that ansible-playbook's Python
    imports; {} when it has none."""
    spec = importlib.util.find_spec(str(name))
    if spec is None or not spec.origin:
        return {}
    try:
        version = importlib.metadata.version(str(name))
    except importlib.metadata.PackageNotFoundError:
        return {}
    return {"path": os.path.dirname(spec.origin), "version": version}


class FilterModule:
    def filters(self):
        return {"minimax_controller_uid": controller_uid, "minimax_controller_sha256": controller_sha256,
                "minimax_controller_package": controller_package}
