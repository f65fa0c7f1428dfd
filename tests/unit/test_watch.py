"""`memdiag watch DIR`: follows a run directory while its ranks write it, and ends when the run does."""

from __future__ import annotations

import io
import json
import threading
import time

from rich.console import Console

from memdiag.commands.watch import watch

MiB = 2**20


def _append(path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, separators=(",", ":")) + "\n")


def test_watch_follows_the_ranks_until_the_run_json_leaves_running(tmp_path):
    # GIVEN a run directory of 2 ranks, running, whose rank 1 has not written yet
    manifest = {"status": "running", "world_size": 2}
    (tmp_path / "run.json").write_text(json.dumps(manifest))
    _append(tmp_path / "rank-0.jsonl", {"type": "step", "step": 0, "peak_rss_bytes": 300 * MiB})
    returned: list = []
    console = Console(file=io.StringIO(), force_terminal=False)
    watcher = threading.Thread(target=lambda: returned.append(watch(str(tmp_path), 0.02, console)))
    watcher.start()
    # WHEN the ranks write steps for a while
    for step in (1, 2):
        time.sleep(0.1)
        for rank in (0, 1):
            _append(tmp_path / f"rank-{rank}.jsonl", {"type": "mem", "step": step, "rss_last": (200 + step) * MiB})
            _append(tmp_path / f"rank-{rank}.jsonl", {"type": "step", "step": step, "peak_rss_bytes": 250 * MiB})
    time.sleep(0.1)
    # THEN watch is still following them
    assert watcher.is_alive() and not returned
    # AND when the run ends, it returns the status and where each rank ended
    (tmp_path / "run.json").write_text(json.dumps({**manifest, "status": "terminated by SIGTERM at step 2"}))
    watcher.join(timeout=10)
    [(status, ranks)] = returned
    assert status == "terminated by SIGTERM at step 2"
    assert [(r.steps, r.rss_bytes, r.peak_bytes) for r in ranks] == [(3, 202 * MiB, 300 * MiB),
                                                                    (2, 202 * MiB, 250 * MiB)]
