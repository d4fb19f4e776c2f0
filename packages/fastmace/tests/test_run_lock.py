"""One process at a time writes a run directory (fastmace.io.run_lock): a second ``--resume``
of a running run is refused before it touches a file, and a lock whose owner is gone (killed,
or on another host and silent for long) never blocks a resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLE, run_fastmace

import fastmace as fm
from fastmace.io import RunDirectory, RunDirectoryInUseError, load_restart, run_lock
from fastmace.io.run_lock import LOCK_NAME, LockHeld, LockOwner, RunLock
from fastmace.runtime.process_clock import process_state


def _write_owner(directory: Path, owner: LockOwner) -> Path:
    path = directory / LOCK_NAME
    path.write_bytes(owner.to_bytes())
    return path


def _gone_process() -> int:
    """The id of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_lock_is_ours_until_released(tmp_path):
    lock = RunLock.acquire(tmp_path)
    owner = run_lock.read_owner(tmp_path / LOCK_NAME)
    assert owner == lock.owner and owner.pid == os.getpid()
    with pytest.raises(LockHeld, match=f"process {os.getpid()} on host"):
        RunLock.acquire(tmp_path)  # a live owner, even this very process, keeps it
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()
    lock.release()  # twice is harmless
    RunLock.acquire(tmp_path).release()


def test_a_lock_whose_process_is_gone_is_taken_over(tmp_path):
    here = LockOwner.this_process()
    stale = LockOwner(here.host, _gone_process(), None, time.time() - 5)
    _write_owner(tmp_path, stale)
    assert run_lock.held_by_live_process(tmp_path) is None
    lock = RunLock.acquire(tmp_path)
    assert lock.owner.pid == os.getpid()
    lock.release()


def test_a_zombie_holds_no_lock(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process_state(child.pid) != "Z":  # exited, not yet reaped
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        _write_owner(tmp_path, LockOwner(LockOwner.this_process().host, child.pid, None, 0.0))
        assert run_lock.held_by_live_process(tmp_path) is None
    finally:
        child.wait()


def test_a_reused_process_id_is_not_the_owner(tmp_path):
    """The same id with another start time is another process: the owner is gone."""
    here = LockOwner.this_process()
    assert here.started is not None
    _write_owner(tmp_path, LockOwner(here.host, here.pid, here.started - 1, time.time()))
    assert run_lock.held_by_live_process(tmp_path) is None
    _write_owner(tmp_path, here)
    assert run_lock.held_by_live_process(tmp_path) == here


def test_another_hosts_lock_counts_while_it_is_touched(tmp_path):
    elsewhere = LockOwner("node-that-is-not-this-one", 12345, 1, time.time())
    path = _write_owner(tmp_path, elsewhere)
    with pytest.raises(LockHeld, match="node-that-is-not-this-one"):
        RunLock.acquire(tmp_path)
    silent = time.time() - run_lock.STALE_AFTER_S - 60
    os.utime(path, (silent, silent))
    RunLock.acquire(tmp_path).release()


def test_keep_alive_touches_the_lock(tmp_path, monkeypatch):
    lock = RunLock.acquire(tmp_path)
    old = time.time() - 3600
    os.utime(lock.path, (old, old))
    lock.keep_alive()  # within the heartbeat interval: nothing to do
    assert lock.path.stat().st_mtime == pytest.approx(old)
    monkeypatch.setattr(run_lock, "HEARTBEAT_EVERY_S", 0.0)
    lock.keep_alive()
    assert lock.path.stat().st_mtime > old + 3000
    lock.release()


def test_a_lock_replaced_after_it_was_read_is_not_removed(tmp_path):
    stale = LockOwner(LockOwner.this_process().host, _gone_process(), None, 0.0)
    newer = LockOwner("another-host", 7, 1, time.time())
    _write_owner(tmp_path, newer)
    run_lock._remove_if_unchanged(tmp_path / LOCK_NAME, stale)
    assert run_lock.read_owner(tmp_path / LOCK_NAME) == newer


def test_run_directory_resume_is_refused_while_its_output_is_open(tmp_path):
    output = RunDirectory.create(tmp_path / "run", n_atoms=2)
    with pytest.raises(RunDirectoryInUseError, match=f"in use by process {os.getpid()}"):
        RunDirectory(tmp_path / "run").check_can_resume()
    with pytest.raises(RunDirectoryInUseError, match=r"delete .*run\.lock"):
        RunDirectory.resume(tmp_path / "run")
    output.close()
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_a_second_resume_of_a_running_run_is_refused(clean_env, tmp_path):
    """While ``fastmace md`` runs a directory, ``--resume`` of it (CLI or fm.md) is refused
    naming that process, and cuts nothing back; once it is killed, the resume goes on."""
    run = tmp_path / "run"
    common = ["--temperature", "300", "--restart-every", "10", "--thermo-every", "10"]
    command = ["md", str(EXAMPLE), *common, "-o", str(run)]
    child = subprocess.Popen(
        [sys.executable, "-m", "fastmace", *command, "--steps", "1000000"],
        env=clean_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (run / "restart.npz").exists() or load_restart(run / "restart.npz").step < 10:
            if child.poll() is not None:
                raise AssertionError(child.stderr.read().decode()[-2000:])
            assert time.monotonic() < deadline, "the run never wrote its step-10 restart"
            time.sleep(0.05)
        owner = json.loads((run / LOCK_NAME).read_text())
        assert owner["pid"] == child.pid
        refused = run_fastmace([*command, "--steps", "1000000", "--resume"], clean_env)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert f"is in use by process {child.pid}" in refused.stderr, refused.stderr
        with pytest.raises(RunDirectoryInUseError, match=f"process {child.pid}"):
            fm.md(EXAMPLE, temperature_K=300.0, steps=1000000, output=run, resume=True)
        assert child.poll() is None  # the running run went on, undisturbed
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stderr.close()
    before = load_restart(run / "restart.npz").step
    resumed = run_fastmace([*command, "--steps", str(before + 20), "--resume"], clean_env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not (run / LOCK_NAME).exists()
    assert json.loads((run / "metadata.json").read_text())["status"] == "finished"
    assert load_restart(run / "restart.npz").step == before + 20
