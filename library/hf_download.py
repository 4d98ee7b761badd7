#!/usr/bin/python
"""Resumable, verified, parallel download of files from a Hugging Face model repo."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_download
short_description: Download files of a Hugging Face model repo, resumably, in parallel, verified by sha256
description:
  - Resolves O(revision) to a commit, lists the repo's files with their sizes and sha256 from the tree API and
    downloads those matching O(include) below O(dest), keeping their repo paths.
  - Each file is fetched with O(connections) parallel range requests into one partial file beside the
    destination (C(.<name>.partial), with a JSON journal C(.<name>.partial.json)). A killed or failed run resumes
    from what the journal says is on disk. Expired signed links are resolved again, 429 answers are retried
    after their Retry-After, truncated, reset or stalled connections are retried from the last byte received,
    and a server that ignores Range is read as a single stream.
  - A file takes its final name (atomic rename) only after its size and sha256 match the Hub's. A mismatch
    downloads the file once more, then fails; a corrupt file never reaches the final path.
  - A file already present with the right size and sha256 is not touched. The verification is cached in a
    sidecar C(.<name>.verified) (size, mtime, sha256) so reruns do not hash hundreds of GB again.
  - The token is sent to the Hub host only, never to the CDN that serves the bytes.
  - The engine lives in C(module_utils/minimax_spark_download*.py); this file holds the interface.
version_added: "1.0.0"
author: minimax-spark
requirements:
  - requests (with urllib3) on the managed node
options:
  state:
    description:
      - V(present) downloads. Only one downloader writes to a O(dest) at a time; it holds an exclusive lock
        (C(flock) on C(<dest>/.hf_download.lock)) for its whole life, and a second one fails at once, naming the
        first (pid, progress file). SIGTERM and SIGINT stop it cleanly (connections end, journal checkpointed).
      - V(query) reports whether a downloader holds O(dest) (RV(running), RV(pid)) and changes nothing, except
        that a O(progress_file) left at C(downloading) by a process that died (kill -9) is set to C(interrupted).
      - V(stopped) sends SIGTERM to the downloader holding O(dest) and waits until it saved its parts and let go;
        a later V(present) run resumes them.
    type: str
    choices: [present, query, stopped]
    default: present
  repo:
    description:
      - Repo id, C(namespace/name) (letters, digits, C(-), C(_), C(.); no C(..)); checked before any request.
      - Required with O(state=present).
    type: str
  revision:
    description: Branch, tag or commit sha. Resolved to a commit once; every file is fetched at that commit.
    type: str
    default: main
  include:
    description:
      - Glob patterns (fnmatch, C(*) also matches C(/)) on repo paths; a file is downloaded when one matches.
      - The module fails when no file of the repo matches.
    type: list
    elements: str
    default: ['*']
  exclude:
    description: Glob patterns of repo paths to leave out, applied after O(include).
    type: list
    elements: str
    default: []
  dest:
    description: Directory the files go to; each file keeps its repo path below it.
    type: path
    required: true
  endpoint:
    description: Hub URL. Defaults to the environment variable E(HF_ENDPOINT), then C(https://huggingface.co).
    type: str
  token:
    description:
      - Hub token (needed for gated and private repos). Defaults to the environment variable E(HF_TOKEN).
      - Sent to the Hub host only, never to the CDN; never returned or logged.
    type: str
  token_file:
    description:
      - File on the managed node whose first line is the Hub token; read by the module on the node, so the token
        is never part of the module's arguments (which Ansible keeps in temporary files while an async job
        runs). Takes precedence over O(token).
    type: path
  connections:
    description: Parallel range requests per file.
    type: int
    default: 16
  part_size:
    description: Bytes each range request asks for (the unit of work handed to a connection).
    type: int
    default: 67108864
  buffer_size:
    description:
      - Bytes each connection collects in its own reusable buffer (socket reads go straight into it) before
        writing them to disk with one call. Memory used is about O(connections) times this.
      - A slow connection does not wait for a full buffer; what it received is written about once a second,
        and always before the connection is retried or given up.
    type: int
    default: 4194304
  stall_timeout:
    description: Seconds a connection may go without receiving a byte before it is dropped and retried.
    type: float
    default: 60
  connect_timeout:
    description: Seconds to wait for a TCP/TLS connection.
    type: float
    default: 30
  max_retries:
    description:
      - Consecutive failed attempts (errors, expired links, 429, truncated bodies) of one range without any byte
        received before the download fails. Any progress resets the count.
    type: int
    default: 10
  max_retry_after:
    description: Longest wait, in seconds, honoured from a Retry-After header.
    type: float
    default: 120
  progress_file:
    description:
      - JSON file rewritten every O(progress_interval) seconds while the module runs (state, bytes done, total,
        percent, MB/s, current file), for a role polling an async run. Not written in check mode.
    type: path
  progress_interval:
    description: Seconds between two writes of O(progress_file).
    type: float
    default: 5
  verify_cache:
    description:
      - Trust the C(.<name>.verified) sidecar of a present file whose size and mtime did not change, instead of
        hashing it again. V(false) hashes every present file.
    type: bool
    default: true
notes:
  - Supports check mode (reports what would be downloaded, writes nothing) and diff mode.
  - Files over 50 GB are fine; there is no size limit and no whole-file buffering.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Lists what would be downloaded (RV(bytes_to_download)); fetches and writes nothing.
  diff_mode:
    support: full
    details: The list of files before and after the download.
"""

EXAMPLES = r"""
- name: Download the UD-IQ4_XS shards of MiniMax-M3
  hf_download:
    repo: unsloth/MiniMax-M3-GGUF
    include: ["UD-IQ4_XS/*.gguf"]
    dest: /var/lib/minimax-spark/models
    token: "{{ hf_token | default(omit) }}"
    progress_file: /var/lib/minimax-spark/models/.hf_download.progress.json
  async: 21600
  poll: 0
  register: model_job
"""

RETURN = r"""
commit:
  description: Commit the revision resolved to; every file was fetched at it.
  returned: always
  type: str
files:
  description: The selected files.
  returned: always
  type: list
  elements: dict
  contains:
    path: {description: Repo path, type: str}
    dest: {description: Local path, type: str}
    size: {description: Size in bytes, type: int}
    sha256: {description: sha256 of the content, type: str}
    changed: {description: Whether this run downloaded (or would download) the file, type: bool}
bytes_downloaded:
  description: Bytes received from the network by this run (0 when nothing changed and in check mode).
  returned: always
  type: int
bytes_to_download:
  description: Bytes still missing before the run (what check mode would fetch).
  returned: always
  type: int
total_bytes:
  description: Size of all selected files.
  returned: always
  type: int
elapsed:
  description: Seconds the module ran.
  returned: always
  type: float
throughput:
  description: Bytes per second received while downloading (0 when nothing was downloaded).
  returned: always
  type: float
running:
  description: Whether a downloader holds O(dest) (before a stop, for O(state=stopped)).
  returned: state is query or stopped
  type: bool
pid:
  description: Process id of that downloader.
  returned: state is query or stopped and a downloader held O(dest)
  type: int
progress_state:
  description: The state the O(progress_file) holds (C(downloading), C(done), C(failed), C(stopped), C(interrupted)).
  returned: state is query or stopped
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib
from ansible.module_utils.minimax_spark_download import DownloadError
from ansible.module_utils.minimax_spark_download_fetch import DEFAULTS
from ansible.module_utils.minimax_spark_download_run import Downloader, describe_error, query, settle_progress, stop
from ansible.module_utils.minimax_spark_http import HAS_REQUESTS, REQUESTS_IMPORT_ERROR, HubError

ARGUMENT_SPEC = dict(
    state=dict(type="str", choices=["present", "query", "stopped"], default="present"),
    repo=dict(type="str"),
    revision=dict(type="str", default="main"),
    include=dict(type="list", elements="str", default=["*"]),
    exclude=dict(type="list", elements="str", default=[]),
    dest=dict(type="path", required=True),
    endpoint=dict(type="str", fallback=(env_fallback, ["HF_ENDPOINT"])),
    token=dict(type="str", no_log=True, fallback=(env_fallback, ["HF_TOKEN"])),
    token_file=dict(type="path"),
    progress_file=dict(type="path"),
    progress_interval=dict(type="float", default=5.0),
    verify_cache=dict(type="bool", default=True),
)
# The engine's tunables: one table (DEFAULTS) for the argument spec and the engine's Settings.
ARGUMENT_SPEC.update({name: dict(type=kind.__name__, default=value) for name, (kind, value) in DEFAULTS.items()})


def diff_of(result):
    files = result["files"]
    return {
        "before": "".join("%s\n" % f["path"] for f in files if not f["changed"]),
        "after": "".join("%s\n" % f["path"] for f in files),
    }


def manage_holder(module):
    """state=query and state=stopped: report (and stop) the downloader holding dest."""
    params = module.params
    holder = query(params["dest"])
    changed = False
    if params["state"] == "stopped" and holder["running"]:
        changed = True
        if not module.check_mode:
            stop(params["dest"])
    running_now = holder["running"] and not (changed and not module.check_mode)
    progress_file = params.get("progress_file") or holder.get("progress_file")
    progress_state = settle_progress(progress_file, running_now or module.check_mode)  # check mode writes nothing
    result = dict(changed=changed, running=holder["running"], progress_state=progress_state)
    if holder.get("pid"):
        result["pid"] = holder["pid"]
    return result


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("state", "present", ["repo"])],
        supports_check_mode=True,
    )
    if not HAS_REQUESTS:
        module.fail_json(msg=missing_required_lib("requests"), exception=str(REQUESTS_IMPORT_ERROR))
    try:
        if module.params["state"] != "present":
            module.exit_json(**manage_holder(module))
        result = Downloader(module.params, module.check_mode, move=module.atomic_move).run()
    except (DownloadError, HubError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=describe_error(exc, module.params["dest"]))
    if module._diff:
        result["diff"] = diff_of(result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
