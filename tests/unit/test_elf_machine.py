"""elf_machine: the install step's check that no binary crosses architectures (an x86_64 build on an
aarch64 DGX Spark, or back). ELF headers are written by hand with the e_machine of each CPU, and
the host's own python3 is read as the real thing."""
import os
import struct
import sys

import pytest
from ansible.module_utils.minimax_spark_elf import canonical_arch, check_machines, elf_header

import elf_machine
from helpers import run_module

X86_64, AARCH64 = 62, 183


def write_elf(path, machine, bits=64, order="little"):
    """An ELF header (all a reader needs): magic, class, byte order, version, then e_type and e_machine."""
    fmt = "<HH" if order == "little" else ">HH"
    ident = b"\x7fELF" + bytes([1 if bits == 32 else 2, 1 if order == "little" else 2, 1]) + bytes(9)
    path.write_bytes(ident + struct.pack(fmt, 3, machine) + bytes(44))
    return str(path)


def test_reads_the_architecture_of_each_cpu(tmp_path):
    assert elf_header(write_elf(tmp_path / "x", X86_64))["arch"] == "x86_64"
    assert elf_header(write_elf(tmp_path / "a", AARCH64))["arch"] == "aarch64"
    big = elf_header(write_elf(tmp_path / "s", 22, order="big"))
    assert (big["arch"], big["byte_order"]) == ("s390x", "big")
    assert elf_header(write_elf(tmp_path / "u", 9999))["arch"] == "e_machine 9999"


def test_the_hosts_own_interpreter_is_read_as_this_machine():
    real = os.path.realpath(sys.executable)
    assert elf_header(real)["arch"] == canonical_arch(os.uname().machine)


@pytest.mark.parametrize("name,canonical", [("arm64", "aarch64"), ("AARCH64", "aarch64"), ("amd64", "x86_64"),
                                            ("x86_64", "x86_64"), ("i686", "i386")])
def test_one_name_per_architecture(name, canonical):
    assert canonical_arch(name) == canonical


def test_a_file_that_is_not_elf_is_a_mismatch(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    arches, mismatches = check_machines([str(script), str(tmp_path / "gone")], "x86_64")
    assert arches == {str(script): None, str(tmp_path / "gone"): None}
    assert mismatches == ["%s is not an ELF file" % script,
                          "%s cannot be read: No such file or directory" % (tmp_path / "gone")]


def test_module_refuses_an_aarch64_binary_on_an_x86_64_node(tmp_path):
    good = write_elf(tmp_path / "libggml.so", X86_64)
    bad = write_elf(tmp_path / "llama-server", AARCH64)
    result = run_module(elf_machine.main, {"paths": [good, bad], "architecture": "x86_64"})
    assert result["failed"]
    assert result["msg"] == (
        "this node is x86_64, but %s is built for aarch64: binaries do not cross architectures; build on a node "
        "of this architecture (build_llamacpp builds once per architecture)" % bad)
    assert result["arches"] == {good: "x86_64", bad: "aarch64"}


def test_module_accepts_arm64_binaries_on_a_node_that_says_arm64(tmp_path):
    paths = [write_elf(tmp_path / name, AARCH64) for name in ("llama-server", "ggml-rpc-server")]
    result = run_module(elf_machine.main, {"paths": paths, "architecture": "arm64"}, check_mode=True)
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["architecture"] == "aarch64"
    assert set(result["arches"].values()) == {"aarch64"}


def test_module_refuses_an_empty_architecture(tmp_path):
    result = run_module(elf_machine.main, {"paths": [write_elf(tmp_path / "x", X86_64)], "architecture": " "})
    assert result["failed"]
    assert result["msg"] == "architecture is empty: pass the node's ansible_architecture"
