"""`python -m train devices`: what TensorFlow sees, what the settings resolve to, and what is wrong.

The report is plain data with a stable schema (`SCHEMA`); `diagnose` turns it into findings,
each with the fix, from the report alone, so every finding is tested with made-up facts.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from typing import Any

from train.devices.runtime import Runtime, configure_devices, resolve
from train.errors import SettingsError
from train.model_file import OWN_STEP_PRECISION, load_model_file, overrides
from train.settings import Settings
from train.tools import cuda_versions

SCHEMA = 1
GPU_ENVIRONMENT = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "TF_GPU_ALLOCATOR",
)
MIN_SHM_BYTES_FOR_NCCL = 1 << 30  # Docker's default 64 MiB /dev/shm makes NCCL fail or crawl with 2+ GPUs
_MIB = 1 << 20


@dataclass(frozen=True)
class Finding:
    severity: str  # "error": the requested devices are not usable; "warning": works, but not as meant
    code: str
    message: str
    fix: str


def shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_frsize * stats.f_blocks


def cuda_libraries() -> dict[str, list[str]]:
    """CUDA and cuDNN libraries this process could load: pip wheels, then the system's linker cache.

    "driver" is the NVIDIA driver's libcuda, which no wheel brings: the host has it, and a container gets
    it only when started with GPU access (the NVIDIA Container Toolkit mounts it in).
    """
    found: dict[str, list[str]] = {"cuda": [], "cudnn": [], "driver": []}
    for library, package in (("cuda", "nvidia-cuda-runtime-cu12"), ("cudnn", "nvidia-cudnn-cu12")):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[library].append(f"{metadata.version(package)} (pip {package})")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        cache = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        cache = ""
    for library, pattern in (("cuda", r"libcudart\.so\.(\d+)"), ("cudnn", r"libcudnn\.so\.(\d+)")):
        for major in sorted(set(re.findall(pattern, cache))):
            found[library].append(f"{major} (system)")
    drivers = sorted(set(re.findall(r"libcuda\.so\.(\d+)", cache)))
    found["driver"] = [f"libcuda.so.{major} (system)" for major in drivers]
    return found


def _own_step_precision(settings: Settings, resolution: Runtime) -> Runtime:
    """MIXED_PRECISION=auto's float32 for a model with its own train_step where it would be mixed_float16, as `fit`
    falls back (train.start)."""
    if settings.mixed_precision != "auto" or resolution.precision != "mixed_float16":
        return resolution
    import keras

    try:  # MODEL's file, loaded once here: a keras.Model class of its own with a train_step, told without building it
        classes = vars(load_model_file(settings.model).module).values()
    except SettingsError:  # a file that cannot be imported: fit will say why
        classes = ()
    own = any(
        isinstance(each, type) and issubclass(each, keras.Model) and overrides(each, "train_step") for each in classes
    )
    if not own:
        return resolution
    return replace(resolution, precision="float32", precision_why=f"MIXED_PRECISION=auto: {OWN_STEP_PRECISION}")


def collect_report(
    settings: Settings,
    backend: cuda_versions.ProbedDevices,
    environ: dict[str, str],
    shm: int | None,
    libraries: dict[str, list[str]],
    versions: dict[str, str],
    wheels: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Configure devices as training would, then gather every fact the doctor looks at.

    `wheels` is {"installed": {nvidia-* wheel: version}, "lock": {"file", "wheels"}} (none: nothing to compare).

    GPUS naming GPUs that TensorFlow does not see is what training refuses; here it is the first diagnosis,
    and the report shows every GPU there is (GPUS=all) so the other diagnoses can say why.
    """
    physical = backend.physical_gpus()
    missing_gpus = None
    try:
        plan = configure_devices(settings, backend)
    except SettingsError as error:
        if settings.gpus in ("all", "none"):
            raise
        missing_gpus, settings = str(error), replace(settings, gpus="all")
        plan = configure_devices(settings, backend)
        # Shown for what there is, not what would train: GPUS named GPUs, so it would not train on the CPU.
        plan = replace(plan, notes=tuple(n for n in plan.notes if not n.startswith("No GPU found")))
    resolution = _own_step_precision(settings, resolve(settings, plan))
    visible = set(resolution.plan.visible_gpus)
    gpus = []
    for index, gpu in enumerate(physical):
        details = backend.gpu_details(gpu)
        entry: dict[str, Any] = {
            "index": index,
            "name": details.get("device_name"),
            "compute_capability": ".".join(map(str, details.get("compute_capability") or ())) or None,
            "visible": index in visible,
            "memory_current_mb": None,
            "memory_peak_mb": None,
        }
        if index in visible:
            logical = sorted(visible).index(index)  # TensorFlow numbers visible GPUs in physical order
            memory = backend.memory_info(f"GPU:{logical}")
            entry["memory_current_mb"] = round(memory["current"] / _MIB, 1)
            entry["memory_peak_mb"] = round(memory["peak"] / _MIB, 1)
        gpus.append(entry)
    build = backend.build_info()
    report = {
        "schema": SCHEMA,
        "versions": versions,
        "build": {
            "cuda_build": bool(build.get("is_cuda_build")),
            "cuda_version": build.get("cuda_version"),
            "cudnn_version": build.get("cudnn_version"),
        },
        "cuda_libraries": libraries,
        "cuda_versions": cuda_versions.cuda_versions(
            build,
            (wheels or {}).get("installed", {}),
            backend.loaded_cuda_versions() if physical else None,  # a GPU-only call: the device seam
            (wheels or {}).get("lock", {"file": None, "wheels": {}}),
        ),
        "gpus": gpus,
        "environment": {name: environ.get(name) for name in GPU_ENVIRONMENT},
        "shm_bytes": shm,
        "devices": backend.device_names(),
        "resolved": resolution.describe(),
    }
    findings = diagnose(report, settings)
    if missing_gpus:
        message, _, fix = missing_gpus.partition(": use ")
        findings.insert(0, Finding("error", "requested_gpus_missing", message, f"use {fix}"))
    report["diagnoses"] = [asdict(finding) for finding in findings]
    return report


def _nvidia_says_gpus(environment: dict[str, str | None]) -> bool:
    value = environment.get("NVIDIA_VISIBLE_DEVICES")
    return value not in (None, "", "void", "none")


def diagnose(report: dict[str, Any], settings: Settings) -> list[Finding]:
    """What is wrong, in this order: GPUs TensorFlow does not see, its CUDA libraries, then an environment variable
    overriding a setting and what several GPUs need of the machine."""
    return [*_unseen_gpus(report, settings), *_cuda_libraries(report), *_overrides_and_limits(report, settings)]


def _unseen_gpus(report: dict[str, Any], settings: Settings) -> list[Finding]:
    """No GPU seen where one was meant: NVIDIA_VISIBLE_DEVICES names some, or the CUDA wheels are there."""
    findings = []
    environment, build, gpus = report["environment"], report["build"], report["gpus"]

    if not gpus and _nvidia_says_gpus(environment):
        if not build["cuda_build"]:
            cause, fix = (
                "this TensorFlow is a CPU-only build",
                "install tensorflow[and-cuda] (make setup EXTRAS=dev,gpu)",
            )
        elif not report["cuda_libraries"]["cudnn"]:
            cause, fix = "no cuDNN library is installed", "install tensorflow[and-cuda], which brings CUDA and cuDNN"
        else:
            cause, fix = (
                "the container was probably started without GPU access",
                "run it with --gpus all (docker) or a GPU resource request (Kubernetes)",
            )
        findings.append(
            Finding(
                "error" if settings.gpus != "none" else "warning",
                "gpus_not_seen",
                f"NVIDIA_VISIBLE_DEVICES={environment['NVIDIA_VISIBLE_DEVICES']} says there are GPUs, "
                f"but TensorFlow sees none: {cause}",
                fix,
            )
        )

    libraries = report["cuda_libraries"]
    if (
        not gpus
        and build["cuda_build"]
        and libraries["cuda"]
        and libraries["cudnn"]
        and not libraries["driver"]
        and not _nvidia_says_gpus(environment)
    ):  # the GPU image started with plain `docker run`: the CUDA wheels are there, the driver is not
        findings.append(
            Finding(
                "error" if settings.gpus != "none" else "warning",
                "no_gpu_driver",
                "TensorFlow has its CUDA and cuDNN libraries but no NVIDIA driver (libcuda.so.1) is visible, so it "
                "sees no GPU: most likely a container started without --gpus (or a machine without the NVIDIA driver)",
                "start the container with GPU access: docker run --gpus all (make docker-* GPUS=all), a nvidia.com/gpu "
                "resource limit (Kubernetes), --gpus-per-node (Slurm); on a machine, install the NVIDIA driver",
            )
        )
    return findings


def _cuda_libraries(report: dict[str, Any]) -> list[Finding]:
    """cuDNN against TensorFlow's build, the CUDA wheels installed and loaded against the lock."""
    findings = []
    build, gpus = report["build"], report["gpus"]

    wanted_cudnn = (build.get("cudnn_version") or "").split(".")[0]
    found_cudnn = report["cuda_libraries"]["cudnn"]
    if (
        build["cuda_build"]
        and wanted_cudnn
        and found_cudnn
        and not any(v.startswith(wanted_cudnn) for v in found_cudnn)
    ):
        findings.append(
            Finding(
                "error" if not gpus else "warning",
                "cudnn_mismatch",
                f"TensorFlow was built for cuDNN {wanted_cudnn} (CUDA {build.get('cuda_version')}) "
                f"but the cuDNN found is {', '.join(found_cudnn)}",
                "install tensorflow[and-cuda] for matching wheels; do not base images on tensorflow/tensorflow:*-gpu",
            )
        )

    versions, lock = report["cuda_versions"], cuda_versions.GPU_LOCK
    if versions["installed_differ"]:
        findings.append(
            Finding(
                "warning",
                "cuda_wheels_differ_from_lock",
                f"the CUDA wheels installed differ from {lock}: " + "; ".join(versions["installed_differ"]),
                f"install from the lock: make setup EXTRAS=dev,gpu (pip install --require-hashes -r {lock}), "
                "or rebuild the image",
            )
        )
    if versions["loaded_differ"]:
        findings.append(
            Finding(
                "warning",
                "loaded_cuda_differs_from_lock",
                "this process loaded CUDA libraries other than the locked wheels: "
                + "; ".join(versions["loaded_differ"]),
                "a system copy comes first: remove its directory from LD_LIBRARY_PATH (or ldconfig's path), so "
                "TensorFlow loads the pip wheels",
            )
        )
    return findings


def _overrides_and_limits(report: dict[str, Any], settings: Settings) -> list[Finding]:
    """An environment variable overriding a setting, and what several GPUs need of the machine."""
    findings = []
    environment, gpus = report["environment"], report["gpus"]

    forced = environment.get("TF_FORCE_GPU_ALLOW_GROWTH")
    if forced is not None and gpus:
        forced_on = forced.lower() == "true"
        if forced_on != settings.memory_growth or (forced_on and settings.gpu_memory_limit_mb):
            findings.append(
                Finding(
                    "warning",
                    "allow_growth_override",
                    f"TF_FORCE_GPU_ALLOW_GROWTH={forced} overrides MEMORY_GROWTH="
                    f"{str(settings.memory_growth).lower()} in TensorFlow's allocator",
                    "unset TF_FORCE_GPU_ALLOW_GROWTH and use MEMORY_GROWTH",
                )
            )

    if len(gpus) > 1 and environment.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        findings.append(
            Finding(
                "warning",
                "device_order",
                "GPU indices follow CUDA's fastest-first order, which may not match nvidia-smi",
                "set CUDA_DEVICE_ORDER=PCI_BUS_ID so GPUS=0,1 means nvidia-smi's 0 and 1",
            )
        )

    visible = [gpu for gpu in gpus if gpu["visible"]]
    shm = report["shm_bytes"]
    if len(visible) > 1 and shm is not None and shm < MIN_SHM_BYTES_FOR_NCCL:
        findings.append(
            Finding(
                "warning",
                "small_shm",
                f"/dev/shm is {shm // _MIB} MiB; NCCL needs more to all-reduce across {len(visible)} GPUs",
                "docker run --shm-size=1g (or --ipc=host); compose: shm_size",
            )
        )
    return findings


def device_report(settings: Settings) -> dict[str, Any]:
    """The real report: TensorFlow's devices, this process's environment and libraries."""
    import keras
    import tensorflow as tf

    versions = {"tensorflow": tf.__version__, "keras": keras.__version__}
    lock = cuda_versions.lock_path()
    wheels = {
        "installed": cuda_versions.installed_wheels(),
        "lock": {"file": str(lock) if lock else None, "wheels": cuda_versions.locked_wheels(lock)},
    }
    return collect_report(
        settings, cuda_versions.ProbedDevices(), dict(os.environ), shm_bytes(), cuda_libraries(), versions, wheels
    )


def _gpu_memory(resolved: dict[str, Any]) -> str:
    if not resolved["visible_gpus"]:
        return "no GPU, so no GPU memory settings"
    if resolved["memory_limit_mb"] is not None:
        return f"memory cap {resolved['memory_limit_mb']} MiB per GPU"
    return f"memory growth {'on' if resolved['memory_growth'] else 'off'}"


def _libraries_line(report: dict[str, Any]) -> str:
    """The CUDA and cuDNN libraries found, and what they mean for this TensorFlow."""
    build, found = report["build"], report["cuda_libraries"]
    listed = (
        f"CUDA runtime {', '.join(found['cuda']) or 'none'}; cuDNN {', '.join(found['cudnn']) or 'none'}; "
        f"NVIDIA driver {', '.join(found.get('driver', [])) or 'none'}"
    )
    if not build["cuda_build"]:
        return f"CUDA libraries found: {listed} (this CPU-only TensorFlow uses none of them)"
    wanted = f"CUDA {str(build['cuda_version']).split('.')[0]} and cuDNN {str(build['cudnn_version']).split('.')[0]}"
    return (
        f"CUDA libraries found: {listed}. This TensorFlow loads {wanted}: the pip wheels of make setup "
        "EXTRAS=dev,gpu where installed, else the system's (of those majors only)"
    )


def format_report(report: dict[str, Any]) -> str:
    """The human table."""
    build, resolved = report["build"], report["resolved"]
    lines = [
        f"TensorFlow {report['versions']['tensorflow']}, Keras {report['versions']['keras']}; "
        + (
            f"built for CUDA {build['cuda_version']}, cuDNN {build['cudnn_version']}"
            if build["cuda_build"]
            else "CPU-only build"
        ),
        _libraries_line(report),
        *cuda_versions.format_versions(report["cuda_versions"]),
        "",
        "GPUs:" if report["gpus"] else "GPUs: none seen by TensorFlow",
    ]
    for gpu in report["gpus"]:
        memory = (
            f", memory now {gpu['memory_current_mb']} MiB, peak {gpu['memory_peak_mb']} MiB" if gpu["visible"] else ""
        )
        lines.append(
            f"  {gpu['index']}: {gpu['name'] or '?'} (compute {gpu['compute_capability'] or '?'})"
            f"{' visible' if gpu['visible'] else ' hidden by GPUS'}{memory}"
        )
    lines += ["", "Logical devices: " + ", ".join(report["devices"]["logical"])]
    environment = [f"{name}={value}" for name, value in report["environment"].items() if value is not None]
    lines += ["GPU environment: " + (", ".join(environment) or "none of " + ", ".join(GPU_ENVIRONMENT))]
    shm = report["shm_bytes"]
    lines += [f"/dev/shm: {shm // _MIB} MiB" if shm is not None else "/dev/shm: not found", ""]
    lines += [
        f"Resolved: strategy {resolved['strategy']} on {', '.join(resolved['devices'])}; "
        f"{resolved['replicas']} replica(s) x {resolved['per_replica_batch']}"
        + (f" x {resolved['accumulation']} micro-batches" if resolved.get("accumulation", 1) > 1 else "")
        + f" = global batch {resolved['global_batch']}; "
        + _gpu_memory(resolved),
        f"  precision: {resolved['precision']} ({resolved['precision_why']}); deterministic ops: "
        + ("on (DETERMINISTIC=true; XLA stays off)" if resolved["deterministic"] else "off (DETERMINISTIC=false)"),
    ]
    lines += [f"  {note}" for note in resolved["notes"]]
    cluster = resolved.get("cluster")
    if cluster:
        lines.append(
            f"Cluster (TF_CONFIG): this is {cluster['task']} = worker {cluster['worker_index']} of "
            f"{len(cluster['workers'])}{' (chief)' if cluster['is_chief'] else ''} at {cluster['address']}; "
            f"{len(resolved['devices'])} replica(s) per worker"
        )
        lines += [f"  worker {i}: {address}" for i, address in enumerate(cluster["workers"])]
    if report["diagnoses"]:
        lines.append("")
        for finding in report["diagnoses"]:
            lines.append(f"{finding['severity'].upper()}: {finding['message']}")
            lines.append(f"  fix: {finding['fix']}")
    else:
        lines += ["", "No problems found."]
    return "\n".join(lines)
