"""gpumem's diagnostics reach Python's logging (logger "gpumem") with their levels."""
import logging
import subprocess
import sys

import gpumem


def test_a_diagnostic_is_logged_with_its_level(caplog):
    with caplog.at_level(logging.DEBUG, logger="gpumem"):
        gpumem._core._diagnose("warning", "gpumem: a test warning\n")
        gpumem._core._diagnose("info", "gpumem: a test note")
    records = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "gpumem"]
    assert (logging.WARNING, "gpumem: a test warning") in records
    assert (logging.INFO, "gpumem: a test note") in records


def test_a_leak_report_of_the_library_is_a_warning_in_logging(caplog):
    with caplog.at_level(logging.WARNING, logger="gpumem"):
        track = gpumem.TrackingAdaptor(gpumem.CudaResource(), report_at_exit=True)
        ptr = track.allocate(4096)
        assert ptr != 0
        del track  # destroyed with the allocation live: a leak report
    reports = [r for r in caplog.records if r.name == "gpumem" and "4096" in r.getMessage()]
    assert reports, [r.getMessage() for r in caplog.records]
    assert reports[0].levelno == logging.WARNING


def test_a_bad_level_is_a_logic_error():
    try:
        gpumem._core._diagnose("loud", "x")
    except gpumem.LogicError as e:
        assert "loud" in str(e)
    else:
        raise AssertionError("accepted")


def test_after_the_interpreter_exits_reports_still_reach_stderr():
    # A leak left at exit is reported by a C++ destructor after Python is gone.
    code = (
        "import gpumem\n"
        "t = gpumem.TrackingAdaptor(gpumem.CudaResource(), report_at_exit=True)\n"
        "t.allocate(8192)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "8192" in done.stderr or "8.00 KiB" in done.stderr, done.stderr
