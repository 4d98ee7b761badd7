#!/usr/bin/python
"""Build llama.cpp once per source and options, and stage the result with a manifest."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llamacpp_build
short_description: Build llama.cpp's server and RPC server once per source and options
description:
  - Configures and builds the requested llama.cpp targets from a prepared source tree with
    CMake (Ninja when available) and ccache, then stages the binaries and their shared
    libraries with a C(manifest.json) in C(build_root/<build_id>/).
  - The build id is a hash of the source tree (C(source_tree_sha256) of the patched tree, made of its file paths,
    contents and execute bits, without C(.git)), the CMake options, the targets and the CPU architecture. The
    same tree from an archive or a git checkout is one build; two different trees never are. A build whose
    staged manifest already verifies is not rebuilt.
  - With I(server=false) only the RPC server (and I(targets)) is built, for a group of nodes that runs no
    C(llama-server), e.g. the workers of another CPU architecture than the head. The manifest's C(targets)
    lists what was built; C(version) is null and C(server_options) empty then.
  - Both RPC server names exist in the stage (C(ggml-rpc-server) and C(rpc-server)), whichever
    the source tree builds. Binaries run from the stage with no C(LD_LIBRARY_PATH); RUNPATH is
    C($ORIGIN) and the module refuses a stage whose binaries cannot find their libraries.
options:
  src:
    description: Prepared llama.cpp source tree (the directory holding the top C(CMakeLists.txt)).
    type: path
    required: true
  source:
    description: >-
      Identity of the source (ref, commit, archive sha256, patches): how the tree was obtained, recorded in the
      manifest (the build id follows the tree's content, not this).
    type: dict
    required: true
  build_root:
    description: >-
      Directory holding build trees (C(<build_root>/work/<build_id>/build), compiled from the source tree linked
      into C(<build_root>/work/<build_id>/source)) and stages (C(<build_root>/<build_id>)).
    type: path
    required: true
  cuda:
    description: Build the CUDA backend.
    type: bool
    default: false
  cuda_architectures:
    description: >-
      Value of C(CMAKE_CUDA_ARCHITECTURES) (C(121) for DGX Spark GB10, C(90) for H100/H200). Required when
      I(cuda=true).
    type: str
  native:
    description: Compile for the build machine's CPU (C(GGML_NATIVE)). Off by default so the binaries run on every node.
    type: bool
    default: false
  rdma:
    description: RDMA transport for RPC (C(GGML_RPC_RDMA)).
    type: bool
    default: false
  openssl:
    description: HTTPS support in llama-server (needs OpenSSL headers).
    type: bool
    default: false
  extra_cmake_args:
    description: More C(-D) arguments, appended last.
    type: list
    elements: str
    default: []
  server:
    description: >-
      Build C(llama-server). False builds only the RPC server (and I(targets)): 31 objects instead of about 195,
      for nodes that only serve RPC.
    type: bool
    default: true
  targets:
    description: CMake targets besides the server and the RPC server (whose name is detected).
    type: list
    elements: str
    default: []
  ccache_dir:
    description: ccache directory; empty disables ccache.
    type: path
  jobs:
    description: Parallel build jobs; 0 means the number of CPUs.
    type: int
    default: 0
  patches:
    description:
      - The patches applied to I(src) (C(name) or C(src), and C(sha256) each), recorded in the manifest by name and
        sha256.
    type: list
    elements: dict
    default: []
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reports whether a build would run (the staged manifest does not verify); builds nothing.
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Build llama.cpp
  llamacpp_build:
    src: /var/cache/minimax-spark/llama.cpp/src/3f2a9c0d1e2b4a5c
    source: {type: git, ref: b7000, commit: 0123abcd}
    build_root: /var/cache/minimax-spark/llama.cpp/builds
    cuda: true
    cuda_architectures: "121"
    ccache_dir: /var/cache/minimax-spark/ccache
"""

RETURN = r"""
build_id:
  description: Hash naming this build.
  type: str
  returned: always
stage_dir:
  description: Directory holding C(bin/) and C(manifest.json).
  type: str
  returned: always
manifest:
  description: >-
    The build manifest (source, C(source_tree_sha256), C(rpc_protocol) (the tree's RPC protocol version,
    C(major.minor.patch), null when the tree has no C(ggml/include/ggml-rpc.h)), options, rpc server name,
    sha256 of every staged file, native M3 parser,
    C(patches) as C({name, sha256}) each, C(rpc_hash_file) when the RPC client takes weight hashes from
    C(GGML_RPC_HASH_FILE), C(m3_layer_inputs) when the M3 graph records its layer inputs).
  type: dict
  returned: always
"""

import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_build import (
    SERVER,
    Builder,
    build_id_for,
    build_targets,
    cmake_args,
    manifest_for,
    rpc_target,
    source_tree_sha256,
    stage_verifies,
)
from ansible.module_utils.minimax_spark_files import fsync_dir, write_atomic


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            source=dict(type="dict", required=True),
            build_root=dict(type="path", required=True),
            cuda=dict(type="bool", default=False),
            cuda_architectures=dict(type="str"),
            native=dict(type="bool", default=False),
            rdma=dict(type="bool", default=False),
            openssl=dict(type="bool", default=False),
            extra_cmake_args=dict(type="list", elements="str", default=[]),
            server=dict(type="bool", default=True),
            targets=dict(type="list", elements="str", default=[]),
            ccache_dir=dict(type="path"),
            jobs=dict(type="int", default=0),
            patches=dict(type="list", elements="dict", default=[]),
        ),
        required_if=[("cuda", True, ["cuda_architectures"])],
        supports_check_mode=True,
    )
    params = module.params
    if module.check_mode and not os.path.exists(params["src"]):
        # A first run in check mode: the source tree is not laid out yet, so a build would happen.
        module.exit_json(changed=True, build_id=None, stage_dir=None, manifest={})
    if not os.path.exists(os.path.join(params["src"], "CMakeLists.txt")):
        module.fail_json(msg="src=%s is not a llama.cpp source tree (no CMakeLists.txt)" % params["src"])
    rpc_name = rpc_target(params["src"])
    if rpc_name is None:
        module.fail_json(msg="src=%s has no RPC server target (tools/rpc or examples/rpc): is it llama.cpp?"
                         % params["src"])

    args = cmake_args(params)
    targets = build_targets(params, rpc_name)
    tree = source_tree_sha256(params["src"])
    build_id = build_id_for(tree, args, targets)
    stage_dir = os.path.join(params["build_root"], build_id)

    manifest = stage_verifies(stage_dir)
    if manifest is not None:
        module.exit_json(changed=False, build_id=build_id, stage_dir=stage_dir, manifest=manifest)
    if module.check_mode:
        module.exit_json(changed=True, build_id=build_id, stage_dir=stage_dir, manifest={})

    builder = Builder(module)
    work_dir = os.path.join(params["build_root"], "work", build_id)
    build = builder.compile(work_dir, args, targets)
    tmp = builder.stage(build, stage_dir, targets, rpc_name)
    builder.check_runs(tmp, targets)
    has_server = SERVER in targets
    manifest = manifest_for(params, build_id, args, targets, rpc_name, tmp,
                            builder.version(tmp) if has_server else None,
                            builder.server_options(tmp) if has_server else [], tree)
    write_atomic(os.path.join(tmp, "manifest.json"), json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(stage_dir, ignore_errors=True)
    os.rename(tmp, stage_dir)
    fsync_dir(params["build_root"])
    module.exit_json(changed=True, build_id=build_id, stage_dir=stage_dir, manifest=manifest, steps=builder.log)


if __name__ == "__main__":
    main()
