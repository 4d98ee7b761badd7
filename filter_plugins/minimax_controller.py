"""The controller's own user, without a process per use: the local inventory's ``ansible_become`` is templated
for every task (``lookup('pipe', 'id -u')`` ran ``sh -c 'id -u'`` about twice per task).

    ansible_become: "{{ none | minimax_controller_uid != 0 }}"   # root needs no sudo
"""
from __future__ import annotations

import os


def controller_uid(_=None):
    """The effective user id of the controller (``id -u`` of ansible-playbook's user)."""
    return os.geteuid()


class FilterModule:
    def filters(self):
        return {"minimax_controller_uid": controller_uid}
