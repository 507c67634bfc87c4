"""The served-traffic trace writer: lines written off the caller's thread, rotation, caps."""

from __future__ import annotations

import json
from pathlib import Path

from controller.config import RecordingConfig
from controller.recording import TraceRecorder, rotate, trace_files


def _recorder(path: Path, max_bytes: int, max_files: int) -> TraceRecorder:
    config = RecordingConfig(enabled=True, path=path, max_bytes=max_bytes, max_files=max_files)
    return TraceRecorder(config, lambda: [{"type": "engine", "backend": "b", "block_size": 8}])


def test_lines_and_header_are_written(tmp_path: Path) -> None:
    path = tmp_path / "t" / "served.jsonl"
    recorder = _recorder(path, 1 << 20, 2)
    recorder.start()
    for i in range(50):
        recorder.record({"type": "request", "i": i})
    recorder.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["type"] == "engine"
    assert [x["i"] for x in lines[1:]] == list(range(50))
    assert recorder.num_written == 50 and recorder.num_dropped == 0


def test_rotation_keeps_max_files_each_with_its_header(tmp_path: Path) -> None:
    path = tmp_path / "served.jsonl"
    recorder = _recorder(path, 4096, 3)
    recorder.start()
    for i in range(2000):
        recorder.record({"type": "request", "i": i, "pad": "x" * 40})
    recorder.close()
    files = trace_files(path)
    assert [f.name for f in files] == ["served.jsonl.2", "served.jsonl.1", "served.jsonl"]
    for file in files:
        assert file.stat().st_size <= 4096
        assert json.loads(file.read_text().splitlines()[0])["type"] == "engine"
    # Oldest first, and the newest record is the last line of the current file.
    assert json.loads(path.read_text().splitlines()[-1])["i"] == 1999


def test_a_write_error_drops_the_batch_and_is_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    recorder = _recorder(blocker / "served.jsonl", 1 << 20, 2)
    recorder.start()
    recorder.record({"type": "request"})
    recorder.close()
    assert recorder.num_written == 0 and recorder.num_dropped == 1


def test_rotate_with_one_file_truncates_in_place(tmp_path: Path) -> None:
    path = tmp_path / "served.jsonl"
    path.write_text("old\n")
    rotate(path, 1)
    assert not path.exists() and trace_files(path) == []
