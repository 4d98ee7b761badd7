"""tools/gpu-check's offline workaround: it recognises a failure at any of the roles' apt tasks by reading the
roles (the task that failed on the H200 was renamed once already), and nothing else."""
import subprocess
import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import apt_failure

ROLES = str(ROOT / "roles")


def test_the_roles_apt_tasks_are_found_where_they_are():
    names = apt_failure.apt_task_names(ROLES)
    # every role installs through common's packages entry point: its one apt task is the one that fails offline
    assert names == {"common : Install the packages that are missing"}


def test_an_apt_task_inside_a_block_is_found(tmp_path):
    tasks = tmp_path / "roles" / "r" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text("- name: A block\n  block:\n    - name: Install it\n"
                                    "      ansible.builtin.apt:\n        name: x\n    - name: Not apt\n"
                                    "      ansible.builtin.debug:\n")
    assert apt_failure.apt_task_names(str(tmp_path / "roles")) == {"r : Install it"}


def test_offline_apt_failure_of_the_common_role_is_recognised():
    log = ("TASK [common : Create the project folders] ***\nok: [localhost]\n"
           "TASK [common : Install the packages that are missing] ***\n"
           "fatal: [localhost]: FAILED! => {\"msg\": \"No package matching 'iproute2' is available\"}\n")
    assert apt_failure.failed_apt_task(log, ROLES) == "common : Install the packages that are missing"


def test_apt_error_message_counts_even_under_another_name():
    log = "TASK [x : Something new] ***\nfatal: [h]: FAILED! => {\"msg\": \"python3-apt must be installed\"}\n"
    assert apt_failure.failed_apt_task(log, ROLES) == "x : Something new"


def test_other_failures_are_not_hidden():
    log = ("TASK [build_llamacpp : Build llama.cpp] ***\nfatal: [localhost]: FAILED! => {\"msg\": \"nvcc fatal\"}\n"
           "TASK [common : Install the packages that are missing] ***\nfatal: [h]: FAILED! => {}\n")
    assert apt_failure.failed_apt_task(log, ROLES) is None


def test_the_script_says_it_on_its_exit_status(tmp_path):
    log = tmp_path / "log"
    log.write_text("TASK [common : Install the packages that are missing] ***\nfatal: [h]: FAILED! => {}\n")
    out = subprocess.run([sys.executable, str(ROOT / "tests/gpu/apt_failure.py"), str(log)], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.strip() == "common : Install the packages that are missing"
    log.write_text("TASK [a : b] ***\nok: [h]\n")
    assert subprocess.run([sys.executable, str(ROOT / "tests/gpu/apt_failure.py"), str(log)]).returncode == 1


def test_gpu_check_dry_run_lists_its_steps_without_a_gpu():
    out = subprocess.run([str(ROOT / "tools/gpu-check"), "dry-run"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for step in ("playbooks/build.yml", "site.yml --skip-tags verify", "site.yml --tags verify", "playbooks/bench.yml",
                 "tests/gpu/bench_servers.py"):
        assert step in out.stdout
    # bench.yml with the sweep in a call of its own; the GB10's CUDA code built beside the H200's
    assert "bench would run playbooks/bench.yml alone (sweep=true) against run's deployment" in out.stdout
    assert ("arch would build: ansible-playbook playbooks/build.yml -e '{\"build_llamacpp_cuda_architectures\": "
            "\"121\"}', then cuobjdump --list-elf") in out.stdout
