#!/usr/bin/python
"""Write the bench report on the controller: results.json, summary.md, bench.png."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_report
short_description: Write the bench results, a summary table and a plot
description:
  - Writes C(results.json) (every setup's rows and settings, the roofline), C(summary.md) (prefill and decode
    per setup and depth, the decode beside the roofline as a fraction) and C(bench.png) (prefill and decode
    against depth, one line per setup; matplotlib, Agg) in O(dest).
version_added: "1.0.0"
author: minimax-spark
options:
  dest:
    description: The output folder (created).
    type: path
    required: true
  setups:
    description: "C([{name, settings, rows: [{depth, pp, tg}]}]) as bench_run returns them."
    type: list
    elements: dict
    required: true
  roofline:
    description: Decode roofline, tok/s (0 for unknown).
    type: float
    default: 0
  meta:
    description: Facts printed at the top (endpoint, model, date, bandwidth, winner...).
    type: dict
    default: {}
notes:
  - Needs matplotlib on the controller. Check mode writes nothing.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reads the rows and reports what it would write; writes nothing.
"""

EXAMPLES = r"""
- name: Write the report
  bench_report:
    dest: bench-results/2026-12-03T08-00-00
    setups: "{{ runs }}"
    roofline: 28.4
  delegate_to: localhost
"""

RETURN = r"""
json: {description: Path of results.json., type: str, returned: success}
summary: {description: Path of summary.md., type: str, returned: success}
plot: {description: Path of bench.png., type: str, returned: success}
summary_text: {description: The summary table., type: str, returned: success}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_bench_report import summary_markdown, write_report


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            setups=dict(type="list", elements="dict", required=True),
            roofline=dict(type="float", default=0),
            meta=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    roofline = p["roofline"] or None
    if module.check_mode:
        module.exit_json(changed=True, summary_text=summary_markdown(p["setups"], roofline, p["meta"]))
    try:
        paths = write_report(p["dest"], p["setups"], roofline, p["meta"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg="Could not write the bench report in %s: %s" % (p["dest"], exc))
    module.exit_json(changed=True, **paths)


def main():
    run_module()


if __name__ == "__main__":
    main()
