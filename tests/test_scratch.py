"""The kernel's private temporary directories: made on first use, removed at exit, on SIGTERM,
and - for a kernel that was killed - by the next session on the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from phalanx._scratch import ScratchDir, reap_orphans
from deadlines import hang_limit


def test_made_on_first_use_owner_only_and_removed():
    scratch = ScratchDir("t")
    assert scratch._path is None  # nothing on disk until someone needs it
    path = scratch.path
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert os.path.basename(path).startswith(f"phalanx-{os.getpid()}-")
    open(os.path.join(path, "store"), "w").close()
    scratch.remove()
    assert not os.path.exists(path)


def test_only_directories_of_gone_processes_are_reaped(tmp_path):
    me = psutil.Process()
    started = int(me.create_time())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {"mine": f"phalanx-{me.pid}-{started}-rdzv-a",              # this process: kept
             "dead": f"phalanx-{dead.pid}-{started}-rdzv-b",            # pid gone: reaped
             "reused": f"phalanx-{me.pid}-{started - 3600}-rdzv-c",     # pid reused: reaped
             "other": "phalanx-rdzv-unrelated"}                         # not ours: kept
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text("x")
    reaped = sorted(os.path.basename(p) for p in reap_orphans(str(tmp_path)))
    assert reaped == sorted([names["dead"], names["reused"]])
    assert sorted(os.listdir(tmp_path)) == sorted([names["mine"], names["other"]])


def test_a_killed_kernel_not_yet_reaped_by_its_parent_counts_as_gone(tmp_path):
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        proc = psutil.Process(zombie.pid)
        name = f"phalanx-{zombie.pid}-{int(proc.create_time())}-rdzv-z"
        (tmp_path / name).mkdir()
        zombie.kill()  # not waited for: a zombie until its parent (this test) reaps it
        deadline = time.monotonic() + hang_limit(30)
        while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [os.path.basename(p) for p in reap_orphans(str(tmp_path))] == [name]
    finally:
        zombie.kill()
        zombie.wait()


def _child(tmp_path, tail: str) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import sys, time
        from phalanx._scratch import ScratchDir
        scratch = ScratchDir("rdzv")
        print(scratch.path, flush=True)
        {tail}
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)


def test_removed_at_exit_and_on_sigterm_and_a_killed_ones_by_the_next(tmp_path):
    normal = _child(tmp_path, "sys.exit(0)")
    assert normal.wait(timeout=hang_limit(60)) == 0 and not os.path.exists(normal.stdout.readline().strip())
    normal.stdout.close()
    for sig, code in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        child = _child(tmp_path, "time.sleep(120)")
        path = child.stdout.readline().strip()
        assert os.path.isdir(path)
        child.send_signal(sig)
        assert child.wait(timeout=hang_limit(60)) == code  # dies of the signal, as it would have without us
        child.stdout.close()
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # SIGKILL: nothing could run
    assert reap_orphans(str(tmp_path)) == [path] and os.listdir(tmp_path) == []
