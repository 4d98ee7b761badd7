"""What the roles read on the controller in-process (filter_plugins/minimax_controller.py).

The build a run asks for names its source archive by sha256 (minimax_controller_sha256): another archive under the
same name, rewritten the way a download tool replaces a file, names another build; a path that is not a file on the
controller names none (the role then says the archive does not exist). common copies the controller's gguf package
to the nodes from where minimax_controller_package finds it, under its installed version."""
import hashlib
import os
import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "filter_plugins"))
from minimax_controller import controller_package, controller_sha256  # noqa: E402


def test_the_sha256_follows_the_content_under_the_name(tmp_path):
    archive = tmp_path / "llama.cpp-source.tar.gz"
    archive.write_bytes(b"one tree\n" * 300000)  # several read blocks
    first = controller_sha256(str(archive))
    assert first == hashlib.sha256(archive.read_bytes()).hexdigest()
    # curl -o tmp && mv tmp name: a new inode, same name, same size, other content
    replacement = tmp_path / ".download"
    replacement.write_bytes(b"two tree\n" * 300000)
    os.replace(replacement, archive)
    assert controller_sha256(str(archive)) == hashlib.sha256(b"two tree\n" * 300000).hexdigest() != first


def test_a_path_that_is_not_a_regular_file_names_no_archive(tmp_path):
    assert controller_sha256(str(tmp_path / "missing.tar.gz")) == ""
    assert controller_sha256(str(tmp_path)) == ""
    (tmp_path / "link.tar.gz").symlink_to(tmp_path / "gone.tar.gz")
    assert controller_sha256(str(tmp_path / "link.tar.gz")) == ""


def test_a_home_relative_path_is_read_from_the_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "src.tar.gz").write_bytes(b"tree")
    assert controller_sha256("~/src.tar.gz") == hashlib.sha256(b"tree").hexdigest()


def test_the_package_is_found_where_python_imports_it_with_its_installed_version(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "fakepkg_r34").mkdir(parents=True)
    (site / "fakepkg_r34" / "__init__.py").write_text("raise ImportError('found without importing it')\n")
    meta = site / "fakepkg_r34-1.2.3.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: fakepkg_r34\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(site))
    assert controller_package("fakepkg_r34") == {"path": str(site / "fakepkg_r34"), "version": "1.2.3"}


def test_a_package_the_controller_lacks_or_never_installed_is_none(tmp_path, monkeypatch):
    assert controller_package("no_such_package_r34") == {}
    (tmp_path / "loose_r34").mkdir()  # on the path, but no distribution installed it: no version to copy under
    (tmp_path / "loose_r34" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert controller_package("loose_r34") == {}
