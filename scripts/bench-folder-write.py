"""A folder of small JPEGs written as TFDS records (train.data.written) against `cp -r` of the same folder, side
by side, in files per second; then the reuse of what was written. docs/performance.md has the row.

    PYTHONPATH=. .venv/bin/python scripts/bench-folder-write.py [FILES] [ROUNDS]

The folder (FILES JPEGs of 5-10 KB in 10 class folders) is made once in a temporary folder; each round copies
it with `cp -r` and writes it into a fresh TFDS_DATA_DIR, alternating which goes first. The page cache is warm for
both (the folder was just made or read), so both measure the same thing: reading the files and writing them out.
"""

from __future__ import annotations

import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from train.data import written
from train.settings import load_settings


def make_folder(root: Path, files: int) -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (96, 96, 3), dtype=np.uint8)
    for index in range(files):
        folder = root / f"class{index % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        # noise over a smooth image, at a quality that lands between 5 and 10 KB
        image = np.clip(pixels // 2 + rng.integers(0, 64, (96, 96, 3)), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=int(rng.integers(80, 95)))
        (folder / f"{index}.jpg").write_bytes(buffer.getvalue())


def main(files: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_folder(tmp / "photos", files)
        sizes = [p.stat().st_size for p in (tmp / "photos").rglob("*.jpg")]
        print(f"{files} JPEGs, {min(sizes) / 1024:.1f}-{max(sizes) / 1024:.1f} KB, {sum(sizes) / 2**20:.0f} MB")
        copy, write = [], []
        for number in range(rounds):
            for which in ("cp", "write") if number % 2 == 0 else ("write", "cp"):
                target = tmp / f"{which}{number}"
                started = time.perf_counter()
                if which == "cp":
                    subprocess.run(["cp", "-r", str(tmp / "photos"), str(target)], check=True)
                    copy.append(files / (time.perf_counter() - started))
                else:
                    os.environ.update(DATASET=str(tmp / "photos"), TFDS_DATA_DIR=str(target))
                    written.prepare_path(load_settings(), lambda line: None)
                    write.append(files / (time.perf_counter() - started))
                shutil.rmtree(target)
        os.environ["TFDS_DATA_DIR"] = str(tmp / "kept")
        written.prepare_path(load_settings(), lambda line: None)
        started = time.perf_counter()
        written.prepare_path(load_settings(), lambda line: None)
        reuse = time.perf_counter() - started
        copied, wrote = statistics.median(copy), statistics.median(write)
        print(f"cp -r: {copied:,.0f} files/s; written: {wrote:,.0f} files/s; ratio {wrote / copied:.2f}; "
              f"reuse {reuse * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
