"""A run that ends without failing is a failure all the same when a collected test never reported: a
pytest-xdist worker that stops early (its loop ended by something that escaped a test's protocol) takes its
unrun tests with it, and the summary would still read "N passed". Registered by tests/conftest.py; on the
controller (or a run without workers) only, since each worker collects every test and runs a share."""

from __future__ import annotations

import pytest

_SHOWN = 20


class EveryTestReported:
    def __init__(self, distributed: bool):
        self.distributed = distributed
        self.expected: set[str] = set()
        self.reported: set[str] = set()

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids: list[str]) -> None:
        self.expected.update(ids)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not self.distributed:
            self.expected.update(item.nodeid for item in session.items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.reported.add(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus != pytest.ExitCode.OK:
            return  # a failure (or -x, or an interrupt) already says the run is not whole
        missing = sorted(self.expected - self.reported)
        if not missing:
            return
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(f"{len(missing)} of {len(self.expected)} collected tests never reported, e.g.:", red=True)
        for nodeid in missing[:_SHOWN]:
            writer.line(f"  {nodeid}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker
    distributed = bool(getattr(config.option, "numprocesses", None)) and config.pluginmanager.has_plugin("xdist")
    if getattr(config.option, "collectonly", False):
        return
    config.pluginmanager.register(EveryTestReported(distributed), "every-test-reported")
