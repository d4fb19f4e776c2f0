"""Finding, verifying and downloading checkpoint files: clear failures, nothing half-written."""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from fastmace.models.files import (
    ChecksumMismatchError,
    ModelFileError,
    locate_label_file,
    locate_url,
    scan_model_files,
    verify,
)
from fastmace.models.label_table import Checkpoint, Head

PAYLOAD = b"pretend checkpoint bytes " * 4000
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/truncated/"):
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[: len(PAYLOAD) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if self.path.startswith("/missing/"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(PAYLOAD)))
        self.end_headers()
        self.wfile.write(PAYLOAD)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def env(tmp_path):
    return {"FASTMACE_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path)}


def entry(url: str, sha: str = PAYLOAD_SHA) -> Checkpoint:
    return Checkpoint(
        id="test-model", name="Test", file="test.model", url=url, sha256=sha, licence="MIT",
        model_type="MACE", aliases=(), heads=(Head("Default", None, None),),
        default_head="Default",
    )  # fmt: skip


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*.part"))


def test_not_found_names_every_place_and_the_fix(env, server):
    with pytest.raises(ModelFileError) as raised:
        locate_label_file(entry(server + "/test.model"), environ=env)
    message = str(raised.value)
    assert "FASTMACE_MODELS (unset)" in message and "cache/models/test.model" in message
    assert "fm.load('test-model', download=True)" in message
    assert not (Path(env["FASTMACE_CACHE"])).exists()


def test_download_only_when_asked_then_reused(env, server, tmp_path):
    found = locate_label_file(entry(server + "/test.model"), download=True, environ=env)
    assert found.source == "downloaded" and found.verified
    assert found.path == tmp_path / "cache" / "models" / "test.model"
    assert found.path.read_bytes() == PAYLOAD
    assert leftovers(tmp_path) == []
    again = locate_label_file(entry(server + "/test.model"), environ=env)
    assert again.source == "the cache" and again.path == found.path


def test_lookup_order(env, server, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    env["FASTMACE_MODELS"] = str(shared)
    cached = tmp_path / "cache" / "models"
    cached.mkdir(parents=True)
    (cached / "test.model").write_bytes(PAYLOAD)
    # An empty file in FASTMACE_MODELS (a placeholder) is skipped.
    (shared / "test.model").write_bytes(b"")
    assert locate_label_file(entry("x"), environ=env).source == "the cache"
    (shared / "test.model").write_bytes(PAYLOAD)
    assert locate_label_file(entry("x"), environ=env).source == "FASTMACE_MODELS"
    explicit = tmp_path / "mine.model"
    explicit.write_bytes(PAYLOAD)
    found = locate_label_file(entry("x"), explicit=explicit, environ=env)
    assert (found.path, found.source) == (explicit, "checkpoint=")


def test_mismatch_in_shared_directory_names_both_hashes_and_deletes_nothing(env, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "test.model").write_bytes(b"something else")
    env["FASTMACE_MODELS"] = str(shared)
    with pytest.raises(ChecksumMismatchError) as raised:
        locate_label_file(entry("x"), environ=env)
    message = str(raised.value)
    assert PAYLOAD_SHA in message
    assert hashlib.sha256(b"something else").hexdigest() in message
    assert (shared / "test.model").read_bytes() == b"something else"


def test_download_with_wrong_hash_keeps_nothing(env, server, tmp_path):
    wrong = "0" * 64
    with pytest.raises(ChecksumMismatchError) as raised:
        locate_label_file(entry(server + "/test.model", wrong), download=True, environ=env)
    assert PAYLOAD_SHA in str(raised.value) and wrong in str(raised.value)
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_interrupted_download_leaves_no_part_file(env, server, tmp_path):
    with pytest.raises(ModelFileError, match="ended early"):
        locate_label_file(entry(server + "/truncated/test.model"), download=True, environ=env)
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_http_error_is_clear(env, server):
    with pytest.raises(ModelFileError, match=r"cannot download .*404"):
        locate_label_file(entry(server + "/missing/test.model"), download=True, environ=env)


def test_url_needs_a_hash_or_trust(env, server, tmp_path):
    url = server + "/models/custom.model"
    with pytest.raises(ModelFileError, match="needs sha256="):
        locate_url(url, None, False, environ=env)
    assert not (tmp_path / "cache").exists()
    found = locate_url(url, PAYLOAD_SHA, False, environ=env)
    assert found.verified and found.path.name == "custom.model"
    assert locate_url(url, PAYLOAD_SHA, False, environ=env).source == "the cache"
    trusted = locate_url(url, None, True, environ=env)
    assert not trusted.verified and trusted.sha256 == PAYLOAD_SHA


def test_path_needs_a_hash_or_trust(tmp_path):
    path = tmp_path / "own.model"
    path.write_bytes(PAYLOAD)
    with pytest.raises(ModelFileError, match="trusted=True"):
        verify(path, None, "path")
    assert verify(path, PAYLOAD_SHA.upper(), "path").verified
    assert not verify(path, None, "path", trusted=True).verified


def test_unreadable_path(tmp_path):
    with pytest.raises(ModelFileError, match="not a readable file"):
        verify(tmp_path, PAYLOAD_SHA, "path")
    with pytest.raises(ModelFileError, match="not a readable file"):
        verify(tmp_path / "absent.model", PAYLOAD_SHA, "path")


def test_scan_reports_each_state(env, tmp_path):
    from fastmace.models.label_table import checkpoints

    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    table = checkpoints()
    (models / table[0].file).write_bytes(b"bad")
    (models / table[1].file).write_bytes(b"")
    (models / "other.model").write_bytes(b"x")
    states = {s.path.name: s.state for s in scan_model_files(env)}
    assert states == {table[0].file: "mismatch", table[1].file: "empty", "other.model": "unknown"}
    unhashed = {s.path.name: s.state for s in scan_model_files(env, hash_files=False)}
    assert unhashed[table[0].file] == "unchecked"
