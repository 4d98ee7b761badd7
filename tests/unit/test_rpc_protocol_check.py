"""The head refuses workers whose recorded llama.cpp build speaks another RPC protocol (minimax_rpc_protocol_mismatch),
before anything stops: llama-server would otherwise load without them, on the head alone.

The protocol comes from the build manifest (``rpc_protocol``, read from the tree's ggml/include/ggml-rpc.h by
llamacpp_build); the check reads each worker's recorded build fact (``ansible_local.minimax_llamacpp``).
"""
from minimax_llamacpp import rpc_protocol_mismatch


def hostvars(**builds):
    return {name: {"ansible_local": {"minimax_llamacpp": build}} if build is not None else {}
            for name, build in builds.items()}


HEAD = {"build_id": "aaaa", "rpc_protocol": "7.0.0"}


def test_workers_of_the_same_protocol_pass():
    hv = hostvars(w1={"build_id": "aaaa", "rpc_protocol": "7.0.0"}, w2={"build_id": "bbbb", "rpc_protocol": "7.0.0"})
    assert rpc_protocol_mismatch(["w1", "w2"], hv, HEAD) == []


def test_a_worker_of_another_protocol_is_named_with_its_version_and_build():
    hv = hostvars(w1={"build_id": "aaaa", "rpc_protocol": "7.0.0"}, w2={"build_id": "cccc", "rpc_protocol": "8.0.0"},
                  w3={"build_id": "dddd", "rpc_protocol": "7.0.1"})
    assert rpc_protocol_mismatch(["w1", "w2", "w3"], hv, HEAD) == [
        {"worker": "w2", "rpc_protocol": "8.0.0", "build_id": "cccc"},
        {"worker": "w3", "rpc_protocol": "7.0.1", "build_id": "dddd"}]


def test_an_unrecorded_protocol_is_not_compared():
    hv = hostvars(w1={"build_id": "old"}, w2=None)
    assert rpc_protocol_mismatch(["w1", "w2"], hv, HEAD) == []
    assert rpc_protocol_mismatch(["w1"], hostvars(w1={"rpc_protocol": "8.0.0"}), {"build_id": "old"}) == []
    assert rpc_protocol_mismatch(None, {}, HEAD) == []


def test_an_install_folders_files_are_named_by_their_path_in_it():
    """build_llamacpp compares a find result with the manifest's files and records it as the fact's installed."""
    from minimax_llamacpp import sha256_by_path

    folder = "/opt/minimax-spark/llama.cpp/266212a1f60c007c"
    found = [{"path": folder + "/bin/llama-server", "checksum": "aa" * 32, "mode": "0755"},
             {"path": folder + "/manifest.json", "checksum": "bb" * 32},
             {"path": folder + "/bin/libggml.so.0", "checksum": "cc" * 32}]
    assert sha256_by_path(found, folder) == {"bin/llama-server": "aa" * 32, "manifest.json": "bb" * 32,
                                             "bin/libggml.so.0": "cc" * 32}
    assert sha256_by_path(found, folder + "/") == sha256_by_path(found, folder)
    assert sha256_by_path([], folder) == {} and sha256_by_path(None, folder) == {}
