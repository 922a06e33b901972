"""A folder's broken images found while it is written (train.data.local.damage, BAD_FILES), one class refused, and a
SIGTERM while writing (train/data/written.py). Runs that train do it in processes of their own."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import clean_env, read_summary, run_train, start_python
from tests.harness.runs import RESIZED
from tests.test_local_data import FAST, photos
from train.data import written
from train.data.local import damage
from train.signals import DROPPED


def encoded(kind: str, seed: int = 0, **options) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (24, 32, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=kind, **options)
    return buffer.getvalue()


KINDS = {"jpeg": ("JPEG", {}), "progressive jpeg": ("JPEG", {"progressive": True}), "png": ("PNG", {}),
         "gif": ("GIF", {}), "bmp": ("BMP", {})}  # fmt: skip


@pytest.mark.parametrize("name", KINDS)
def test_a_whole_image_passes_with_padding_after_it_and_one_cut_short_does_not(name):
    kind = name.split()[-1]
    data = encoded(KINDS[name][0], **KINDS[name][1])
    assert damage(data, kind) is None and damage(data + b"\x00" * 100, kind) is None
    cuts = range(16, len(data) - 1, 7)
    missed = [cut for cut in cuts if damage(data[:cut], kind) is None]
    # a GIF's last byte may be 3B by chance where it is cut (one in 256): the trailer is all its format has
    assert len(missed) <= (2 if kind == "gif" else 0), missed
    assert "cut short" in damage(data[: len(data) // 2], kind)


def test_a_jpegs_thumbnail_does_not_hide_its_cut_and_bytes_after_its_end_are_allowed():
    thumbnail = encoded("JPEG", seed=1)
    exif = Image.Exif()
    data = encoded("JPEG", seed=2, exif=exif.tobytes())
    # an APP1 segment holding a whole JPEG (an EXIF thumbnail ends with FF D9 of its own) before the image's
    app1 = b"\xff\xe1" + (len(thumbnail) + 2).to_bytes(2, "big") + thumbnail
    with_thumbnail = data[:2] + app1 + data[2:]
    assert damage(with_thumbnail, "jpeg") is None
    assert damage(with_thumbnail[: len(with_thumbnail) - 200], "jpeg") == "cut short: no JPEG end marker (FF D9)"
    assert damage(data + b"ftypmp42" + b"\x00" * 500, "jpeg") is None  # a motion photo: a video after the end


def _break(path: Path, keep: float = 0.5) -> None:
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def _settings(tmp_path: Path, **more) -> dict:
    """A run on ./photos in tmp_path, with a small model (resized.py, written there): the files are what is tested."""
    (tmp_path / "resized.py").write_text(RESIZED)
    return {
        "cwd": tmp_path,
        "DATASET": "./photos",
        "TFDS_DATA_DIR": tmp_path / "tfds",
        "OUTPUT_DIR": tmp_path / "run",
        "MODEL": "resized.py",
        **FAST,
        **more,
    }


def _written(data_dir: Path) -> list[Path]:
    """What TFDS_DATA_DIR holds but its lock file."""
    return [path for path in data_dir.iterdir() if path.name != written.LOCK] if data_dir.exists() else []


def _error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def test_broken_images_are_refused_before_step_1_then_left_out_with_skip_and_counted(tmp_path):
    photos(tmp_path / "photos")
    broken = ["cat/1.jpg", "dog/3.png", "tulip/bitmap.bmp"]
    for name in broken:
        _break(tmp_path / "photos" / name)
    (tmp_path / "photos" / "dog" / "notes.txt").write_text("not an image: left out, not broken")

    refused = run_train("fit", **_settings(tmp_path))
    [line] = _error_lines(refused)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "DATASET='./photos': 3 broken image file(s): cat/1.jpg (cut short: " in line
    assert "dog/3.png (cut short: no PNG IEND chunk)" in line and "tulip/bitmap.bmp (cut short: " in line
    assert line.endswith("Nothing was trained: replace or remove them, or set BAD_FILES=skip to leave them out")
    assert not (tmp_path / "run").exists()
    assert [path.name for path in (tmp_path / "tfds").iterdir()] == [written.LOCK]  # nothing half-written

    skipped = run_train("fit", **_settings(tmp_path, BAD_FILES="skip"))
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    out = skipped.stdout + skipped.stderr
    assert "3 broken image file(s) left out (BAD_FILES=skip): cat/1.jpg (cut short" in out
    assert "23 images in" in out and "4 file(s) left out" in out  # 27 files read: 23 written, 3 broken, notes.txt
    summary = read_summary(tmp_path / "run")
    assert summary["left_out"] == {"count": 4, "files": [*broken, "dog/notes.txt"]}
    assert json.loads((tmp_path / "run" / "run.json").read_text())["data"]["files"] == 23

    again = run_train("fit", **_settings(tmp_path, OUTPUT_DIR=tmp_path / "other"))  # reused, not read: refused
    assert again.returncode == 2 and "3 broken image file(s)" in _error_lines(again)[0], again.stderr[-2000:]


def test_every_broken_file_is_counted_and_the_first_ten_named(tmp_path):
    photos(tmp_path / "photos", per_class=6)
    names = sorted(str(path.relative_to(tmp_path / "photos")) for path in (tmp_path / "photos").rglob("*.jpg"))
    for name in names[:12]:
        _break(tmp_path / "photos" / name, keep=0.3)
    result = run_train("fit", **_settings(tmp_path))
    [line] = _error_lines(result)
    assert result.returncode == 2 and "12 broken image file(s)" in line, result.stderr[-2000:]
    assert "; and 2 more. Nothing was trained" in line and sum(name in line for name in names[:12]) == 10
    assert not _written(tmp_path / "tfds") and not (tmp_path / "run").exists()


def test_one_class_folder_or_one_label_value_is_refused_before_anything_is_written(tmp_path):
    photos(tmp_path / "photos", classes=("cat",))
    folder = run_train("fit", **_settings(tmp_path))
    [line] = _error_lines(folder)
    assert folder.returncode == 2 and "Traceback" not in folder.stderr, folder.stderr[-2000:]
    assert line.startswith("error: DATASET='./photos' holds one class folder, cat: classification needs two classes")
    assert "LABEL_KEY=none" in line and not (tmp_path / "run").exists()
    assert not _written(tmp_path / "tfds")

    (tmp_path / "rows.csv").write_text("age,label\n" + "".join(f"{20 + i},yes\n" for i in range(20)))
    table = run_train("fit", **_settings(tmp_path, DATASET="./rows.csv", MODEL="examples.tabular"))
    [line] = _error_lines(table)
    assert table.returncode == 2 and "the label column 'label' holds one value, 'yes'" in line, table.stderr[-2000:]
    assert not _written(tmp_path / "tfds")


def _many_photos(root: Path, files: int) -> None:
    """`files` small JPEGs in two class folders: a folder whose writing takes seconds."""
    data = [encoded("JPEG", seed=seed) for seed in range(2)]
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
    for index in range(files):
        (root / "ab"[index % 2] / f"{index}.jpg").write_bytes(data[index % 2])


@pytest.mark.slow
def test_a_sigterm_while_writing_ends_within_2_s_with_42_and_the_next_start_writes_again(tmp_path):
    _many_photos(tmp_path / "photos", 16_000)
    # slices of the split, so that the next start, once written, trains and evaluates on few of the examples
    settings = _settings(tmp_path, STEPS_PER_EPOCH=1, BATCH_SIZE=64, TRAIN_SPLIT="train[:2%]", EVAL_SPLIT="train[98%:]")
    cwd = settings.pop("cwd")
    data_dir = tmp_path / "tfds"
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        process = start_python(["-m", "train", "fit"], cwd=cwd, env=clean_env(**settings), fresh=True, stdout=out,
                               stderr=err)  # fmt: skip
        deadline = time.monotonic() + 240
        while not list(data_dir.glob(f"{written.WRITING}*")) and process.poll() is None:
            assert time.monotonic() < deadline, "the writing never started"
            time.sleep(0.05)
        time.sleep(0.1)  # into the writing (16,000 images take about a second on a quiet machine)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        took = time.monotonic() - sent
    stderr = (tmp_path / "err").read_text()
    assert process.returncode == 42, stderr[-3000:]
    assert took < 2.0, f"{took:.1f} s from SIGTERM to exit"
    assert stderr.strip().splitlines()[-2] == DROPPED  # the stop's first line says what it stops
    assert "Stopped by SIGTERM while DATASET was being written into" in stderr and "Traceback" not in stderr
    assert [path.name for path in data_dir.iterdir()] == [written.LOCK]  # nothing half-written
    assert not (tmp_path / "run" / "run.json").exists()

    again = run_train("fit", cwd=cwd, timeout=600, **settings)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "16,000 images in" in again.stdout + again.stderr
    assert os.path.exists(tmp_path / "run" / "summary.json")


def test_a_process_waiting_for_the_lock_hears_sigterm(tmp_path):
    photos(tmp_path / "photos", per_class=2)
    data_dir = tmp_path / "tfds"
    data_dir.mkdir()
    import fcntl

    with open(data_dir / written.LOCK, "a") as held:  # another process writes: this one waits
        fcntl.flock(held, fcntl.LOCK_EX)
        settings = _settings(tmp_path)
        cwd = settings.pop("cwd")
        process = start_python(["-m", "train", "fit"], cwd=cwd, env=clean_env(**settings), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(4)  # TensorFlow loaded (forked: it was already), the survey made, the lock waited for
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 42, stderr[-3000:]
    assert "Stopped by SIGTERM while waiting for another process to write DATASET='./photos'" in stderr
