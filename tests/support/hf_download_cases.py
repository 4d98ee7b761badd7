"""What the hf_download tests share: the fake repo's files, the module's arguments against the fake Hub, the
checks of a verified or a cleanly failed download, and the module run in a process of its own.

Imported by tests/unit/test_hf_download.py and test_hf_download_writer.py (tests/support is on sys.path).
"""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_SeCrEtToKeN1234567890"
QUANT = "UD-IQ4_XS"
SHARD1 = "%s/MiniMax-M3-%s-00001-of-00002.gguf" % (QUANT, QUANT)
SHARD2 = "%s/MiniMax-M3-%s-00002-of-00002.gguf" % (QUANT, QUANT)
SIZES = {SHARD1: 3_000_000, SHARD2: 1_500_123, "UD-Q4_K_XL/MiniMax-M3-UD-Q4_K_XL.gguf": 200_000, "README.md": 0}
INCLUDE = ["%s/*.gguf" % QUANT]

# A subprocess runs the module like helpers.run_module does in-process, so it can be killed mid-download.
RUNNER = """
import json, sys
import ansible.module_utils
ansible.module_utils.__path__.append(%(module_utils)r)
sys.path.insert(0, %(library)r)
from ansible.module_utils.testing import patch_module_args
import hf_download
with patch_module_args(json.load(open(sys.argv[1]))):
    hf_download.main()
"""


def module_args(hub, dest, **extra):
    args = {
        "repo": "unsloth/MiniMax-M3-GGUF",
        "include": INCLUDE,
        "dest": str(dest),
        "endpoint": hub.url,
        "connections": 4,
        "part_size": 256 * 1024,
        "buffer_size": 64 * 1024,
        "max_retry_after": 5,
        "stall_timeout": 5,
    }
    args.update(extra)
    return args


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def assert_verified(result, dest, repo_dir, paths=(SHARD1, SHARD2)):
    assert not result.get("failed"), result.get("msg")
    for rel in paths:
        assert (dest / rel).read_bytes() == (repo_dir / rel).read_bytes(), rel
        assert not leftovers(dest, rel)
    assert {f["path"]: f["sha256"] for f in result["files"]} == {rel: sha256(repo_dir / rel) for rel in paths}


def assert_failed_clean(result, dest, paths=(SHARD1, SHARD2)):
    """A failure says why and leaves nothing at any final path."""
    assert result.get("failed"), result
    assert result["msg"]
    for rel in paths:
        assert not (dest / rel).exists(), rel


def leftovers(dest, rel):
    path = dest / rel
    candidates = (path.parent / (".%s.partial" % path.name), path.parent / (".%s.partial.json" % path.name))
    return [p for p in candidates if p.exists()]


def start_module_process(args, tmp_path):
    """hf_download in a process of its own (so a test can kill it mid-download), reading args from a file."""
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps(args))
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER % {"module_utils": str(ROOT / "module_utils"), "library": str(ROOT / "library")})
    return subprocess.Popen([sys.executable, str(runner), str(args_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
