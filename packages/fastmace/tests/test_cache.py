"""The cache root: precedence on each platform, the sys.prefix rule, directories on demand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fastmace.runtime.cache import (
    CacheLocationError,
    CacheRoot,
    CacheUnusableError,
    cache_dir,
    cache_root,
    check_cache_root,
    locate_cache_root,
    scratch_dir,
    user_cache_directory,
)


@pytest.mark.parametrize(
    ("platform", "environ", "expected"),
    [
        ("linux", {"HOME": "/home/a"}, "/home/a/.cache/fastmace"),
        ("linux", {"HOME": "/home/a", "XDG_CACHE_HOME": "/xdg"}, "/xdg/fastmace"),
        ("linux", {"HOME": "/home/a", "XDG_CACHE_HOME": ""}, "/home/a/.cache/fastmace"),
        ("freebsd14", {"HOME": "/home/a"}, "/home/a/.cache/fastmace"),
        ("darwin", {"HOME": "/Users/a"}, "/Users/a/Library/Caches/fastmace"),
        (
            "darwin",
            {"HOME": "/Users/a", "XDG_CACHE_HOME": "/xdg"},
            "/Users/a/Library/Caches/fastmace",
        ),
        (
            "win32",
            {"LOCALAPPDATA": "C:\\Users\\a\\AppData\\Local"},
            "C:\\Users\\a\\AppData\\Local\\fastmace\\Cache",
        ),
        ("win32", {"USERPROFILE": "D:\\u"}, "D:\\u\\AppData\\Local\\fastmace\\Cache"),
    ],
)
def test_user_cache_directory_per_platform(platform, environ, expected):
    assert str(user_cache_directory(platform, environ)) == expected


@pytest.mark.parametrize("platform", ["linux", "darwin", "win32"])
def test_fastmace_cache_wins_on_every_platform(platform):
    env = {"FASTMACE_CACHE": "~/scratch/fm", "HOME": "/home/a", "XDG_CACHE_HOME": "/x"}
    root = locate_cache_root(platform, env)
    assert root == CacheRoot(Path("/home/a/scratch/fm"), "FASTMACE_CACHE")


def test_default_source_is_named():
    root = locate_cache_root("linux", {"HOME": "/home/a"})
    assert root.source == "the user cache directory"


def test_root_inside_the_environment_is_refused():
    inside = CacheRoot(Path(sys.prefix) / "cache", "FASTMACE_CACHE")
    with pytest.raises(CacheLocationError) as raised:
        check_cache_root(inside)
    message = str(raised.value)
    assert str(inside.path) in message and sys.prefix in message and "FASTMACE_CACHE" in message
    check_cache_root(CacheRoot(Path("/elsewhere"), "FASTMACE_CACHE"))


def test_root_reached_through_a_symlink_is_refused(tmp_path):
    prefix = tmp_path / "env"
    prefix.mkdir()
    (tmp_path / "link").symlink_to(prefix)
    with pytest.raises(CacheLocationError):
        check_cache_root(CacheRoot(tmp_path / "link" / "cache", "FASTMACE_CACHE"), str(prefix))


def test_cache_root_is_not_created(tmp_path):
    root = cache_root({"FASTMACE_CACHE": str(tmp_path / "c")})
    assert root.path == tmp_path / "c"
    assert not root.path.exists()


def test_cache_root_raises_for_prefix():
    with pytest.raises(CacheLocationError):
        cache_root({"FASTMACE_CACHE": sys.prefix})


def test_cache_dir_creates_only_what_is_asked(tmp_path):
    env = {"FASTMACE_CACHE": str(tmp_path / "c")}
    models = cache_dir("models", environ=env)
    assert models == tmp_path / "c" / "models" and models.is_dir()
    nested = cache_dir("oeq", "extensions", "k1", environ=env)
    assert nested.is_dir()
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["models", "oeq"]
    with pytest.raises(ValueError, match="unknown cache kind 'nope'"):
        cache_dir("nope", environ=env)


def test_scratch_dir_is_fresh(tmp_path):
    env = {"FASTMACE_CACHE": str(tmp_path / "c")}
    first, second = scratch_dir("gate-", env), scratch_dir("gate-", env)
    assert first != second
    assert first.parent == tmp_path / "c" and first.name.startswith("gate-")


def test_a_cache_root_that_cannot_be_created_names_its_variable_and_the_fix(tmp_path):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    environ = {"FASTMACE_CACHE": str(in_the_way / "cache")}
    with pytest.raises(CacheUnusableError) as refused:
        cache_dir("compile", "costs", environ=environ)
    message = str(refused.value)
    assert message.startswith(f"the cache root {in_the_way / 'cache'} (from FASTMACE_CACHE)")
    assert "Not a directory" in message and "set FASTMACE_CACHE to a writable directory" in message
    assert isinstance(refused.value, OSError)  # callers that tolerate an unwritable cache still do
