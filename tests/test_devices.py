"""Device configuration through the GPU seam, with fake GPUs: no test machine has one.

`FakeDevices` stands in for `train.devices.backend.TensorFlowDevices`, the only object that makes
tf.config calls; it records what `configure_devices` applied.
"""

from __future__ import annotations

import pytest

from train.devices.runtime import choose_precision, choose_strategy, configure_devices, resolve
from train.errors import SettingsError
from train.settings import load_settings


class FakeDevices:
    def __init__(self, gpu_count: int, initialised: bool = False, compute_capability=(8, 0)) -> None:
        self.gpus = [f"GPU:{i}" for i in range(gpu_count)]
        self.compute_capability = compute_capability
        self.initialised = initialised
        self.visible: list[str] | None = None
        self.growth: dict[str, bool] = {}
        self.limits: dict[str, int] = {}
        self.cpu_split: int | None = None

    def physical_gpus(self):
        return list(self.gpus)

    def gpu_details(self, gpu):
        return {"compute_capability": self.compute_capability}

    def set_visible_gpus(self, gpus):
        if self.initialised:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = list(gpus)

    def set_memory_growth(self, gpu, enabled):
        self.growth[gpu] = enabled

    def set_memory_limit(self, gpu, megabytes):
        self.limits[gpu] = megabytes

    def split_cpu(self, count):
        self.cpu_split = count


def settings(**environ):
    return load_settings({}, environ, "/nonexistent/.env")


def test_all_gpus_visible_with_memory_growth_on_each():
    fake = FakeDevices(2)
    plan = configure_devices(settings(), fake)
    assert fake.visible == ["GPU:0", "GPU:1"]
    assert fake.growth == {"GPU:0": True, "GPU:1": True}
    assert fake.limits == {}
    assert plan.training_devices == ("/gpu:0", "/gpu:1")


def test_chosen_indices_only_and_growth_off_when_asked():
    fake = FakeDevices(4)
    plan = configure_devices(settings(GPUS="3,1", MEMORY_GROWTH="false"), fake)
    assert fake.visible == ["GPU:3", "GPU:1"]
    assert fake.growth == {"GPU:3": False, "GPU:1": False}
    assert plan.visible_gpus == (3, 1)
    assert plan.training_devices == ("/gpu:0", "/gpu:1")  # TensorFlow renumbers the visible ones


def test_memory_cap_instead_of_growth():
    fake = FakeDevices(2)
    plan = configure_devices(settings(GPUS="1", MEMORY_GROWTH="false", GPU_MEMORY_LIMIT_MB="2048"), fake)
    assert fake.visible == ["GPU:1"]
    assert fake.limits == {"GPU:1": 2048}
    assert fake.growth == {}
    assert plan.memory_limit_mb == 2048


def test_gpus_none_hides_every_gpu():
    fake = FakeDevices(2)
    plan = configure_devices(settings(GPUS="none"), fake)
    assert fake.visible == []
    assert fake.growth == {}
    assert plan.training_devices == ("/cpu:0",)


def test_missing_gpu_index_is_an_error_not_a_cpu_run():
    fake = FakeDevices(2)
    with pytest.raises(
        SettingsError, match=r"^GPUS=0,7 asks for GPU 7, but TensorFlow sees 2 GPU\(s\) \(indices 0-1\)"
    ):
        configure_devices(settings(GPUS="0,7"), fake)
    assert fake.visible is None  # nothing applied


def test_any_index_without_gpus_is_an_error():
    with pytest.raises(SettingsError, match=r"asks for GPU 0, but TensorFlow sees 0 GPU\(s\) \(none\)"):
        configure_devices(settings(GPUS="0"), FakeDevices(0))


def test_all_without_gpus_trains_on_cpu_and_says_so(monkeypatch):
    monkeypatch.setattr("train.devices.runtime.cpu_cores", lambda: 2)  # fakes the machine's core count
    fake = FakeDevices(0)
    plan = configure_devices(settings(CPU_DEVICES="2"), fake)
    assert plan.notes == ("No GPU found: training on CPU.",)
    assert fake.cpu_split == 2
    assert plan.training_devices == ("/cpu:0", "/cpu:1")


def test_more_cpu_devices_than_cores_is_said(monkeypatch):
    monkeypatch.setattr("train.devices.runtime.cpu_cores", lambda: 2)  # fakes the machine's core count
    plan = configure_devices(settings(CPU_DEVICES="8"), FakeDevices(0))
    assert plan.notes[-1] == (
        "CPU_DEVICES=8 on 2 CPU core(s): the replicas share the cores, which tests the multi-replica path "
        "but does not speed it up."
    )


def test_devices_already_initialised_is_a_clear_error():
    with pytest.raises(SettingsError, match="configure them before TensorFlow runs anything"):
        configure_devices(settings(), FakeDevices(1, initialised=True))


@pytest.mark.parametrize(
    ("requested", "devices", "expected", "said"),
    [
        ("auto", 1, "one_device", False),
        ("auto", 2, "mirrored", False),
        ("auto", 8, "mirrored", False),
        ("mirrored", 1, "mirrored", True),
        ("one_device", 2, "one_device", True),
        ("one_device", 1, "one_device", False),
    ],
)
def test_strategy_choice(requested, devices, expected, said):
    name, notes = choose_strategy(requested, devices)
    assert name == expected
    assert bool(notes) == said


@pytest.mark.parametrize(
    ("gpus", "capability", "requested", "policy"),
    [
        (2, (8, 0), "auto", "mixed_bfloat16"),  # A100, L4, H100: bfloat16, no loss scaling
        (1, (9, 0), "auto", "mixed_bfloat16"),
        (2, (7, 0), "auto", "mixed_float16"),  # V100: float16 tensor cores
        (1, (7, 5), "auto", "mixed_float16"),  # T4
        (1, (6, 1), "auto", "float32"),  # no tensor cores: float16 would be slower
        (1, None, "auto", "float32"),  # capability unknown
        (0, None, "auto", "float32"),  # CPU: bfloat16 measured slower there
        (0, None, "mixed_bfloat16", "mixed_bfloat16"),
        (2, (8, 0), "off", "float32"),
    ],
)
def test_mixed_precision_policy(gpus, capability, requested, policy):
    plan = configure_devices(settings(MIXED_PRECISION=requested), FakeDevices(gpus, compute_capability=capability))
    assert choose_precision(requested, plan)[0] == policy
    assert resolve(settings(MIXED_PRECISION=requested), plan).precision == policy


def test_mixed_float16_on_cpu_runs_and_says_it_is_not_faster_there():
    plan = configure_devices(settings(), FakeDevices(0))
    policy, notes = choose_precision("mixed_float16", plan)
    assert policy == "mixed_float16" and "no faster float16 math" in notes[0]


@pytest.mark.parametrize(
    ("gpus", "cpu_devices", "requested", "expected"),
    [
        (0, 2, "auto", "reduce_to_one"),  # measured faster than TensorFlow's default on CPU devices
        (2, 1, "auto", None),  # TensorFlow's own choice on GPUs: NCCL where it is available
        (2, 1, "hierarchical_copy", "hierarchical_copy"),
        (2, 1, "nccl", "nccl"),
        (0, 2, "hierarchical_copy", "hierarchical_copy"),
    ],
)
def test_cross_device_ops_for_mirrored(gpus, cpu_devices, requested, expected):
    chosen = settings(CROSS_DEVICE_OPS=requested, CPU_DEVICES=str(cpu_devices))
    resolution = resolve(chosen, configure_devices(chosen, FakeDevices(gpus)))
    assert resolution.strategy_name == "mirrored"
    assert resolution.cross_device_ops == expected


def test_nccl_on_cpu_devices_is_an_error_and_without_mirroring_it_is_said():
    chosen = settings(CROSS_DEVICE_OPS="nccl", CPU_DEVICES="2")
    with pytest.raises(SettingsError, match=r"^CROSS_DEVICE_OPS=nccl needs GPUs"):
        resolve(chosen, configure_devices(chosen, FakeDevices(0)))
    single = settings(CROSS_DEVICE_OPS="hierarchical_copy")
    resolution = resolve(single, configure_devices(single, FakeDevices(1)))
    assert resolution.cross_device_ops is None
    assert any("CROSS_DEVICE_OPS=hierarchical_copy has no effect" in note for note in resolution.notes)


def xla_resolution(gpus: int, **environ):
    from train.devices.runtime import resolve

    chosen = settings(**environ)
    return resolve(chosen, configure_devices(chosen, FakeDevices(gpus)))


@pytest.mark.parametrize(
    ("gpus", "environ", "whole_call", "convolutional", "expected"),
    [
        (0, {}, True, False, (True, "auto: on for one CPU device, the whole call compiled")),
        (0, {}, True, True, (False, "auto: off for a convolutional model on CPU, where XLA's convolutions are slower")),
        (0, {}, False, False, (False, "auto: off on CPU where tf.data feeds the step")),
        (1, {}, False, True, (True, "auto: on for one GPU, Keras's own default")),
        (2, {}, False, False, (False, "auto: off under a strategy of several GPUs, as Keras has it")),
        (
            2,
            {"JIT_COMPILE": "true"},
            False,
            False,
            (True, "JIT_COMPILE=true, the replica step (tf.data stays outside)"),
        ),
        (0, {"JIT_COMPILE": "false"}, True, False, (False, "JIT_COMPILE=false")),
    ],
)
def test_xla_auto_is_never_the_slow_choice_measured_and_true_compiles_where_tensorflow_can(
    gpus, environ, whole_call, convolutional, expected
):
    from train.devices.runtime import choose_xla

    resolution = xla_resolution(gpus, **environ)
    assert choose_xla(environ.get("JIT_COMPILE", "auto"), resolution, whole_call, convolutional, None) == expected


def test_xla_forced_on_where_it_cannot_compile_names_why():
    from train.devices.runtime import choose_xla

    with pytest.raises(SettingsError, match=r"layer random_translation \(RandomTranslation\) says XLA cannot"):
        choose_xla("true", xla_resolution(0), True, True, "random_translation (RandomTranslation)")
    assert choose_xla("auto", xla_resolution(0), True, True, "random_translation (RandomTranslation)")[0] is False
    with pytest.raises(SettingsError, match=r"^JIT_COMPILE=true is not allowed with MIXED_PRECISION=mixed_float16"):
        choose_xla("true", xla_resolution(2, MIXED_PRECISION="mixed_float16"), False, False, None)
    with pytest.raises(SettingsError, match=r"^JIT_COMPILE=true is not allowed with MirroredStrategy on CPU"):
        choose_xla("true", xla_resolution(0, CPU_DEVICES="2"), True, False, None)
