"""Tests that download something (docs/testing.md, "Downloads": what is fetched and why) carry the marker
`@pytest.mark.downloads("what")`. Offline such a test skips, and its skip says so in the summary
(`needs a download (what): why it skipped`). With HF_OUTHEADS_REQUIRE_DOWNLOADS=1 (set by CI,
`.ci/run`) a skipped one fails instead: CI cannot pass without having run them.

The hooks are conftest.py's (imported there); tests/test_downloads.py checks them."""

from __future__ import annotations

import os

import pytest

REQUIRE = "HF_OUTHEADS_REQUIRE_DOWNLOADS"


def pytest_configure(config):
    config.addinivalue_line("markers", "downloads(what): the test downloads `what`; offline it skips saying so, "
                                       f"and with {REQUIRE}=1 (CI) a skip is a failure")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    marker = item.get_closest_marker("downloads")
    if marker is None or not report.skipped or hasattr(report, "wasxfail"):
        return
    path, line, reason = report.longrepr
    reason = f"needs a download ({marker.args[0]}): {reason.removeprefix('Skipped: ')}"
    if os.environ.get(REQUIRE) == "1":
        report.outcome = "failed"
        report.longrepr = f"{reason}\n{REQUIRE}=1: a test that downloads must run here, not skip."
    else:
        report.longrepr = (path, line, reason)
