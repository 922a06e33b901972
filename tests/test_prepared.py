"""`python -m train data list|prune --runs ROOT`: the prepared datasets in TFDS_DATA_DIR, the runs under ROOT that
use each (their run.json), and the copies of folders and tables that none uses removed (train/tools/prepared.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import clean_env, copy_data_dir, run_python, run_train
from tests.harness.caps import UNPRIVILEGED_TRAIN, can_drop_file_override
from tests.test_local_data import photos
from train.data import written
from train.tools import prepared
from train.tools.prepared import human

QUICK = {"EPOCHS": 1, "STEPS_PER_EPOCH": 1, "BATCH_SIZE": 8, "LOG_EVERY": 1000}


def _copies(data_dir):
    return sorted(path.parent.parent.name for path in data_dir.glob(f"*/{written.VERSION}/{written.SOURCE}"))


def test_data_list_names_each_copy_and_its_runs_and_prune_removes_what_no_run_uses(tmp_path, tfds_data_dir):
    data_dir = tmp_path / "tfds"
    copy_data_dir(tfds_data_dir, data_dir)  # synthetic_clusters, prepared from its TFDS name
    photos(tmp_path / "photos", per_class=3)
    images = {"DATASET": "./photos", "MODEL": "examples.resnet", **QUICK}
    for output_dir, settings in ((tmp_path / "runs" / "photos", images),
                                 (tmp_path / "runs" / "deep" / "clusters", QUICK)):  # fmt: skip
        result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=output_dir, **settings)
        assert result.returncode == 0, result.stderr[-3000:]
    used = json.loads((tmp_path / "runs" / "photos" / "run.json").read_text())["data"]["name"]
    shutil.copy(tmp_path / "photos" / "cat" / "1.jpg", tmp_path / "photos" / "dog" / "new.jpg")  # changed: another
    write = "from train.data import written\nfrom train.settings import load_settings\n"  # copy, no run uses it
    write += "settings = load_settings()\nwritten.prepare_path(settings, settings.source, print)\n"
    wrote = run_python(["-c", write], cwd=tmp_path, env=clean_env(TFDS_DATA_DIR=data_dir, **images))
    assert wrote.returncode == 0, wrote.stderr[-3000:]
    [unused] = [name for name in _copies(data_dir) if name != used]

    listed = run_python(["-m", "train", "data", "list", "--runs", "runs", "--json", "list.json"], cwd=tmp_path,
                        env={**clean_env(), "TFDS_DATA_DIR": str(data_dir)})  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    lines = listed.stdout.strip().splitlines()
    assert lines[0].startswith(f"TFDS_DATA_DIR={data_dir}: 3 prepared dataset(s), ") and "runs under runs" in lines[0]
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert set(by_name) == {f"{used}/1.0.0", f"{unused}/1.0.0", "synthetic_clusters/1.0.0"}
    assert f"from {tmp_path / 'photos'} (images, 11 files); used by runs/photos" in by_name[f"{used}/1.0.0"]
    assert by_name[f"{unused}/1.0.0"].endswith("(images, 12 files); used by no run")
    assert "from TFDS name synthetic_clusters:1.0.0; used by runs/deep/clusters" in by_name["synthetic_clusters/1.0.0"]
    entries = {entry["name"]: entry for entry in json.loads((tmp_path / "list.json").read_text())}
    size = entries[f"{unused}/1.0.0"]["bytes"]
    assert size == sum(path.stat().st_size for path in (data_dir / unused).rglob("*") if path.is_file())

    dry = run_python(["-m", "train", "data", "prune", "--runs", "runs", "--tfds-data-dir", str(data_dir),
                      "--dry-run"], cwd=tmp_path, env=clean_env())  # fmt: skip
    assert dry.returncode == 0 and "would free" in dry.stdout and f"Would remove {unused}/1.0.0" in dry.stdout
    assert len(_copies(data_dir)) == 2

    pruned = run_python(["-m", "train", "data", "prune", "--runs", "runs", "--tfds-data-dir", str(data_dir)],
                        cwd=tmp_path, env=clean_env())  # fmt: skip
    assert pruned.returncode == 0, pruned.stderr[-2000:]
    assert f"1 copy(ies) that no run under runs uses; freed {human(size)}" in pruned.stdout
    assert f"Removed {unused}/1.0.0" in pruned.stdout
    assert _copies(data_dir) == [used] and not (data_dir / unused).exists()
    assert (data_dir / "synthetic_clusters" / "1.0.0" / "dataset_info.json").is_file()  # a TFDS name's: kept
    records = [json.loads(path.read_text()) for path in (data_dir / written.INDEX).glob("*.json")]
    assert unused not in {record.get("name") for record in records}

    again = run_python(["-m", "train", "data", "prune", "--runs", "runs", "--tfds-data-dir", str(data_dir)],
                       cwd=tmp_path, env=clean_env())  # fmt: skip
    assert again.returncode == 0 and "nothing freed" in again.stdout


def test_the_data_commands_do_not_import_tensorflow(tmp_path):
    script = ("import sys\nfrom typer.testing import CliRunner\nfrom train.cli import app\n"
              "where = sys.argv[1]\n"
              "result = CliRunner().invoke(app, ['data', 'list', '--runs', where, '--tfds-data-dir', where])\n"
              "print(result.exit_code, 'tensorflow' in sys.modules)\n")  # fmt: skip
    result = run_python(["-c", script, str(tmp_path)], fresh=True)
    assert result.stdout.split() == ["0", "False"], result.stderr[-2000:]


@pytest.mark.skipif(not can_drop_file_override(), reason="root here cannot drop CAP_DAC_OVERRIDE")
def test_a_copy_that_cannot_be_removed_is_one_line_and_a_prune_run_again_removes_it(tmp_path):
    """A copy no run uses, holding a folder this user cannot write (prune runs without root's power over files):
    one line naming it, exit 1, no traceback; writable again, `data prune` removes it."""
    copy = tmp_path / "tfds" / "photos-0a1b2c3d" / written.VERSION  # a written copy, as train.data.written names one
    (copy / "images").mkdir(parents=True)
    (copy / "dataset_info.json").write_text("{}")
    (copy / written.SOURCE).write_text(json.dumps({"identity": {"kind": "images", "files": 1}, "source": "photos"}))
    (copy / "images" / "1.jpg").write_bytes(b"jpeg")
    (copy / "images").chmod(0o555)
    prune = ["data", "prune", "--runs", "runs", "--tfds-data-dir", str(tmp_path / "tfds")]
    refused = run_python(["-c", UNPRIVILEGED_TRAIN, *prune], cwd=tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    [trashed] = (tmp_path / "tfds" / ".train-removed").iterdir()  # out of TFDS's sight whole, in one rename
    assert refused.stderr.strip().splitlines() == [
        f"error: the copies no run uses are out of use, but {trashed / 'images' / '1.jpg'} could not be removed "
        f"(Permission denied): fix that and run `data prune` again to free {tmp_path / 'tfds' / '.train-removed'}"
    ]
    assert "Removed" not in refused.stdout and not copy.parent.exists()
    (trashed / "images").chmod(0o755)
    again = run_python(["-c", UNPRIVILEGED_TRAIN, *prune], cwd=tmp_path)
    assert again.returncode == 0 and "nothing freed" in again.stdout, again.stderr
    assert not (tmp_path / "tfds" / ".train-removed").exists()


def test_a_copy_of_run_json_among_mlflows_artifacts_is_not_a_run(tmp_path):
    """TRACKING=mlflow keeps run.json among a run's artifacts (mlartifacts/ beside the runs): a copy of it alone is
    not a run directory, so the data it names stays prunable once the run itself is gone."""
    data = {"kind": "images", "name": "photos-0a1b2c3d"}
    run = tmp_path / "runs" / "a"
    artifacts = tmp_path / "runs" / "mlartifacts" / "1" / "0123abcd" / "artifacts"
    for folder in (run, artifacts):
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"data": data}))
    (run / "settings.json").write_text("{}")
    assert prepared.runs_using(tmp_path / "runs", pytest.fail) == {f"photos-0a1b2c3d/{written.VERSION}": [run]}
