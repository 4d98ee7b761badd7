#!/usr/bin/python
"""Measure a link with an iperf3 client against a server the caller started (iperf3 -s)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: link_probe
short_description: Measure throughput and round-trip time to an iperf3 server
description:
  - Runs C(iperf3 -c HOST -p PORT -t SECONDS -J) from this node (the head) to a worker where the caller
    started C(iperf3 -s) for this measurement, and returns the rate the receiver counted and the
    sender's mean round-trip time. Changes nothing; in check mode it measures nothing and says so.
  - iperf3 3.11-3.12 can end a client run with exit status 0 and no report at all. Such a run is tried
    again, up to O(attempts) runs in all, with a warning that names what the failed run printed; a run
    that reports an error (refused, timed out, the server busy) fails at once with iperf3's error.
version_added: "1.0.0"
author: minimax-spark
options:
  host:
    description: The worker's RPC address (the path RPC takes).
    type: str
    required: true
  port:
    description: The iperf3 server's TCP port.
    type: int
    default: 5201
  seconds:
    description: How long to send (iperf3 C(-t)).
    type: int
    default: 3
  connect_timeout:
    description: Milliseconds to wait for the server to answer.
    type: int
    default: 5000
  attempts:
    description:
      - Client runs at most, where a run gives no report at all (neither figures nor an error). More than 1
        needs a server that takes that many clients (C(iperf3 -s) without C(--one-off)).
    type: int
    default: 1
notes:
  - Needs C(iperf3) on both ends (Debian/Ubuntu package C(iperf3)).
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: partial
    details: In check mode nothing is measured (the result says skipped); it never changes anything.
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Measure the link to a worker for 3 s
  link_probe:
    host: 192.168.100.11
    port: 5201
    seconds: 3
  delegate_to: spark-1
  register: probe
"""

RETURN = r"""
gbit_s:
  description: Throughput head -> worker as the receiver counted it, Gbit/s (10^9 bits).
  returned: success
  type: float
  sample: 94.1
mean_rtt_ms:
  description: The sender's mean TCP round-trip time, ms (null where the kernel gives none).
  returned: success
  type: float
retransmits:
  description: TCP retransmissions during the run.
  returned: success
  type: int
seconds:
  description: How long the measurement ran.
  returned: success
  type: float
attempts:
  description: Client runs it took (more than 1 where a run gave no report; each such run is in a warning).
  returned: when iperf3 ran (not in check mode), on failure too
  type: int
  sample: 1
retried:
  description: What each client run that gave no report printed (its exit status, stdout and stderr), in order.
  returned: when iperf3 ran (not in check mode), on failure too
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_link import NoResult, parse_iperf3


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", required=True),
            port=dict(type="int", default=5201),
            seconds=dict(type="int", default=3),
            connect_timeout=dict(type="int", default=5000),
            attempts=dict(type="int", default=1),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: nothing measured")
    if not 1 <= params["port"] <= 65535 or params["seconds"] < 1 or params["attempts"] < 1:
        module.fail_json(msg="port must be 1-65535, seconds and attempts at least 1 (got %s, %s, %s)"
                         % (params["port"], params["seconds"], params["attempts"]))
    iperf3 = module.get_bin_path("iperf3")
    if iperf3 is None:
        module.fail_json(msg="iperf3 is not installed on this node: install the iperf3 package (the common role does)")
    argv = [iperf3, "-c", params["host"], "-p", str(params["port"]), "-t", str(params["seconds"]), "-J",
            "--connect-timeout", str(params["connect_timeout"])]
    retried = []
    for attempt in range(1, params["attempts"] + 1):
        rc, out, err = module.run_command(argv)
        try:
            result = parse_iperf3(out)
            break
        except ValueError as exc:
            # iperf3 3.11-3.12 exits 0 with -J even when the run failed: its exit status and output say what happened.
            failure = "%s (exit %s; %s)" % (exc, rc, said(out, err))
            if isinstance(exc, NoResult) and attempt < params["attempts"]:
                retried.append(failure)
                module.warn("iperf3 to %s:%s, run %d of %d: %s; measuring again"
                            % (params["host"], params["port"], attempt, params["attempts"], failure))
                continue
            module.fail_json(msg="iperf3 to %s:%s failed: %s" % (params["host"], params["port"], failure),
                             rc=rc, stdout=out, stderr=err, cmd=argv, attempts=attempt, retried=retried)
    module.exit_json(changed=False, cmd=argv, attempts=attempt, retried=retried, **result)


def said(out, err):
    """The end of what iperf3 printed, on stdout and (where anything) on stderr, each on one line."""
    out, err = " ".join((out or "").split()), " ".join((err or "").split())
    text = "its output ends: %s" % out[-400:] if out else "its output is empty"
    return text + ("; on stderr: %s" % err[-300:] if err else "")


if __name__ == "__main__":
    main()
