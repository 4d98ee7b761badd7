#!/usr/bin/python
"""Measure a link with an iperf3 client against a server the caller started (iperf3 -s -1)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: link_probe
short_description: Measure throughput and round-trip time to an iperf3 server
description:
  - Runs C(iperf3 -c HOST -p PORT -t SECONDS -J) from this node (the head) to a worker where the caller
    started C(iperf3 -s -1) for this one measurement, and returns the rate the receiver counted and the
    sender's mean round-trip time. Changes nothing; in check mode it measures nothing and says so.
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
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_link import parse_iperf3


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", required=True),
            port=dict(type="int", default=5201),
            seconds=dict(type="int", default=3),
            connect_timeout=dict(type="int", default=5000),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: nothing measured")
    if not 1 <= params["port"] <= 65535 or params["seconds"] < 1:
        module.fail_json(msg="port must be 1-65535 and seconds at least 1 (got %s, %s)"
                         % (params["port"], params["seconds"]))
    iperf3 = module.get_bin_path("iperf3")
    if iperf3 is None:
        module.fail_json(msg="iperf3 is not installed on this node: install the iperf3 package (the common role does)")
    argv = [iperf3, "-c", params["host"], "-p", str(params["port"]), "-t", str(params["seconds"]), "-J",
            "--connect-timeout", str(params["connect_timeout"])]
    rc, out, err = module.run_command(argv)
    try:
        result = parse_iperf3(out)
    except ValueError as exc:
        # iperf3 3.11-3.12 exits 0 with -J even when the run failed: its exit status and output say what happened.
        said = " ".join((out or "").split())
        module.fail_json(msg="iperf3 to %s:%s failed: %s (exit %s; its output %s)"
                         % (params["host"], params["port"], exc, rc,
                            "ends: %s" % said[-400:] if said else "is empty"),
                         rc=rc, stdout=out, stderr=err, cmd=argv)
    module.exit_json(changed=False, cmd=argv, **result)


if __name__ == "__main__":
    main()
