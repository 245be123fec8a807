"""How `make run` stops its processes (app/devstack.py DemoFirstManager): SIGTERM to each process's
group, but to the Celery worker's main process alone, whose pool processes would die at once on it
and lose the tasks they ran (WorkerLostError, logged as an ERROR at every Ctrl-C that caught one).

Each process here is a parent with a forked child, both saying which signal reached them; the
manager runs in a process of its own (its loop takes SIGINT and SIGTERM in its main thread) and is
stopped with SIGINT, as Ctrl-C stops it.
"""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.processes import wait_until

FAMILY = textwrap.dedent(
    """
    import os, signal, sys, time
    folder, name = sys.argv[1], sys.argv[2]

    def said(role, what):
        with open(os.path.join(folder, f"{name}-{role}"), "w") as file:
            file.write(what)

    role = "child" if os.fork() == 0 else "parent"
    parent = os.getppid()

    def stop(signum, frame):
        said(role, "SIGTERM")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    said(role, "ready")
    while role == "parent" or os.getppid() == parent:  # a child outlives no parent
        time.sleep(0.05)
    said(role, "its parent ended")
    """
)

MANAGER = textwrap.dedent(
    """
    import sys
    from app.devstack import DemoFirstManager
    python, script, folder = sys.argv[1:4]
    manager = DemoFirstManager()
    for name in ("worker", "collectors"):
        manager.add_process(name, f"exec {python} {script} {folder} {name}")
    manager.loop()
    sys.exit(manager.returncode)
    """
)


def test_sigterm_reaches_the_worker_alone_and_every_other_process_group(tmp_path: Path) -> None:
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    said = tmp_path / "said"
    said.mkdir()
    manager = subprocess.Popen(
        [sys.executable, "-c", MANAGER, sys.executable, str(script), str(said)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        names = [f"{name}-{role}" for name in ("worker", "collectors") for role in ("parent", "child")]
        wait_until(lambda: all((said / name).exists() for name in names), timeout=60, what="four processes")
        manager.send_signal(signal.SIGINT)
        assert manager.wait(timeout=60) == 130  # honcho's status for SIGINT: every process stopped
    finally:
        manager.kill()
    heard = {path.name: path.read_text() for path in said.iterdir()}
    assert heard == {
        "worker-parent": "SIGTERM",
        "worker-child": "its parent ended",  # Celery's pool: told to stop by the worker, not the signal
        "collectors-parent": "SIGTERM",
        "collectors-child": "SIGTERM",
    }


INTERRUPTED_LOG = textwrap.dedent(
    """
    import io, signal, sys
    from datetime import datetime
    from honcho.printer import Message
    from app.devconsole import ConsolePrinter
    from app.devstack import DemoFirstManager

    class Disk(io.RawIOBase):
        '''The log's file, whose first write(2) Ctrl-C interrupts: Python runs the handler right
        there, inside the buffered writer that holds the line being written.'''

        def __init__(self):
            self.data = bytearray()
            self.interrupted = False

        def writable(self):
            return True

        def write(self, chunk):
            if not self.interrupted:
                self.interrupted = True
                signal.raise_signal(signal.SIGINT)
            self.data += chunk
            return len(chunk)

    disk = Disk()
    log = io.TextIOWrapper(io.BufferedWriter(disk), encoding="utf-8", line_buffering=True)
    manager = DemoFirstManager(ConsolePrinter(log, console=io.StringIO()))
    line = Message(type="line", data=b"a line of a process", time=datetime.now(), name="web", colour=None)
    manager.events.put(line)
    manager.loop()
    log.flush()
    sys.stdout.write(disk.data.decode())
    sys.exit(manager.returncode)
    """
)


def test_ctrl_c_in_the_middle_of_a_log_line_still_stops_everything() -> None:
    # Seen in CI: the handler wrote "SIGINT received" into the log the loop was writing a line to;
    # the buffered file refused the reentrant call, the manager died and its processes ran on.
    stopped = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_LOG], capture_output=True, text=True, timeout=60, check=False
    )
    assert stopped.returncode == 130, stopped.stderr  # honcho's status for SIGINT
    assert "a line of a process" in stopped.stdout and "SIGINT received: stopping" in stopped.stdout
