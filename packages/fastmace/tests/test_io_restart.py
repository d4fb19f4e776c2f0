"""Restart files: exact round trips, no pickle, and atomic replacement that survives a crash."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_python

from fastmace.io import RestartFormatError, load_restart, save_restart
from fastmace.io import restart as restart_module


def payload() -> dict:
    rng = np.random.default_rng(7)
    return {
        "positions": rng.normal(size=(5, 3)),
        "special": np.array([np.nan, -0.0, np.inf, 5e-324, 1 / 3]),
        "masses32": rng.random(4).astype(np.float32),
        "big_endian": np.arange(3, dtype=">i4"),
        "fortran": np.asfortranarray(rng.random((3, 2))),
        "pbc": np.array([[True, False, True]]),
        "complex": np.array([1 + 2j]),
        "empty": np.zeros((0, 3)),
        "zero_d": np.array(2.5),
        "scalar": np.float64(0.1),
        "rng_state": bytes(range(256)) * 3,
        "cuda_rng": bytearray(b"\x00\x01"),
        "numpy_rng": rng.bit_generator.state,  # nested dict with 128-bit integers
        "metadata": {"step": 7, "dt_fs": 0.1 + 0.2, "name": "NVT", "none": None, "ok": True},
        "history": [1, 2.0, "three", (4, b"five")],
    }


def assert_identical(a, b) -> None:
    assert type(a) is type(b) or isinstance(a, bytearray), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()  # bit for bit, NaN and -0.0 included
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_identical(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_identical(x, y)
    elif isinstance(a, bytearray):
        assert bytes(a) == b and type(b) is bytes
    else:
        assert a == b and repr(a) == repr(b)


def test_round_trip_is_exact(tmp_path):
    path = tmp_path / "restart.npz"
    original = payload()
    save_restart(path, 1000, original)
    restart = load_restart(path)
    assert restart.step == 1000
    assert_identical(original, restart.payload)
    generator = np.random.default_rng()
    generator.bit_generator.state = restart.payload["numpy_rng"]
    reference = np.random.default_rng(7)
    reference.normal(size=(5, 3))
    reference.random(4)
    reference.random((3, 2))
    assert generator.random() == reference.random()


def test_refuses_what_would_need_pickle(tmp_path):
    with pytest.raises(TypeError, match="object array"):
        save_restart(tmp_path / "r.npz", 0, {"bad": np.array([{}, 1], dtype=object)})
    with pytest.raises(TypeError, match="non-string key"):
        save_restart(tmp_path / "r.npz", 0, {1: 2})
    with pytest.raises(TypeError, match=r"payload\['x'\] is a builtins.set"):
        save_restart(tmp_path / "r.npz", 0, {"x": {1}})
    with pytest.raises(ValueError, match="non-negative integer"):
        save_restart(tmp_path / "r.npz", -1, {})
    assert list(tmp_path.iterdir()) == []


def test_loading_never_unpickles(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, manifest=np.array([object()], dtype=object))  # needs pickle to load
    with pytest.raises(RestartFormatError, match="not a readable FastMACE restart"):
        load_restart(path)


def test_wrong_files_give_clear_errors(tmp_path):
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(RestartFormatError, match="not a readable"):
        load_restart(tmp_path / "text.npz")
    save_restart(tmp_path / "r.npz", 0, {})
    with np.load(tmp_path / "r.npz") as archive:
        manifest = archive["manifest"].tobytes().replace(b'"version": 1', b'"version": 99')
    np.savez(tmp_path / "new.npz", manifest=np.frombuffer(manifest, dtype=np.uint8))
    with pytest.raises(RestartFormatError, match="version 99"):
        load_restart(tmp_path / "new.npz")


def test_a_truncated_restart_says_it_is_damaged_and_what_to_do(tmp_path):
    """Cut short by a full disk: a bad zip to NumPy, reported as a damaged restart (issue 33),
    not as "File is not a zip file"."""
    save_restart(tmp_path / "r.npz", 40, {"positions": np.arange(3000.0)})
    data = (tmp_path / "r.npz").read_bytes()
    for length in (len(data) // 2, 100, 10):
        (tmp_path / "cut.npz").write_bytes(data[:length])
        with pytest.raises(RestartFormatError, match=r"damaged .* cannot resume from it"):
            load_restart(tmp_path / "cut.npz")


def test_failure_while_writing_keeps_the_previous_restart(tmp_path, monkeypatch):
    path = tmp_path / "restart.npz"
    save_restart(path, 10, {"x": np.arange(3)})

    def torn_savez(stream, **members):
        stream.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(restart_module.np, "savez", torn_savez)
    with pytest.raises(OSError, match="disk full"):
        save_restart(path, 20, {"x": np.arange(4)})
    assert [entry.name for entry in tmp_path.iterdir()] == ["restart.npz"]  # no temporary
    restart = load_restart(path)
    assert restart.step == 10
    np.testing.assert_array_equal(restart.payload["x"], np.arange(3))


KILLED_MID_WRITE = """
import os, numpy as np
from fastmace.io import restart
path = {path!r}
restart.save_restart(path, 10, {{"x": np.arange(3)}})
def killed(stream, **members):
    stream.write(b"PK\\x03\\x04 half a zip")
    stream.flush()
    os._exit(9)  # the process dies: no cleanup, no exception handler
restart.np.savez = killed
restart.save_restart(path, 20, {{"x": np.arange(4)}})
"""


def test_process_killed_mid_write_leaves_the_previous_restart(tmp_path, clean_env):
    path = tmp_path / "restart.npz"
    result = run_python(KILLED_MID_WRITE.format(path=str(path)), clean_env)
    assert result.returncode == 9, result.stderr
    names = sorted(entry.name for entry in tmp_path.iterdir() if entry.is_file())
    assert names[-1] == "restart.npz" and len(names) == 2
    assert names[0].startswith(".restart.npz.") and names[0].endswith(".tmp")  # hidden
    assert load_restart(path).step == 10
