"""A CSV or JSON Lines DATASET being written (train/data/written.py): a SIGINT or SIGTERM drops it at once, saying so
in its first line (train.signals.dropping), and a long write says its rows and their rate (train.progress.Counter).
A folder's stop: tests/test_bad_files.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import clean_env, start_python
from train import progress
from train.data import written
from train.settings import load_settings
from train.signals import DROPPED


def big_table(path: Path, rows: int) -> Path:
    """`rows` rows of 3 numbers, a city and a yes/no label, as CSV or JSON Lines (the suffix says): 200,000 take
    about 9 s to write on 2 quiet cores."""
    rng = np.random.default_rng(0)
    ages, fares, kinds = rng.integers(18, 90, rows), rng.random(rows), rng.integers(0, 2, rows)
    names = ("age", "fare", "rooms", "city", "label")
    cells = [
        (int(a), float(f"{f:.3f}"), int(a % 7), "paris" if k else "oslo", "ny"[k])
        for a, f, k in zip(ages, fares, kinds, strict=True)
    ]
    if path.suffix == ".csv":
        path.write_text(",".join(names) + "\n" + "".join(",".join(map(str, row)) + "\n" for row in cells))
    else:
        path.write_text("".join(json.dumps(dict(zip(names, row, strict=True))) + "\n" for row in cells))
    return path


@pytest.mark.parametrize(("sent", "name"), [(signal.SIGINT, "rows.csv"), (signal.SIGTERM, "rows.jsonl")])
def test_a_stop_while_a_table_is_written_drops_it_within_2_s_saying_so_first(tmp_path, sent, name):
    big_table(tmp_path / name, 200_000)
    data_dir = tmp_path / "tfds"
    env = clean_env(DATASET=f"./{name}", TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "run", MODEL=None)
    process = start_python(["-m", "train", "fit"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(data_dir.glob(f"{written.WRITING}*")):
        assert process.poll() is None and time.monotonic() < deadline, "the writing never started"
        time.sleep(0.02)
    time.sleep(0.5)  # into the rows' reading and typing, where no check was made before
    sent_at = time.monotonic()
    process.send_signal(sent)
    _, stderr = process.communicate(timeout=60)
    took = time.monotonic() - sent_at
    assert process.returncode == 42, stderr[-3000:]
    assert took < 2.0, f"{took:.1f} s from {sent.name} to exit"
    said = stderr.strip().splitlines()[-2:]  # what the stop printed: its first line, then the end
    assert said[0] == DROPPED and "Ctrl-C: stopping at the next safe point" not in stderr
    assert said[1].startswith(f"Stopped by {sent.name} while DATASET was being written into {data_dir}: nothing")
    assert [path.name for path in data_dir.iterdir()] == [written.LOCK]  # no staging folder, no index, no copy
    assert not (tmp_path / "run").exists()  # OUTPUT_DIR is made once the data is written


def test_a_stall_still_gets_its_line_every_line_seconds(monkeypatch):
    # the clock faked: LINE_SECONDS shortened to 0.02 s. The contract: a line at least every 10 s, where a table's
    # reading Counter closes and its writing Counter starts too (each waits LINE_SECONDS for its first line)
    assert 2 * progress.LINE_SECONDS <= 10
    monkeypatch.setattr(progress, "LINE_SECONDS", 0.02)
    lines: list[str] = []
    counter = progress.Counter("Reading t.csv", None, lines.append, unit="rows", shown=False)
    counter.advance(5)
    time.sleep(0.2)  # nothing advances: a table's columns being typed
    counter.close()
    count = len(lines)
    time.sleep(0.1)
    assert count >= 3 and len(lines) == count  # closed: no more lines
    assert re.fullmatch(r"Reading t\.csv: 5 rows, [\d,]+ rows/s", lines[-1]), lines


def test_a_table_being_written_says_its_rows_read_then_written_with_their_rate(tmp_path, monkeypatch):
    # the clock faked as above: a write of 20,000 rows (about a second) makes several lines
    monkeypatch.setattr(progress, "LINE_SECONDS", 0.05)
    big_table(tmp_path / "rows.csv", 20_000)
    monkeypatch.chdir(tmp_path)
    for name, value in {"DATASET": "./rows.csv", "TFDS_DATA_DIR": str(tmp_path / "tfds")}.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    lines: list[str] = []
    written.prepare_path(settings, settings.source, lines.append)
    assert any(re.fullmatch(r"Reading rows\.csv: [\d,]+ rows, [\d,]+ rows/s", line) for line in lines), lines
    assert any(re.fullmatch(r"Writing rows\.csv: [\d,]+/20,000 rows, [\d,]+ rows/s", line) for line in lines), lines
    assert re.fullmatch(r"Writing rows\.csv: 20,000 rows in [\d.]+ s \([\d,]+ rows/s\)", lines[-1]), lines
