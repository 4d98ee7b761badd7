#!/usr/bin/python
"""Apply llama.cpp patches in order to a source tree, refusing one that does not fit with its file and hunk."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: llamacpp_patch
short_description: Apply patches to a llama.cpp source tree in order, or refuse the first that does not apply
description:
  - Applies each patch of O(patches) to O(src) with C(patch -p1), in order, each tried first (C(--dry-run)), so a
    patch that does not fit leaves no half-applied file and no C(.rej).
  - A patch that does not apply fails the task before anything is built, naming the variable that lists it, the
    patch, the tree (O(tree)) and each failing file with its hunks (or C(not in the tree), or C(already applied)).
  - Each patch file is C(<patch_dir>/<sha256>.patch) and must have that sha256.
version_added: "1.0.0"
author: minimax-spark
options:
  src:
    description: The llama.cpp source tree to patch.
    type: path
    required: true
  patches:
    description:
      - The patches, in order; each C(sha256), C(name) (else the file name of C(src)) and C(var) (the variable that
        lists it, for the message).
    type: list
    elements: dict
    default: []
  patch_dir:
    description: Folder holding each patch as C(<sha256>.patch).
    type: path
    required: true
  tree:
    description: What the tree is (ref and commit, or archive), for the message.
    type: str
    default: this tree
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Applies the series to a scratch copy of the files it touches; O(src) is not written.
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Apply the project's patches
  llamacpp_patch:
    src: /var/cache/minimax-spark/llama.cpp/src/3f2a9c0d1e2b4a5c.tmp
    patch_dir: /var/cache/minimax-spark/llama.cpp/patches
    tree: llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f
    patches:
      - {name: m3-layer-inputs, sha256: 6f0c..., var: build_llamacpp_project_patches}
"""

RETURN = r"""
applied:
  description: The names of the patches applied (or that would be, in check mode), in order.
  type: list
  elements: str
  returned: always
"""

import hashlib
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_patches import PatchError, apply_series, describe


def fix_for(var):
    if var == "build_llamacpp_project_patches":
        return ("refresh the project's patches for this tree (tools/refresh-patches, docs/llamacpp.md), build the "
                "pinned llama.cpp (build_llamacpp_ref's default), or set build_llamacpp_project_patches: [] to "
                "build llama.cpp unpatched")
    return "update the patch for this tree or drop it from %s" % var


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            patches=dict(type="list", elements="dict", default=[]),
            patch_dir=dict(type="path", required=True),
            tree=dict(type="str", default="this tree"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    series = []
    for patch in params["patches"]:
        name = patch.get("name") or os.path.basename(str(patch.get("src") or "")) or "?"
        sha = str(patch.get("sha256") or "").lower()
        path = os.path.join(params["patch_dir"], "%s.patch" % sha)
        try:
            with open(path, "rb") as handle:
                actual = hashlib.sha256(handle.read()).hexdigest()
        except OSError as err:
            module.fail_json(msg="%s: patch %s: %s: %s" % (patch.get("var") or "patches", name, path, err))
        if actual != sha:
            module.fail_json(msg="%s: patch %s: %s has sha256 %s, expected %s"
                             % (patch.get("var") or "patches", name, path, actual, sha))
        series.append({"name": name, "path": path, "var": patch.get("var") or "patches"})
    if not series:
        module.exit_json(changed=False, applied=[])
    try:
        applied = apply_series(params["src"], series, dry_run=module.check_mode)
    except PatchError as err:
        var = next(p["var"] for p in series if p["name"] == err.name)
        module.fail_json(msg="%s: %s does not apply to %s: %s. Nothing was built: %s."
                         % (var, err.name, params["tree"], describe(err.failures), fix_for(var)),
                         patch=err.name, failures=[{"file": f, "problems": w} for f, w in err.failures],
                         output=err.output)
    module.exit_json(changed=True, applied=applied)


if __name__ == "__main__":
    main()
