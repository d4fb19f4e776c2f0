"""Cache entries that hold code are read only when this user wrote them (runtime/vouched.py):
the digest recorded on writing, in a directory only this user can write, must match."""

from __future__ import annotations

import os

import pytest

from fastmace.runtime import vouched


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "fastmace" / "vouched"


def test_an_entry_written_and_vouched_for_reads_back(tmp_path, state):
    entry = tmp_path / "entry.bin"
    entry.write_bytes(b"compiled code")
    assert vouched.vouch(entry, b"compiled code")
    assert vouched.read_vouched(entry) == b"compiled code"
    assert vouched.is_vouched(entry)
    assert state.stat().st_mode & 0o777 == 0o700


def test_changed_planted_or_moved_entries_are_not_read(tmp_path, state):
    entry = tmp_path / "entry.bin"
    entry.write_bytes(b"compiled code")
    vouched.vouch(entry, b"compiled code")
    entry.write_bytes(b"someone else's code")  # changed since this user wrote it
    assert vouched.read_vouched(entry) is None
    assert not vouched.is_vouched(entry)
    planted = tmp_path / "planted.bin"  # never vouched for
    planted.write_bytes(b"compiled code")
    assert vouched.read_vouched(planted) is None
    assert vouched.read_vouched(tmp_path / "absent.bin") is None


def test_a_store_others_can_write_vouches_for_nothing(tmp_path, state):
    state.mkdir(parents=True)
    state.chmod(0o777)
    entry = tmp_path / "entry.bin"
    entry.write_bytes(b"compiled code")
    with pytest.raises(vouched.PrivateStoreError, match="written by others"):
        vouched._private_store(None)
    assert not vouched.vouch(entry, b"compiled code")
    assert vouched.read_vouched(entry) is None


def test_a_file_swapped_before_the_record_is_written_is_not_vouched_for(tmp_path, state):
    """The record holds the digest of the bytes this process wrote, not of whatever the path
    holds when the record is made."""
    entry = tmp_path / "entry.bin"
    entry.write_bytes(b"someone else's code")  # swapped in after our write
    vouched.vouch(entry, b"compiled code")
    assert vouched.read_vouched(entry) is None


def test_the_store_follows_xdg_state_home(tmp_path):
    environ = {"XDG_STATE_HOME": str(tmp_path / "s")}
    assert vouched.store_directory(environ) == tmp_path / "s" / "fastmace" / "vouched"
    assert vouched.store_directory({}).is_relative_to(os.path.expanduser("~"))
