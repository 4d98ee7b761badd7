"""The attributes every minimax-spark module declares, written once.

A module names this fragment (``extends_documentation_fragment: [minimax_attributes]``) and states only what is
its own under ``attributes``: ``check_mode`` (support and details), ``diff_mode`` when it returns a diff
(``support: full``), ``platform`` when it needs Linux (``platforms: linux``). A module that only reads names
``minimax_attributes.read_only`` too, instead of stating its check mode. Ansible merges the module's keys over
these (``ansible.utils.plugin_docs.merge_fragment``), so the module's word wins. ``ansible.cfg`` names this
folder in ``doc_fragment_plugins``.
"""
from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return a prediction of changed without modifying the target.
  diff_mode:
    description: Returns details on what has changed (or would change in check mode) in diff mode.
    support: none
  platform:
    description: Target OS/families that can be operated against.
    support: N/A
    platforms: posix
"""

    # A module that only reads: `extends_documentation_fragment: [minimax_attributes, minimax_attributes.read_only]`.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    details: Read only; it never changes anything.
"""
