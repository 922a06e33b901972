"""Shared fixtures. Tests that run TensorFlow do it in a process of its own (devices are fixed per process),
forked from a server that has imported TensorFlow already (start_python).

Two tiers. `make test` is the fast one, every test not marked `slow` (about 9 minutes from a fresh clone on 2 cores,
the set-up included); `make test-all` runs every test, and is what CI runs (`.ci/run`, after `make test` as the
README gives it). The fast tier covers, and must keep covering:
- each command once end to end: `fit` as a user types it, its resume, `evaluate`, `predict` (test_train,
  test_journeys, test_predict), `devices` (test_doctor), `check` (test_probe), `data list` and `data prune`
  (test_prepared);
- one journey per kind of DATASET on one device (test_journeys: a TFDS name, an image folder, split folders, a CSV,
  a JSON Lines file: fit, its resume, evaluate, predict, a changed source refused; a table whose label is a value:
  its fit there, and fit, evaluate and predict in test_table_regression);
- the fork's contract test (test_project) and the MODEL file's seams (test_model_contract, test_experiment);
- the settings and the errors (test_settings, test_cli, test_errors, test_bad_files, test_multi_worker's TF_CONFIG
  checks), and the engine's map (test_layout);
- two replicas (test_train, test_data) and one run on two workers (test_multi_worker).
The slow tier holds what repeats those across more cases: the fuzz of damaged runs, signals and kills on two
workers, INIT_FROM with phases on every kind, the benchmarks, tune and tracking. A test that is slow only because it
repeats its set-up is made cheaper, not marked slow.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.harness.forked import Forked, Server
from train.settings import (
    DEFAULT_MODEL,
    ENVIRONMENT_TYPO_CUTOFF,
    FIELDS,
    FIELDS_BY_ENV,
    likely_typos,
    project_defaults_path,
    read_dotenv,
)

REPO = Path(__file__).resolve().parents[1]
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"  # the tests' own MLflow clients (clean_env sets it for every run)
# Where the harnesses and other processes without a tmp_path of their own run: an empty folder, so that a
# developer's .env in the repository (read from the working directory) never reaches a test (start_python refuses
# REPO as a working directory).
HARNESS_CWD = Path(tempfile.mkdtemp(prefix="harness-cwd-"))
atexit.register(shutil.rmtree, HARNESS_CWD, True)

# The files of many end-to-end runs, longest first (measured with --durations): `make test` hands whole files
# to its two workers in collection order, so the long ones start first and the short ones fill in at the end,
# rather than one long file running alone while the other worker idles.
LONGEST_FIRST = (
    "test_journeys.py", "test_multi_worker.py", "test_local_data.py", "test_fuzz.py", "test_elastic.py",
    "test_bench_processes.py", "test_bench.py", "test_preprocess.py", "test_text.py", "test_tune.py",
    "test_finetune.py", "test_predict.py", "test_examples.py", "test_table_regression.py", "test_phases.py",
    "test_accumulation.py", "test_data.py", "test_custom_step.py", "test_memory.py", "test_tracking.py",
    "test_init_from.py", "test_train.py", "test_experiment.py", "test_resilience.py", "test_tables.py",
    "test_replicas.py", "test_dcgan.py", "test_slurm.py", "test_statistics.py", "test_pretrained.py", "test_probe.py",
    "test_prepared.py", "test_bad_files.py", "test_project.py", "test_contract.py", "test_observability.py",
    "test_doctor.py", "test_first_run.py", "test_errors.py", "test_model_contract.py", "test_harness.py",
    "test_gpu.py",
)  # fmt: skip


# The extras a test may need (pyproject.toml's optional-dependencies), by the modules each brings. A test that
# imports one carries needs(EXTRA) (or its module does, as `pytestmark`), so that it skips without it, naming the
# extra: `make test` runs on the README's set-up, which installs none (tests/test_harness.py checks the marks).
EXTRA_MODULES = {
    "hub": ("keras_hub", "kagglehub", "tensorflow_text"),
    "track": ("mlflow",),
    "tune": ("optuna",),
    "formats": ("tf2onnx", "onnx", "onnxruntime", "ai_edge_litert"),
}


def needs(extra: str) -> pytest.MarkDecorator:
    """Skips where a module of `extra` is not installed, with a line naming the extra to install."""
    missing = [module for module in EXTRA_MODULES[extra] if importlib.util.find_spec(module) is None]
    reason = f"{', '.join(missing)} not installed: make setup EXTRAS=dev,{extra} (the {extra} extra)"
    return pytest.mark.skipif(bool(missing), reason=reason)


SLOW_TIMEOUT = 1200  # seconds: a slow test's bound (pyproject.toml's `timeout`, 600, is every other test's)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order is kept
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


def engine_defaults() -> dict[str, str]:
    """The template's own defaults for MODEL and for whatever a fork's project/defaults.env sets: the engine's
    tests name what they train (the documented model, the default dataset), so a fork's defaults cannot
    change them."""
    path = project_defaults_path()
    forked = read_dotenv(path) if path else {}
    return {"MODEL": DEFAULT_MODEL, **{name: FIELDS_BY_ENV[name].default for name in forked if name in FIELDS_BY_ENV}}


# What the tests' runs set unless a test says otherwise (JIT_COMPILE=None: the engine's own default, auto).
# XLA off: its compile is about a quarter of a small fit's CPU (0.75 s of 3.2 s, one CPU device) and most runs
# here test something else. JIT_COMPILE=auto's choices are tested where they are the point: tests/test_devices.py
# (each reason), the journeys (every kind of DATASET, fit to predict, with XLA where auto picks it), test_train,
# test_data and the tests that name JIT_COMPILE.
TEST_DEFAULTS = {"JIT_COMPILE": "false"}


def clean_env(**settings: object) -> dict[str, str]:
    """The process environment without any setting of the user's, plus the engine's defaults, TEST_DEFAULTS and the
    given ones (a setting given as None is left out: unset, so the engine's default)."""
    not_passed = {f.env for f in FIELDS} | {"TF_CONFIG"}  # a TF_CONFIG in the shell would make every run multi-worker
    not_passed |= {name for name in os.environ if name.startswith("HP_")}  # build_model's settings (train/hparams.py)
    not_passed |= set(likely_typos(os.environ, ENVIRONMENT_TYPO_CUTOFF))  # their warnings would add lines to stderr
    not_passed |= {name for name in os.environ if name.startswith("MLFLOW_")}  # a user's tracking server, not ours
    env = {name: value for name, value in os.environ.items() if name not in not_passed}
    env.update(engine_defaults())
    env.update(TEST_DEFAULTS)
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"  # no test sends MLflow's usage telemetry
    env.update({name: str(value) for name, value in settings.items()})
    for name in [name for name, value in settings.items() if value is None]:
        del env[name]
    env["PYTHONPATH"] = str(REPO)
    return env


_server: Server | None = None


def start_python(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, fresh: bool = False,
                 without_dotenv: bool = False, **streams) -> Forked | subprocess.Popen:  # fmt: skip
    """`python ARGV` (`-m MODULE ...` or `-c CODE ...`) started as subprocess.Popen would, but forked from a
    server that has imported TensorFlow already (tests/harness/forkserver.py; docs/design.md says why). `fresh=True`
    starts a new interpreter instead: for tests of what happens while modules import. `without_dotenv`: ARGV turns
    the .env layer off itself (tests/harness/contract.py), so it may run in the repository."""
    global _server
    cwd, env = cwd or HARNESS_CWD, clean_env() if env is None else env
    if Path(cwd).resolve() == REPO and not without_dotenv:
        raise ValueError(f"a test process started in {REPO} would read a developer's .env there: use tmp_path")
    if fresh:
        return subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, **streams)
    if _server is None:
        _server = Server(clean_env())
        atexit.register(_server.close)
    return Forked(_server, argv, cwd=cwd, env=env, **streams)


def run_python(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300,
               fresh: bool = False, without_dotenv: bool = False) -> subprocess.CompletedProcess:  # fmt: skip
    """`python ARGV` run to its end, its output captured as text, like subprocess.run."""
    process = start_python(argv, cwd=cwd, env=env, fresh=fresh, without_dotenv=without_dotenv,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_train(*args: str, cwd: Path, timeout: float = 300, fresh: bool = False, **settings: object
              ) -> subprocess.CompletedProcess:  # fmt: skip
    """`python -m train ARGS` as a user types it, in `cwd` (so no stray .env is read)."""
    return run_python(["-m", "train", *args], cwd=cwd, env=clean_env(**settings), timeout=timeout, fresh=fresh)


def start_train(*args: str, cwd: Path, stdin=None, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                **settings: object) -> Forked:  # fmt: skip
    """`python -m train ARGS` started (a Popen-like process, see start_python); its output piped as text unless
    stdin/stdout/stderr say otherwise."""
    return start_python(["-m", "train", *args], cwd=cwd, env=clean_env(**settings), stdin=stdin, stdout=stdout,
                        stderr=stderr, text=True)  # fmt: skip


def wait_for(found, process, what: str, timeout: float = 120) -> None:
    """Polls `found()` until it is true; fails the test at the deadline, or when `process` ends before it."""
    deadline = time.monotonic() + timeout
    while not found():
        if process.poll() is not None:
            pytest.fail(f"the run ended (exit {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no {what} after {timeout:.0f} s")
        time.sleep(0.02)


def kill_mid_run(process, output_dir: Path, settle: float = 0.0, pattern: str = "checkpoints/ckpt-[1-9]*.index",
                 timeout: float = 120) -> None:  # fmt: skip
    """SIGKILL a run once it has written a checkpoint past 0 (`pattern`) and `settle` seconds more; fails the test
    when none comes before the deadline, or when the run was no longer going when killed."""
    wait_for(lambda: any(output_dir.glob(pattern)), process, f"{pattern} in {output_dir}", timeout)
    time.sleep(settle)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, f"the run ended (exit {process.returncode}) before it was killed"
    assert not (output_dir / "summary.json").exists(), "the run finished before it was killed: make it longer"


SAME_WEIGHTS = """
import sys, numpy as np, keras
a, b = (keras.saving.load_model(path) for path in sys.argv[1:3])
print(all(np.array_equal(x, y) for x, y in zip(a.get_weights(), b.get_weights(), strict=True)))
"""


def same_weights(first: Path, second: Path) -> bool:
    """Whether two exported models have bit-identical weights (compared in a fresh process)."""
    result = run_python(["-c", SAME_WEIGHTS, str(first), str(second)])
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-1] == "True"


def read_summary(output_dir: Path) -> dict:
    return json.loads((output_dir / "summary.json").read_text())


def prepare_data_dir(script: str, data_dir: Path) -> None:
    result = run_python(["-c", script, str(data_dir)])
    assert result.returncode == 0, result.stderr[-3000:]


def copy_data_dir(source: Path, destination: Path) -> None:
    """A private copy of a shared data dir, to damage or watch: without the arrays caches, which runs on the
    other worker may be rewriting meanwhile."""
    # train/data/source.py's CACHE_DIR (importing that module would import TensorFlow into pytest's process)
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns("train-arrays-cache"))


def shared_data_dir(tmp_path_factory: pytest.TempPathFactory, name: str, script: str) -> Path:
    """A data dir prepared once per test session, by whichever of make test's workers asks first (the others
    wait on its lock), in the session's temporary folder. The tests only read it (runs may add their arrays
    cache, written whole or not at all)."""
    session = tmp_path_factory.getbasetemp()
    session = session.parent if os.environ.get("PYTEST_XDIST_WORKER") else session  # xdist: gw0, gw1 in it
    data_dir = session / name
    with open(session / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (session / f"{name}.prepared").exists():
            shutil.rmtree(data_dir, ignore_errors=True)
            data_dir.mkdir()
            prepare_data_dir(script, data_dir)
            (session / f"{name}.prepared").touch()
    return data_dir


@pytest.fixture(scope="session")
def tfds_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TFDS data dir with the default dataset generated once a session, offline."""
    script = (
        "import sys, tensorflow_datasets as tfds, train.datasets.synthetic\n"
        "tfds.builder('synthetic_clusters', data_dir=sys.argv[1]).download_and_prepare()\n"
    )
    return shared_data_dir(tmp_path_factory, "tensorflow_datasets", script)


@pytest.fixture(scope="session")
def examples_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TFDS data dir with the examples' datasets generated once, offline: synthetic_images (the CNN's,
    PNG-encoded as TFDS stores cifar10), synthetic_values (regression) and synthetic_tags (multi-label)."""
    script = (
        "import sys, tensorflow_datasets as tfds, train.datasets.synthetic, tests.datasets\n"
        "for name in ('synthetic_images', 'synthetic_values', 'synthetic_tags'):\n"
        "    tfds.builder(name, data_dir=sys.argv[1]).download_and_prepare()\n"
    )
    return shared_data_dir(tmp_path_factory, "example_datasets", script)


@pytest.fixture(scope="session")
def photos_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TFDS data dir with the general path's datasets generated once, offline: synthetic_photos (images of
    their own size, stored as JPEG) and synthetic_columns (a dict of columns)."""
    script = (
        "import sys, tensorflow_datasets as tfds, train.datasets.synthetic\n"
        "for name in ('synthetic_photos', 'synthetic_columns'):\n"
        "    tfds.builder(name, data_dir=sys.argv[1]).download_and_prepare()\n"
    )
    return shared_data_dir(tmp_path_factory, "photo_datasets", script)


@pytest.fixture(scope="session")
def text_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TFDS data dir with synthetic_reviews (short texts with a class label) generated once, offline."""
    script = (
        "import sys, tensorflow_datasets as tfds, train.datasets.synthetic\n"
        "tfds.builder('synthetic_reviews', data_dir=sys.argv[1]).download_and_prepare()\n"
    )
    return shared_data_dir(tmp_path_factory, "text_datasets", script)


@pytest.fixture(scope="session")
def sharded_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default dataset prepared in 4 files (TFDS's num_shards), once a session: workers split the files
    (test_multi_worker), and a run of the 1-file preparation refuses it as data prepared anew (test_local_data)."""
    script = (
        "import sys, tensorflow_datasets as tfds, train.datasets.synthetic\n"
        "tfds.builder('synthetic_clusters', data_dir=sys.argv[1]).download_and_prepare("
        "download_config=tfds.download.DownloadConfig(num_shards=4))\n"
    )
    return shared_data_dir(tmp_path_factory, "four_shards", script)


WIDE_BYTES = (4_000 + 250) * (16_384 * 4 + 8)  # wide_values (tests/datasets): 262 MB of float32, and the labels


@pytest.fixture(scope="session")
def wide_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TFDS data dir with wide_values (tests/datasets) generated once a session, offline: splits of a few
    hundred MB (test_memory's, and test_gpu's where there is a GPU)."""
    script = (
        "import sys, tensorflow_datasets as tfds, tests.datasets\n"
        "tfds.builder('wide_values', data_dir=sys.argv[1]).download_and_prepare()"
    )
    return shared_data_dir(tmp_path_factory, "wide_datasets", script)


_EVENTS = """
import json, sys
from pathlib import Path
import tensorflow as tf
from tensorboard.plugins.hparams import plugin_data_pb2
logs = Path(sys.argv[1])
found = {"hparams": {}, "eval": {}}
for path in logs.glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name == "hparams":
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                for name, hparam in data.session_start_info.hparams.items():
                    found["hparams"][name] = hparam.string_value or hparam.number_value or hparam.bool_value
for path in (logs / "eval").glob("events.out.tfevents.*"):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
        for value in event.summary.value:
            found["eval"][value.tag] = float(tf.make_ndarray(value.tensor))
print(json.dumps(found))
"""


def tensorboard_events(logs: Path) -> dict:
    """What a run's logs/ hold for TensorBoard: {"hparams": the session's values, "eval": the last value of
    each eval/ tag}, read by TensorBoard's own protos in a fresh process."""
    read = run_python(["-c", _EVENTS, str(logs)])
    assert read.returncode == 0, read.stderr[-3000:]
    return json.loads(read.stdout.strip().splitlines()[-1])
