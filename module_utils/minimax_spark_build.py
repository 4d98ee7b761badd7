"""Build engine of the llamacpp_build module: CMake options, build id, compile, stage and manifest.

* ``cmake_args(params)``, ``build_targets(params, rpc_name)`` and ``build_id_for(tree, args, targets)``: what a
  build is and its name; ``source_tree_sha256(src)``: the hash of the source tree a build reads (the build id
  follows it); ``rpc_protocol(src)``: the RPC protocol version the tree speaks.
* ``stage_verifies(stage_dir)``: the staged manifest, when every file it lists still has its sha256.
* ``Builder(module)``: configures and builds with CMake (Ninja, ccache) in ``<work>/build`` from the tree linked
  into ``<work>/source``, stages the binaries and their libraries, proves they run from the stage, asks the server
  its version and options.
* ``manifest_for(...)``: the manifest written beside the staged binaries.

Modules import it as ``from ansible.module_utils.minimax_spark_build import ...``.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import time

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
MANIFEST_VERSION = 5
# What the source tree hash leaves out: git's own folder (a checkout has one, an archive has none or a gitfile)
# and the marker build_llamacpp writes into a finished tree (it names how the tree was obtained).
TREE_SKIP = ".git"
SOURCE_MARKER = ".minimax-spark-source.json"
# The RPC protocol version (ggml/include/ggml-rpc.h): a client refuses a server of another major version.
RPC_HEADER = os.path.join("ggml", "include", "ggml-rpc.h")
RPC_PROTO = re.compile(r"^\s*#\s*define\s+RPC_PROTO_(MAJOR|MINOR|PATCH)_VERSION\s+(\d+)", re.M)


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


def build_targets(params, rpc_name):
    """The CMake targets: llama-server (unless ``server`` is false), the RPC server, then the extra ``targets``.

    A group of nodes that runs no llama-server (workers of another CPU architecture than the head) builds the RPC
    server alone: ggml, its CPU backend and ggml-rpc, about a sixth of the objects.
    """
    first = [SERVER, rpc_name] if params.get("server", True) else [rpc_name]
    return first + [t for t in params["targets"] if t not in (SERVER, rpc_name)]


def source_tree_sha256(src):
    """sha256 naming the content of a source tree, whatever it came from (archive, git checkout).

    Every regular file and symbolic link under ``src`` except ``.git`` (at any depth) and the top-level
    ``SOURCE_MARKER``, sorted by relative path (bytes, ``/`` separated), gives one line
    ``<mode> <sha256> <path>\n``: mode ``100755`` for a file with any execute bit, ``100644`` for another file
    (its sha256 is its content's), ``120000`` for a link (the sha256 of its target). Empty folders, owners, times
    and the other permission bits are not part of it (git does not keep them either). The hash is the sha256 of
    those lines.
    """
    src, skip, marker = os.fsencode(src), os.fsencode(TREE_SKIP), os.fsencode(SOURCE_MARKER)
    entries = []
    for top, dirs, files in os.walk(src):  # links to folders are listed in dirs, never followed
        dirs[:] = [d for d in dirs if d != skip]
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, src).replace(os.sep.encode(), b"/")
            if name == skip or rel == marker:
                continue
            if os.path.islink(path):
                entries.append((rel, b"120000", hashlib.sha256(os.readlink(path)).hexdigest().encode()))
            elif os.path.isfile(path):
                mode = b"100755" if os.stat(path).st_mode & 0o111 else b"100644"
                entries.append((rel, mode, sha256_file(path).encode()))
    digest = hashlib.sha256()
    for rel, mode, sha in sorted(entries):
        digest.update(b"%s %s %s\n" % (mode, sha, rel))
    return digest.hexdigest()


def rpc_protocol(src):
    """The RPC protocol version (``major.minor.patch``) of the tree's ggml-rpc header; None without one."""
    try:
        with open(os.path.join(src, RPC_HEADER)) as handle:
            found = dict(RPC_PROTO.findall(handle.read()))
    except OSError:
        return None
    if set(found) != {"MAJOR", "MINOR", "PATCH"}:
        return None
    return "%d.%d.%d" % (int(found["MAJOR"]), int(found["MINOR"]), int(found["PATCH"]))


def build_id_for(tree, args, targets):
    """The build's name: the source tree's hash (``source_tree_sha256``), the CMake arguments, the targets and the
    CPU architecture. How the tree was obtained (archive or git) is not part of it: the same tree is one build."""
    identity = {
        "source_tree_sha256": tree,
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


def link_tree(src, dest):
    """Lay out ``dest`` afresh as the tree at ``src``: hard links (unchanged files keep their inode and mtime, so
    an incremental build stays incremental), or copies where ``src`` is on another file system. A layout cut short
    is laid out again by the next compile."""
    shutil.rmtree(dest, ignore_errors=True)
    try:
        shutil.copytree(src, dest, symlinks=True, copy_function=os.link)
    except (OSError, shutil.Error):
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest, symlinks=True)


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

    def env(self, work_dir):
        ccache = self.params["ccache_dir"]
        if not ccache:
            return {}
        # Paths under the work folder enter ccache's keys relative to it, and every build reads its tree from
        # <work>/source: builds of other options or of another tree (a patch added) hit for every file they share.
        return {
            "CCACHE_DIR": ccache,
            "CCACHE_BASEDIR": work_dir,
            "CCACHE_NOHASHDIR": "true",
            "CCACHE_MAXSIZE": "10G",
        }

    def compile(self, work_dir, args, targets):
        """Configure and build in <work>/build from <work>/source, the tree as hard links (a copy where the
        cache cannot link to it)."""
        params = self.params
        if os.path.exists(os.path.join(work_dir, "CMakeCache.txt")):
            shutil.rmtree(work_dir)  # configured in place from the tree's own folder by an earlier version
        source, build = os.path.join(work_dir, "source"), os.path.join(work_dir, "build")
        link_tree(params["src"], source)
        configure = ["cmake", "-S", source, "-B", build] + args
        if self.module.get_bin_path("ninja") and not os.path.exists(os.path.join(build, "Makefile")):
            configure += ["-G", "Ninja"]
        if params["ccache_dir"] and self.module.get_bin_path("ccache"):
            configure += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            if params["cuda"]:
                configure.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
        env = self.env(work_dir)
        self.run(configure, env=env)
        jobs = params["jobs"] or os.cpu_count() or 1
        self.run(["cmake", "--build", build, "--target"] + targets + ["-j", str(jobs)], env=env)
        return build

    def stage(self, build, stage_dir, targets, rpc_name):
        """Copy binaries and libraries (keeping SONAME links) to a fresh stage, then move it in place."""
        bin_src = os.path.join(build, "bin")
        tmp = stage_dir + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(os.path.join(tmp, "bin"))
        wanted = set(targets)
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

    def check_runs(self, tmp, targets):
        """The staged servers start from their own folder with a clean environment (proves RUNPATH)."""
        for name in [SERVER] * (SERVER in targets) + [RPC_NAMES[0]]:
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


def manifest_for(params, build_id, args, targets, rpc_name, tmp, version, server_options, tree):
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
        "source_tree_sha256": tree,
        "rpc_protocol": rpc_protocol(params["src"]),
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
        "patches": [{"name": p.get("name") or os.path.basename(p.get("src") or ""), "sha256": p.get("sha256")}
                    for p in params.get("patches") or []],
        "rpc_hash_file": has_hash_file,
        "m3_layer_inputs": m3_layer_inputs(params["src"]),
        "files": files,
    }
