"""The device doctor: each diagnosis from made-up facts, through the same device seam as training.

`FakeDevices` (from test_devices) stands in for `train.devices.backend.TensorFlowDevices`, and here for
`train.tools.cuda_versions.ProbedDevices`: it also reports GPU names, memory, TensorFlow's build and the versions
the loaded CUDA libraries would report (`loaded_cuda_versions`, the ctypes calls only a GPU machine makes).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, run_python, run_train
from tests.test_devices import FakeDevices
from train.settings import load_settings
from train.tools.cuda_versions import decode_version
from train.tools.doctor import collect_report, format_report

CUDA_BUILD = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}
MATCHING_LIBRARIES = {"cuda": ["12.5.82 (pip nvidia-cuda-runtime-cu12)"], "cudnn": ["9.3.0.75 (pip nvidia-cudnn-cu12)"]}
MATCHING_LIBRARIES |= {"driver": ["libcuda.so.1 (system)"]}
NO_DRIVER = MATCHING_LIBRARIES | {"driver": []}  # the CUDA wheels of the GPU image, in a container without --gpus
LOCKED = {"nvidia-cudnn-cu12": "9.3.0.75", "nvidia-cuda-runtime-cu12": "12.5.82", "nvidia-nccl-cu12": "2.27.7"}
LOCKED |= {"nvidia-cublas-cu12": "12.5.3.2"}
LOCK = {"file": "/src/requirements-gpu.lock", "wheels": LOCKED}
LOADED = {"cudnn": "9.3.0", "cuda": "12.5", "nccl": "2.27.7"}  # what cudnnGetVersion & co. say of the locked wheels


class DoctorDevices(FakeDevices):
    def __init__(self, gpu_count: int, build: dict | None = None, loaded: dict | None = None) -> None:
        super().__init__(gpu_count)
        self.build = build or CUDA_BUILD
        self.loaded = LOADED if loaded is None else loaded

    def gpu_details(self, gpu):
        return {"device_name": f"Fake A100 {gpu}", "compute_capability": (8, 0)}

    def memory_info(self, device):
        return {"current": 512 << 20, "peak": 1024 << 20}

    def build_info(self):
        return self.build

    def device_names(self):
        return {"physical": ["/physical_device:CPU:0", *self.gpus], "logical": ["/device:CPU:0"]}

    def loaded_cuda_versions(self):
        assert self.gpus, "the loaded libraries are asked only where a GPU is present"
        return self.loaded


def report(gpus=0, environ=None, shm=8 << 30, libraries=None, build=None, wheels=None, loaded=None, **settings):
    return collect_report(
        load_settings({}, settings, "/nonexistent/.env"),
        DoctorDevices(gpus, build, loaded),
        environ or {},
        shm,
        MATCHING_LIBRARIES if libraries is None else libraries,
        {"tensorflow": "2.21.0", "keras": "3.15.1"},
        wheels,
    )


def version_rows(result):
    lines = format_report(result).splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("CUDA versions"))
    return [line.split() for line in lines[start : start + 5]]


def codes(result):
    return [(d["severity"], d["code"]) for d in result["diagnoses"]]


def test_healthy_gpu_machine_has_no_findings_and_reports_each_gpu():
    result = report(gpus=2, environ={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, GPUS="1")
    assert codes(result) == []
    assert result["gpus"][1] == {
        "index": 1, "name": "Fake A100 GPU:1", "compute_capability": "8.0", "visible": True,
        "memory_current_mb": 512.0, "memory_peak_mb": 1024.0,
    }  # fmt: skip
    assert result["gpus"][0]["visible"] is False
    assert result["resolved"]["strategy"] == "one_device"
    assert "No problems found." in format_report(result)


def test_nvidia_environment_but_no_gpu_seen_in_a_container_without_gpus():
    result = report(environ={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert codes(result) == [("error", "gpus_not_seen")]
    assert "--gpus all" in result["diagnoses"][0]["fix"]


def test_nvidia_environment_with_cpu_only_tensorflow():
    result = report(environ={"NVIDIA_VISIBLE_DEVICES": "0"}, build={"is_cuda_build": False})
    assert codes(result) == [("error", "gpus_not_seen")]
    assert "CPU-only build" in result["diagnoses"][0]["message"]


def test_nvidia_environment_without_cuda_libraries():
    result = report(environ={"NVIDIA_VISIBLE_DEVICES": "all"}, libraries={"cuda": [], "cudnn": []})
    assert "no cuDNN library" in result["diagnoses"][0]["message"]
    assert "tensorflow[and-cuda]" in result["diagnoses"][0]["fix"]


def test_cuda_wheels_without_a_driver_are_a_container_started_without_gpus():
    result = report(libraries=NO_DRIVER)
    assert codes(result) == [("error", "no_gpu_driver")]
    assert "a container started without --gpus" in result["diagnoses"][0]["message"]
    assert "docker run --gpus all" in result["diagnoses"][0]["fix"]
    assert "NVIDIA driver none" in format_report(result)
    assert codes(report(libraries=NO_DRIVER, GPUS="none")) == [("warning", "no_gpu_driver")]  # no GPU was asked for


def test_no_cuda_wheels_and_no_driver_is_a_cpu_machine_with_nothing_wrong():
    assert codes(report(libraries={"cuda": [], "cudnn": [], "driver": []})) == []


def test_cudnn_other_than_the_build_wants():
    result = report(libraries={"cuda": ["12 (system)"], "cudnn": ["8 (system)"], "driver": ["libcuda.so.1 (system)"]})
    assert codes(result) == [("error", "cudnn_mismatch")]
    assert "built for cuDNN 9" in result["diagnoses"][0]["message"]


def test_tf_force_gpu_allow_growth_overriding_memory_growth():
    result = report(gpus=1, environ={"TF_FORCE_GPU_ALLOW_GROWTH": "true"}, MEMORY_GROWTH="false")
    assert codes(result) == [("warning", "allow_growth_override")]


def test_several_gpus_without_pci_bus_order():
    assert ("warning", "device_order") in codes(report(gpus=2))


def test_tiny_shm_with_several_gpus():
    result = report(gpus=2, environ={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, shm=64 << 20)
    assert codes(result) == [("warning", "small_shm")]
    assert "64 MiB" in result["diagnoses"][0]["message"]


def test_gpus_that_are_not_there_are_the_first_diagnosis_and_every_gpu_is_still_reported():
    result = report(gpus=1, environ={"NVIDIA_VISIBLE_DEVICES": "all"}, GPUS="0,2")
    assert codes(result) == [("error", "requested_gpus_missing")]
    finding = result["diagnoses"][0]
    assert finding["message"] == "GPUS=0,2 asks for GPU 2, but TensorFlow sees 1 GPU(s) (indices 0-0)"
    assert finding["fix"] == "use GPUS=all, GPUS=none or existing indices"
    assert [gpu["visible"] for gpu in result["gpus"]] == [True]  # shown as GPUS=all would configure them
    assert "ERROR: GPUS=0,2 asks for GPU 2" in format_report(result)


def test_gpus_that_are_not_there_on_a_machine_without_any_do_not_say_it_would_train_on_the_cpu():
    result = report(gpus=0, GPUS="0")
    assert codes(result)[0] == ("error", "requested_gpus_missing")
    assert "training on CPU" not in format_report(result)  # GPUS=0 is refused: it would not train at all


def test_cpu_machine_with_nothing_wrong():
    result = report(CPU_DEVICES="2")
    assert codes(result) == []
    assert result["resolved"]["replicas"] == 2


def test_devices_command_on_this_cpu_machine(tmp_path):
    result = run_train("devices", "--json", cwd=tmp_path, CPU_DEVICES=2)
    assert result.returncode == 0, result.stderr[-2000:]
    payload = json.loads(result.stdout)
    assert payload["schema"] == 1
    assert payload["gpus"] == []
    assert payload["devices"]["logical"] == ["/device:CPU:0", "/device:CPU:1"]
    assert payload["resolved"]["global_batch"] == 256

    flagged = run_train("devices", cwd=tmp_path, NVIDIA_VISIBLE_DEVICES="all")
    assert flagged.returncode == 1
    assert "ERROR: NVIDIA_VISIBLE_DEVICES=all says there are GPUs, but TensorFlow sees none" in flagged.stdout


@pytest.mark.parametrize(("capability", "precision"), [((8, 0), "mixed_bfloat16"), ((7, 0), "mixed_float16")])
def test_devices_says_the_precision_auto_chose_and_why_and_the_determinism_switch(capability, precision):
    class Devices(DoctorDevices):
        def gpu_details(self, gpu):
            return {"device_name": f"Fake GPU {gpu}", "compute_capability": capability}

    result = collect_report(
        load_settings({}, {"DETERMINISTIC": "true"}, "/nonexistent/.env"), Devices(1), {}, 8 << 30,
        MATCHING_LIBRARIES, {"tensorflow": "2.21.0", "keras": "3.15.1"},
    )  # fmt: skip
    line = next(line for line in format_report(result).splitlines() if line.startswith("  precision: "))
    # why: the compute capability it was chosen for
    assert line.startswith(f"  precision: {precision} (every GPU has compute capability {capability[0]}.")
    assert line.endswith("deterministic ops: on (DETERMINISTIC=true; XLA stays off)")


# The doctor on a T4-like host (compute capability 7.x: auto would be mixed_float16) for a MODEL whose class has its
# own train_step: in a process of its own, since telling so imports the MODEL file (and TensorFlow with it).
OWN_STEP_PRECISION = """
import sys
from tests.test_doctor import MATCHING_LIBRARIES, DoctorDevices
from train.settings import load_settings
from train.tools.doctor import collect_report, format_report

class Devices(DoctorDevices):
    def gpu_details(self, gpu):
        return {"device_name": f"Fake T4 {gpu}", "compute_capability": (7, 5)}

settings = load_settings({}, {"MODEL": sys.argv[1]}, "/nonexistent/.env")
result = collect_report(settings, Devices(1), {}, 8 << 30, MATCHING_LIBRARIES,
                        {"tensorflow": "2.21.0", "keras": "3.15.1"})
print(next(line for line in format_report(result).splitlines() if line.startswith("  precision: ")))
"""


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("examples/gan.py", "  precision: float32 (MIXED_PRECISION=auto: float32, not mixed_float16, for a model's "
         "own train_step (its loss scale would judge each replica's gradients alone); mixed_bfloat16 needs compute "
         "capability 8.0+); deterministic ops: off (DETERMINISTIC=false)"),
        ("examples/mlp.py", "  precision: mixed_float16 (every GPU has compute capability 7."),
    ],
)  # fmt: skip
def test_the_precision_line_knows_the_float32_fit_gives_a_model_with_its_own_train_step(model, said, tmp_path):
    result = run_python(["-c", OWN_STEP_PRECISION, str(REPO / model)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.rstrip().splitlines()[-1].startswith(said), result.stdout[-1000:]


def test_gpu_machine_prints_cudnn_cuda_and_nccl_built_installed_loaded_and_locked():
    result = report(gpus=1, wheels={"installed": dict(LOCKED), "lock": LOCK})
    assert codes(result) == []
    assert version_rows(result) == [
        ["CUDA", "versions", "cuDNN", "CUDA", "NCCL"],
        ["built", "against", "9", "12.5.1", "-", "TensorFlow's", "build", "info", "(it", "names", "no", "NCCL)"],
        ["installed", "9.3.0.75", "12.5.82", "2.27.7", "the", "nvidia-*", "wheels'", "metadata"],
        ["loaded", "9.3.0", "12.5", "2.27.7", "the", "libraries'", "own", "calls"],
        ["locked", "9.3.0.75", "12.5.82", "2.27.7", "/src/requirements-gpu.lock"],
    ]
    assert result["cuda_versions"]["loaded"] == LOADED and result["cuda_versions"]["built"]["nccl"] is None


def test_installed_cuda_wheels_other_than_the_lock_are_a_warning_naming_each():
    installed = LOCKED | {"nvidia-cudnn-cu12": "9.27.0.1", "nvidia-nccl-cu12": "2.32.3"}  # an unpinned install
    del installed["nvidia-cublas-cu12"]
    loaded = {"cudnn": "9.27.0", "cuda": "12.5", "nccl": "2.32.3"}
    result = report(gpus=1, wheels={"installed": installed, "lock": LOCK}, loaded=loaded)
    assert codes(result) == [("warning", "cuda_wheels_differ_from_lock"), ("warning", "loaded_cuda_differs_from_lock")]
    installed_finding, loaded_finding = result["diagnoses"]
    assert installed_finding["message"] == (
        "the CUDA wheels installed differ from requirements-gpu.lock: nvidia-cublas-cu12 missing installed, "
        "12.5.3.2 locked; nvidia-cudnn-cu12 9.27.0.1 installed, 9.3.0.75 locked; nvidia-nccl-cu12 2.32.3 installed, "
        "2.27.7 locked"
    )
    assert "make setup EXTRAS=dev,gpu" in installed_finding["fix"]
    assert "cuDNN 9.27.0 loaded, 9.3.0.75 locked" in loaded_finding["message"]
    assert "NCCL 2.32.3 loaded, 2.27.7 locked" in loaded_finding["message"]
    assert version_rows(result)[2][:4] == ["installed", "9.27.0.1", "12.5.82", "2.32.3"]


def test_a_system_cudnn_loaded_instead_of_the_locked_wheel_is_a_warning():
    result = report(gpus=1, wheels={"installed": dict(LOCKED), "lock": LOCK}, loaded=LOADED | {"cudnn": "9.1.0"})
    assert codes(result) == [("warning", "loaded_cuda_differs_from_lock")]
    assert "LD_LIBRARY_PATH" in result["diagnoses"][0]["fix"]


def test_without_a_gpu_no_library_is_asked_and_nothing_loaded_is_compared():
    result = report(libraries=NO_DRIVER, wheels={"installed": dict(LOCKED), "lock": LOCK}, GPUS="none")
    assert codes(result) == [("warning", "no_gpu_driver")]  # DoctorDevices refuses the call without GPUs
    assert result["cuda_versions"]["loaded"] is None
    assert version_rows(result)[3] == ["loaded", "-", "-", "-", "no", "GPU:", "none", "asked"]


def test_a_cpu_environment_has_no_cuda_wheels_to_compare_with_the_lock():
    result = report(libraries={"cuda": [], "cudnn": [], "driver": []}, wheels={"installed": {}, "lock": LOCK})
    assert codes(result) == []
    assert version_rows(result)[2][:4] == ["installed", "-", "-", "-"]
    no_lock = report(gpus=1, wheels={"installed": dict(LOCKED), "lock": {"file": None, "wheels": {}}})
    assert codes(no_lock) == []  # nothing to compare with
    assert version_rows(no_lock)[4] == ["locked", "-", "-", "-", "no", "requirements-gpu.lock", "found"]


@pytest.mark.parametrize(
    ("library", "code", "version"),
    [("cudnn", 90300, "9.3.0"), ("cudnn", 8907, "8.9.7"), ("cuda", 12050, "12.5"), ("nccl", 22707, "2.27.7")],
)
def test_the_libraries_version_codes_read_as_their_releases(library, code, version):
    assert decode_version(library, code) == version
