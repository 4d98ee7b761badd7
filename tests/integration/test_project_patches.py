"""build_llamacpp's project patches (build_llamacpp_project_patches): checked by sha256 before any source is laid out.

Check mode (nothing is built or written): a project patch whose file does not match its sha256 stops the build
with a message that names the variable, the file and both checksums.
"""
import hashlib

from helpers import ROOT, failed_tasks, run_playbook

PATCH = ROOT / "roles" / "build_llamacpp" / "files" / "patches" / "rpc-hash-sidecar.patch"


def test_a_project_patch_with_another_sha256_is_refused_naming_it():
    actual = hashlib.sha256(PATCH.read_bytes()).hexdigest()
    runner = run_playbook("playbooks/build.yml", tags=["build_llamacpp"], check=True, extravars={
        "build_llamacpp_project_patches": [{"name": "rpc-hash-sidecar", "src": str(PATCH), "sha256": "0" * 64}]})
    assert runner.status == "failed"
    msgs = [item.get("msg", "") for e in runner.event_list if e.get("event") == "runner_on_failed"
            for item in e["event_data"]["res"].get("results", [])]
    assert any("build_llamacpp_project_patches: %s has sha256 %s, expected %s" % (PATCH, actual, "0" * 64) in m
               for m in msgs), failed_tasks(runner)
