"""A deployment left on the machine that runs tools/test is untouched by it: the same serving processes (PID, argv,
start time), the same local facts, the same installs as tools/test saved before its tests (MINIMAX_SPARK_HOST_BEFORE);
no deployment process appeared here. tools/test runs this last, on this machine."""
import json
import os
from pathlib import Path

import pytest

import host_state  # tests/support


def test_the_deployment_on_this_machine_is_untouched_by_the_tests():
    saved = os.environ.get("MINIMAX_SPARK_HOST_BEFORE")
    if not saved:
        pytest.fail("MINIMAX_SPARK_HOST_BEFORE is not set: tools/test saves this machine's state before the tests "
                    "(python tests/support/host_state.py save FILE) and runs this test after them")
    before = json.loads(Path(saved).read_text())
    print("this machine before the tests: %d serving processes, facts %s" % (
        len(before["processes"]), ", ".join(before["facts"]) or "none"))
    assert host_state.differences(before, host_state.snapshot()) == []
