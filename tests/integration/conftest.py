"""The integration tests deploy services, ports, firewall rules and local facts: they run on a node of their own
(tests/support/own-root.sh, as tools/test runs them), never on the machine that runs pytest."""
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in Path(str(item.path)).parents]
    if mine and os.environ.get("MINIMAX_SPARK_OWN_ROOT") != "node":
        raise pytest.UsageError(
            "the integration tests deploy onto the machine that runs them (services, ports 8891 and 50052, "
            "/etc/ansible/facts.d, /opt/minimax-spark): run them on a node of their own, as tools/test does "
            "(tools/test -k NAME, or tests/support/own-root.sh .venv/bin/python -m pytest tests/integration ...)")
