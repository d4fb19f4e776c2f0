"""Reading the kernel's mount table: escapes, longest prefix, over-mounts, NFS types."""

from __future__ import annotations

from fastmace.runtime.mounts import (
    mount_of,
    nfs_mount_of,
    parse_mount_table,
    read_mount_table,
    unescape_mount_field,
)

TABLE = r"""
overlay / overlay rw,relatime 0 0
proc /proc proc rw,nosuid 0 0
nfsd /proc/fs/nfsd nfsd rw 0 0
server:/export/home /home nfs4 rw,vers=4.2 0 0
/dev/sda1 /home/local ext4 rw 0 0
server:/scratch /mnt/my\040scratch nfs rw,vers=3 0 0
/dev/sdb1 /data ext4 rw 0 0
server:/data /data nfs4 rw 0 0
tmpfs /home/alice/tmp tmpfs rw 0 0
broken line
"""


def test_octal_escapes_are_decoded():
    assert unescape_mount_field(r"/mnt/a\040b\011c\134d") == "/mnt/a b\tc\\d"
    mounts = parse_mount_table(TABLE)
    assert "/mnt/my scratch" in {m.mount_point for m in mounts}


def test_malformed_lines_are_skipped():
    assert len(parse_mount_table(TABLE)) == 9


def test_nfs_home_is_found():
    mounts = parse_mount_table(TABLE)
    found = nfs_mount_of("/home/alice/.nv/ComputeCache", mounts)
    assert found is not None
    assert (found.mount_point, found.fs_type) == ("/home", "nfs4")


def test_longest_prefix_wins():
    mounts = parse_mount_table(TABLE)
    assert nfs_mount_of("/home/local/cache", mounts) is None
    assert mount_of("/home/local/cache", mounts).fs_type == "ext4"
    assert nfs_mount_of("/home/alice/tmp/x", mounts) is None


def test_prefix_must_end_at_a_path_component():
    mounts = parse_mount_table(TABLE)
    # /homework is not below /home
    assert mount_of("/homework/x", mounts).mount_point == "/"


def test_escaped_mount_point_is_matched():
    mounts = parse_mount_table(TABLE)
    found = nfs_mount_of("/mnt/my scratch/fastmace", mounts)
    assert found is not None and found.fs_type == "nfs"


def test_last_mount_on_a_point_is_the_visible_one():
    mounts = parse_mount_table(TABLE)
    assert nfs_mount_of("/data/cache", mounts) is not None


def test_nfsd_control_filesystem_is_not_nfs():
    assert nfs_mount_of("/proc/fs/nfsd/x", parse_mount_table(TABLE)) is None


def test_relative_and_dotted_paths_are_normalised(tmp_path, monkeypatch):
    mounts = parse_mount_table(TABLE)
    assert nfs_mount_of("/home/local/../alice", mounts) is not None
    monkeypatch.chdir("/")
    assert nfs_mount_of("home/alice", mounts) is not None


def test_this_machines_table_is_readable():
    mounts = read_mount_table()
    assert any(m.mount_point == "/" for m in mounts)


def test_missing_table_gives_no_mounts(tmp_path):
    assert read_mount_table(str(tmp_path / "absent")) == []
