"""The controller's commands start quietly: `ansible-playbook` from the project's venv (what tools/bootstrap.sh
installs from requirements.txt, as tools/demo does) prints no warning before the play's own output, so a warning a
user sees is about their run."""
import os
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

VENV = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv"))


@pytest.mark.parametrize("command", ["ansible-playbook", "ansible-doc"])
def test_an_ansible_command_prints_no_warning_at_start(command):
    run = subprocess.run([str(VENV / "bin" / command), "--version"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONWARNINGS="default"), timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr == "", run.stderr
    assert run.stdout.startswith(command + " [core 2.19."), run.stdout
