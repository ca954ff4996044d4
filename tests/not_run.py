"""What a test run did not run, said where it ends. pytest counts skipped tests in
its last line, which is easy to read past when they are a whole suite (the local
fleet skips without root): this names each file with skipped tests, how many, why,
and the command that runs them. tests/conftest.py installs the hook."""

from __future__ import annotations

import os

# As root, `make test` installs the system packages the tests use (tools/install-test-deps).
RUN_THEM = "sudo make test"


def skip_reason(report) -> str:
    """The reason a skipped test's report carries, without pytest's "Skipped: "."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def not_run_lines(skipped: list[tuple[str, str]], as_root: bool) -> list[str]:
    """One line per file from the (test id, skip reason) of each skipped test."""
    reasons_by_file: dict[str, list[str]] = {}
    for test_id, reason in skipped:
        reasons_by_file.setdefault(test_id.split("::")[0], []).append(reason)
    # A file skipped as it was collected has an id without "::": its tests were never counted.
    whole_files = {test_id for test_id, _ in skipped if "::" not in test_id}
    # Root already has what `sudo` would give: then only the reason can say what to fix.
    then = "fix that, then run: make test" if as_root else f"run: {RUN_THEM}"
    lines = []
    for path, reasons in sorted(reasons_by_file.items()):
        tests = len(reasons)
        count = "the whole file" if path in whole_files else f"{tests} test{'' if tests == 1 else 's'}"
        why = "; ".join(dict.fromkeys(reasons))  # each distinct reason once, in order
        lines.append(f"NOT RUN: {path} ({count}): {why}; {then}")
    return lines


def pytest_terminal_summary(terminalreporter) -> None:
    skipped = [(report.nodeid, skip_reason(report)) for report in terminalreporter.stats.get("skipped", [])]
    lines = not_run_lines(skipped, as_root=os.geteuid() == 0)
    if lines:
        terminalreporter.write_sep("=", "tests that did not run", yellow=True, bold=True)
        for line in lines:
            terminalreporter.write_line(line, yellow=True, bold=True)
