#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Build llama.cpp once per source and options, and stage the result with a manifest."""

from __future__ import annotations

DOCUMENTATION = r"""
module: llamacpp_build
short_description: Build llama.cpp's server and RPC server once per source and options
description:
  - Configures and builds the requested llama.cpp targets from a prepared source tree with
    CMake (Ninja when available) and ccache, then stages the binaries and their shared
    libraries with a C(manifest.json) in C(build_root/<build_id>/).
  - The build id is a hash of the source identity, the CMake options, the targets and the
    CPU architecture. A build whose staged manifest already verifies is not rebuilt.
  - Both RPC server names exist in the stage (C(ggml-rpc-server) and C(rpc-server)), whichever
    the source tree builds. Binaries run from the stage with no C(LD_LIBRARY_PATH): RUNPATH is
    C($ORIGIN) and the module refuses a stage whose binaries cannot find their libraries.
options:
  src:
    description: Prepared llama.cpp source tree (the directory holding the top C(CMakeLists.txt)).
    type: path
    required: true
  source:
    description: Identity of the source (ref, commit, archive sha256, patches). Part of the build id and recorded in the manifest.
    type: dict
    required: true
  build_root:
    description: Directory holding build trees (C(<build_root>/work/<build_id>)) and stages (C(<build_root>/<build_id>)).
    type: path
    required: true
  cuda:
    description: Build the CUDA backend.
    type: bool
    default: false
  cuda_architectures:
    description: Value of C(CMAKE_CUDA_ARCHITECTURES) (C(121) for DGX Spark GB10, C(90) for H100/H200). Required when I(cuda=true).
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
    description: The patches applied to I(src) (C(name) or C(src), and C(sha256) each), recorded in the manifest by name and sha256.
    type: list
    elements: dict
    default: []
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
    The build manifest (source, options, rpc server name, sha256 of every staged file, native M3 parser,
    C(patches) as C({name, sha256}) each, C(rpc_hash_file) when the RPC client takes weight hashes from
    C(GGML_RPC_HASH_FILE), C(m3_layer_inputs) when the M3 graph records its layer inputs).
  type: dict
  returned: always
"""

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

SERVER = "llama-server"
RPC_NAMES = ("ggml-rpc-server", "rpc-server")
# llama.cpp selects its native MiniMax-M3 tool-call parser under this format name
# (common/chat.cpp); a build that contains the string has the parser.
M3_PARSER_MARK = b"peg-minimax-m3"
# The RPC client reads precomputed weight hashes (project patch rpc-hash-sidecar) when it has this string.
RPC_HASH_FILE_MARK = b"GGML_RPC_HASH_FILE"
# The MiniMax-M3 graph and what it sets when it records each layer's input: speculative types that read
# layer inputs (EAGLE-3, DFlash, DSpark) abort without it (GGML_ASSERT in llm_graph_result::set_outputs).
M3_GRAPH = os.path.join("src", "models", "minimax-m3.cpp")
M3_LAYER_INPUTS_MARK = "t_layer_inp["
# Bumped when the manifest gains fields: an older stage is staged again (the build tree stays).
MANIFEST_VERSION = 4


def sha256_file(path, bufsize=1 << 20):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(bufsize), b""):
            digest.update(block)
    return digest.hexdigest()


def rpc_target(src):
    """Name of the RPC server target this tree builds (renamed rpc-server -> ggml-rpc-server in 2026)."""
    for sub in ("tools/rpc/CMakeLists.txt", "examples/rpc/CMakeLists.txt"):
        path = os.path.join(src, sub)
        if os.path.exists(path):
            with open(path) as handle:
                text = handle.read()
            return "ggml-rpc-server" if "ggml-rpc-server" in text else "rpc-server"
    return None


def cmake_args(params):
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_RPC=ON",
        "-DGGML_NATIVE=%s" % ("ON" if params["native"] else "OFF"),
        "-DGGML_CUDA=%s" % ("ON" if params["cuda"] else "OFF"),
        "-DGGML_RPC_RDMA=%s" % ("ON" if params["rdma"] else "OFF"),
        "-DLLAMA_OPENSSL=%s" % ("ON" if params["openssl"] else "OFF"),
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
    ]
    if params["cuda"]:
        args.append("-DCMAKE_CUDA_ARCHITECTURES=%s" % params["cuda_architectures"])
    return args + list(params["extra_cmake_args"])


def build_id_for(params, args, targets):
    identity = {
        "source": params["source"],
        "cmake_args": args,
        "targets": sorted(targets),
        "machine": platform.machine(),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def stage_verifies(stage_dir):
    """The staged manifest exists and every file it lists still has its sha256."""
    path = os.path.join(stage_dir, "manifest.json")
    try:
        with open(path) as handle:
            manifest = json.load(handle)
        if not isinstance(manifest, dict) or manifest.get("manifest_version") != MANIFEST_VERSION:
            return None
        for rel, digest in manifest["files"].items():
            if sha256_file(os.path.join(stage_dir, rel)) != digest:
                return None
    except (OSError, ValueError, KeyError):
        return None
    return manifest


class Builder:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.log = []

    def run(self, argv, cwd=None, env=None):
        started = time.time()
        rc, out, err = self.module.run_command(argv, cwd=cwd, environ_update=env or {})
        self.log.append({"cmd": argv, "rc": rc, "seconds": round(time.time() - started, 1)})
        if rc != 0:
            tail = "\n".join((out + "\n" + err).strip().splitlines()[-40:])
            self.module.fail_json(msg="'%s' failed (rc=%d):\n%s" % (" ".join(argv), rc, tail), steps=self.log)
        return out

    def env(self):
        ccache = self.params["ccache_dir"]
        if not ccache:
            return {}
        # Relative paths in the cache key let builds of the same source in other folders hit.
        return {
            "CCACHE_DIR": ccache,
            "CCACHE_BASEDIR": os.path.dirname(os.path.dirname(self.params["src"].rstrip("/"))),
            "CCACHE_NOHASHDIR": "true",
            "CCACHE_MAXSIZE": "10G",
        }

    def compile(self, work_dir, args, targets):
        params = self.params
        configure = ["cmake", "-S", params["src"], "-B", work_dir] + args
        if self.module.get_bin_path("ninja") and not os.path.exists(os.path.join(work_dir, "Makefile")):
            configure += ["-G", "Ninja"]
        if params["ccache_dir"] and self.module.get_bin_path("ccache"):
            configure += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            if params["cuda"]:
                configure.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
        env = self.env()
        self.run(configure, env=env)
        jobs = params["jobs"] or os.cpu_count() or 1
        self.run(["cmake", "--build", work_dir, "--target"] + targets + ["-j", str(jobs)], env=env)

    def stage(self, work_dir, stage_dir, targets):
        """Copy binaries and libraries (keeping SONAME links) to a fresh stage, then move it in place."""
        bin_src = os.path.join(work_dir, "bin")
        tmp = stage_dir + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(tmp, "bin"))
        wanted = set(targets)
        rpc_name = targets[1]
        for name in sorted(os.listdir(bin_src)):
            if name in wanted or ".so" in name:
                src = os.path.join(bin_src, name)
                dst = os.path.join(tmp, "bin", name)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), dst)
                else:
                    shutil.copy2(src, dst)
        for name in RPC_NAMES:
            if name != rpc_name:
                os.symlink(rpc_name, os.path.join(tmp, "bin", name))
        return tmp

    def check_runs(self, tmp):
        """The staged server starts from its own folder with a clean environment (proves RUNPATH)."""
        for name in (SERVER, RPC_NAMES[0]):
            path = os.path.join(tmp, "bin", name)
            rc, out, err = self.module.run_command([path, "--help"], environ_update={"LD_LIBRARY_PATH": ""})
            if "error while loading shared libraries" in err or rc == 127:
                self.module.fail_json(msg="%s cannot load its libraries from its own folder: %s" % (name, err.strip()))

    def version(self, tmp):
        rc, out, err = self.module.run_command([os.path.join(tmp, "bin", SERVER), "--version"])
        for line in (out + err).splitlines():
            if line.startswith("version:"):
                return line.split(":", 1)[1].strip()
        return "unknown"

    def server_options(self, tmp):
        """Long options llama-server accepts: flags change between versions (--no-mmap became --load-mode)."""
        rc, out, err = self.module.run_command([os.path.join(tmp, "bin", SERVER), "--help"])
        return sorted(set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", out + err)))


def m3_layer_inputs(src):
    """Does this tree's MiniMax-M3 graph record its layer inputs? None: the tree has no M3 graph."""
    try:
        with open(os.path.join(src, M3_GRAPH)) as handle:
            return M3_LAYER_INPUTS_MARK in handle.read()
    except OSError:
        return None


def manifest_for(params, build_id, args, targets, rpc_name, tmp, version, server_options):
    files = {}
    has_parser = False
    has_hash_file = False
    for name in sorted(os.listdir(os.path.join(tmp, "bin"))):
        path = os.path.join(tmp, "bin", name)
        if os.path.islink(path):
            continue
        files["bin/" + name] = sha256_file(path)
        with open(path, "rb") as handle:
            content = handle.read()
            has_parser = has_parser or M3_PARSER_MARK in content
            has_hash_file = has_hash_file or RPC_HASH_FILE_MARK in content
    return {
        "manifest_version": MANIFEST_VERSION,
        "build_id": build_id,
        "machine": platform.machine(),
        "source": params["source"],
        "options": {
            "cuda": params["cuda"],
            "cuda_architectures": params["cuda_architectures"] if params["cuda"] else None,
            "native": params["native"],
            "rdma": params["rdma"],
            "openssl": params["openssl"],
        },
        "cmake_args": args,
        "targets": targets,
        "rpc_server": rpc_name,
        "version": version,
        "server_options": server_options,
        "has_m3_parser": has_parser,
        "patches": [{"name": p.get("name") or os.path.basename(p.get("src") or ""), "sha256": p.get("sha256")} for p in params["patches"]],
        "rpc_hash_file": has_hash_file,
        "m3_layer_inputs": m3_layer_inputs(params["src"]),
        "files": files,
    }


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
        module.fail_json(msg="src=%s has no RPC server target (tools/rpc or examples/rpc): is it llama.cpp?" % params["src"])

    args = cmake_args(params)
    targets = [SERVER, rpc_name] + [t for t in params["targets"] if t not in (SERVER, rpc_name)]
    build_id = build_id_for(params, args, targets)
    stage_dir = os.path.join(params["build_root"], build_id)

    manifest = stage_verifies(stage_dir)
    if manifest is not None:
        module.exit_json(changed=False, build_id=build_id, stage_dir=stage_dir, manifest=manifest)
    if module.check_mode:
        module.exit_json(changed=True, build_id=build_id, stage_dir=stage_dir, manifest={})

    builder = Builder(module)
    work_dir = os.path.join(params["build_root"], "work", build_id)
    builder.compile(work_dir, args, targets)
    tmp = builder.stage(work_dir, stage_dir, targets)
    builder.check_runs(tmp)
    manifest = manifest_for(params, build_id, args, targets, rpc_name, tmp, builder.version(tmp), builder.server_options(tmp))
    with open(os.path.join(tmp, "manifest.json"), "w") as handle:
        json.dump(manifest, handle, indent=2, sort_keys=True)
        handle.write("\n")
    shutil.rmtree(stage_dir, ignore_errors=True)
    os.rename(tmp, stage_dir)
    module.exit_json(changed=True, build_id=build_id, stage_dir=stage_dir, manifest=manifest, steps=builder.log)


if __name__ == "__main__":
    main()
