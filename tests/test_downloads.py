"""The `downloads` marker (tests/downloads.py): offline, a test that downloads skips saying so in
the summary; with HF_OUTHEADS_REQUIRE_DOWNLOADS=1 (CI) its skip is a failure. Checked on a small
suite of its own, run in a pytest of its own with the hooks of tests/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUITE = '''
import pytest

@pytest.mark.downloads("a file from nowhere")
def test_fetches():
    pytest.skip("nowhere cannot be reached")

@pytest.mark.downloads("a package")
@pytest.mark.skipif(True, reason="no package manager here")
def test_needs_a_package_manager():
    pass

def test_downloads_nothing():
    pytest.skip("a skip of another kind")
'''


def run_suite(tmp_path, **env) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text("from downloads import pytest_configure, pytest_runtest_makereport  # noqa\n")
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {**{k: v for k, v in os.environ.items() if k != "HF_OUTHEADS_REQUIRE_DOWNLOADS"},
           "PYTHONPATH": str(TESTS), **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsfE", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_offline_a_test_that_downloads_skips_saying_so(tmp_path):
    done = run_suite(tmp_path)
    assert done.returncode == 0 and "3 skipped" in done.stdout, done.stdout
    assert "needs a download (a file from nowhere): nowhere cannot be reached" in done.stdout
    assert "needs a download (a package): no package manager here" in done.stdout
    assert "needs a download" not in done.stdout.split("a skip of another kind")[0].splitlines()[-1]


def test_ci_fails_when_a_test_that_downloads_was_skipped(tmp_path):
    done = run_suite(tmp_path, HF_OUTHEADS_REQUIRE_DOWNLOADS="1")
    assert done.returncode == 1 and "1 failed, 1 skipped, 1 error" in done.stdout, done.stdout  # the skipif: in setup
    assert "FAILED test_suite.py::test_fetches" in done.stdout and "ERROR test_suite.py::test_needs_a_pack" in done.stdout
    assert "HF_OUTHEADS_REQUIRE_DOWNLOADS=1: a test that downloads must run here, not skip." in done.stdout


def test_every_test_that_downloads_carries_the_marker():
    """The tests that call a downloader (pip download, apt-get download through the corpus
    builders) are the marked ones."""
    downloaders = ("\"pip\", \"download\"", "fetch_packages(", "package_documents(")
    calling = {p.name for p in TESTS.glob("test_*.py") if any(d in p.read_text() for d in downloaders)}
    marked = {p.name for p in TESTS.glob("test_*.py") if "pytest.mark.downloads(" in p.read_text()}
    assert calling - {Path(__file__).name} == marked - {Path(__file__).name} == {
        "test_transformers_common.py", "test_manpages_l10n.py", "test_scale_corpus.py", "test_llama_cpp.py"}
