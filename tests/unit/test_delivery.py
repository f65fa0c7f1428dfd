"""``--spool local``: a rank's files handed on in bounded chunks, and written whole by rank 0."""

import os

from memdiag.agent import delivery
from memdiag.format.writer import RecordWriter


def _hand_on(spool: delivery.Spool, run_dir, streamed_only: bool) -> list[int]:
    sizes = []
    for name, offset, data in spool.chunks(streamed_only):
        delivery.write_chunk(str(run_dir), name, offset, data)
        sizes.append(len(data))
    return sizes


def test_records_streamed_while_they_grow_arrive_whole_and_in_bounded_chunks(tmp_path, monkeypatch):
    # GIVEN a rank's spool with its record file, written by the real writer, and a small chunk size
    monkeypatch.setattr(delivery, "CHUNK_BYTES", 1000)
    spool_dir, run_dir = tmp_path / "spool", tmp_path / "run"
    spool_dir.mkdir()
    run_dir.mkdir()
    writer = RecordWriter(str(spool_dir / "rank-3.jsonl"), 3)
    (spool_dir / "rank-3.memray.bin").write_bytes(os.urandom(2500))
    spool = delivery.Spool(str(spool_dir))
    # WHEN records are handed on three times while the rank keeps writing, then once at its end
    sizes = []
    for step in range(3):
        for k in range(40):
            writer.add({"type": "collective", "step": step, "name": f"grad_{k}"})
        writer.flush()
        sizes += _hand_on(spool, run_dir, streamed_only=True)
        assert not (run_dir / "rank-3.memray.bin").exists()  # complete only at the end
    writer.write_now({"type": "end", "status": "ok"})
    writer.close()
    sizes += _hand_on(spool, run_dir, streamed_only=False)
    # THEN the run directory holds byte-identical files, and no chunk was larger than the bound
    for name in ("rank-3.jsonl", "rank-3.memray.bin"):
        assert (run_dir / name).read_bytes() == (spool_dir / name).read_bytes()
    assert max(sizes) <= 1000 and len(sizes) > 3
    # and nothing is handed on twice
    assert _hand_on(spool, run_dir, streamed_only=False) == []


def test_a_chunk_sent_again_rewrites_the_same_bytes_and_stays_in_the_run_directory(tmp_path):
    delivery.write_chunk(str(tmp_path), "rank-1.jsonl", 0, b'{"type":"start"}\n')
    delivery.write_chunk(str(tmp_path), "rank-1.jsonl", 0, b'{"type":"start"}\n')
    delivery.write_chunk(str(tmp_path), "../escaped.jsonl", 0, b"x")
    assert (tmp_path / "rank-1.jsonl").read_bytes() == b'{"type":"start"}\n'
    assert (tmp_path / "escaped.jsonl").exists() and not (tmp_path.parent / "escaped.jsonl").exists()


def test_only_record_files_are_streamed():
    assert delivery.is_streamed("rank-0.jsonl")
    assert not delivery.is_streamed("rank-0.memray.bin") and not delivery.is_streamed("params.npz")
