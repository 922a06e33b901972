"""Phases (train.phases, train.phased): FREEZE, UNFREEZE_AT_EPOCH, UNFREEZE_LEARNING_RATE and MODEL's phases().

The model (tests/harness/phases_model.py) is `backbone_dense`, `backbone_norm` (a BatchNormalization) and `head`,
on 32 features and 10 classes. The reference run freezes backbone_* for epochs 1-2 and trains everything from
epoch 3 (step 20 at 10 steps an epoch), saving every step, so every step's weights can be read back.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, kill_mid_run, read_summary, run_python, run_train, start_train, wait_for
from train import Phase
from train.phases import Layer, recipe, resolve

MODEL = REPO / "tests" / "harness" / "phases_model.py"
RECIPE = {"MODEL": MODEL, "FREEZE": "backbone_*", "UNFREEZE_AT_EPOCH": 3}
SMALL = {"EPOCHS": 4, "STEPS_PER_EPOCH": 10, "BATCH_SIZE": 8, "TRAIN_SPLIT": "train[:160]", "EVAL_SPLIT": "test[:16]",
         "STEPS_PER_CALL": 1, "CHECKPOINT_EVERY": 1, "KEEP_CHECKPOINTS": 100, "LOG_EVERY": 100}  # fmt: skip
BOUNDARY, TOTAL = 20, 40

# A checkpoint's variables by key, as lists (JSON keeps a float32 exactly through its float64 repr).
READ = """
import json, sys
import tensorflow as tf
reader = tf.train.load_checkpoint(sys.argv[1])
print(json.dumps({key: reader.get_tensor(key).tolist() for key in reader.get_variable_to_shape_map()
                  if key.endswith("VARIABLE_VALUE")}))
"""
BACKBONE = [f"optimizer/_trainable_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(4)]  # kernel, bias, BN's
HEAD = [f"optimizer/_trainable_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in (4, 5)]


def read_checkpoint(run: Path, step: int) -> dict[str, np.ndarray]:
    result = run_python(["-c", READ, str(run / "checkpoints" / f"ckpt-{step}")])
    assert result.returncode == 0, result.stderr[-2000:]
    return {key: np.asarray(value) for key, value in json.loads(result.stdout.strip().splitlines()[-1]).items()}


def moving_statistics(variables: dict[str, np.ndarray]) -> list[np.ndarray]:
    keys = sorted(key for key in variables if "moving_" in key)
    assert len(keys) == 2, keys
    return [variables[key] for key in keys]


def fit(tmp_path: Path, output: str, **settings: object):
    return run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / output, **{**SMALL, **RECIPE, **settings})


def sha(run: Path) -> str:
    return read_summary(run)["weights_sha256"]


# --- no TensorFlow ---------------------------------------------------------------------------------------------


def test_phase_is_importable_without_tensorflow_and_refuses_what_it_cannot_hold():
    result = run_python(["-c", "import sys; from train import Phase; Phase(2, 'head'); print('tensorflow' in "
                         "sys.modules)"], fresh=True)  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]
    assert Phase(2, "head*").trainable == ("head*",) and Phase(1, ["a", "b/*"]).trainable == ("a", "b/*")
    assert Phase(3, "all").trainable is None and Phase(3).learning_rate is None
    assert Phase(1, None, 1).learning_rate == 1.0
    for bad in ({"epochs": 0}, {"epochs": 1.5}, {"epochs": 1, "trainable": []}, {"epochs": 1, "trainable": 3},
                {"epochs": 1, "learning_rate": 0}, {"epochs": 1, "learning_rate": True}):  # fmt: skip
        with pytest.raises(ValueError):
            Phase(**bad)


def test_the_recipe_is_two_phases_resolved_on_layer_paths_nested_ones_included():
    layers = [Layer("block", ("block/conv", "block/norm"), False, True), Layer("block/conv", (), True, True),
              Layer("block/norm", (), True, True), Layer("head", (), True, True),
              Layer("kept", (), True, False)]  # fmt: skip
    frozen, specs = recipe(("bl*",), 3, None, 0.01)
    plan, problem = resolve(layers, specs, frozen, "FREEZE=bl*", 0.01)
    assert problem is None
    assert [p.first_epoch for p in plan.phases] == [1, 3]
    assert plan.trainable_paths(0) == ["head"]  # the block and what it nests frozen; "kept", frozen by build_model
    assert plan.trainable_paths(1) == ["block/conv", "block/norm", "head"]
    assert plan.phases[1].learning_rate == pytest.approx(0.001) and plan.phases[1].factor(0.01) == pytest.approx(0.1)
    assert [plan.index_at_epoch(e) for e in (1, 2, 3, 9)] == [0, 0, 1, 1]
    # phases(): a nested layer trains, its container stays open, the rest is frozen
    plan, problem = resolve(layers, [Phase(1, "block/norm"), Phase(1)], None, "phases()", 0.01)
    assert problem is None and plan.trainable_paths(0) == ["block/norm"] and "block" in plan.phases[0].trainable
    _, problem = resolve(layers, specs, ("trunk*",), "FREEZE=trunk*", 0.01)
    assert problem.startswith("'trunk*' match(es) no layer; the layers are: block, block/conv, block/norm, head")
    # every layer holding weights frozen: the phase's step would update nothing
    _, problem = resolve(layers, specs, ("block", "head"), "FREEZE=block,head", 0.01)
    assert problem.startswith("phase 0 (from epoch 1) would train no layer: every layer holding weights is frozen")
    _, problem = resolve(layers, [Phase(1), Phase(1, "kept")], None, "phases()", 0.01)
    assert problem is not None and problem.startswith("phase 1 (from epoch 2) would train no layer")


def test_phases_keyword_only_parameters_are_hp_settings_one_setting_where_build_model_declares_it_too():
    import ast

    from train.errors import SettingsError
    from train.hparams import declared, taken_by

    source = "def build_model(a, b, c, *, width=8, rate=0.1): ...\ndef phases(context, *, head_epochs=2, rate=0.1): ..."
    found = declared(ast.parse(source), "m.py")
    assert {env: each.default for env, each in found.items()} == {"HP_WIDTH": 8, "HP_RATE": 0.1, "HP_HEAD_EPOCHS": 2}

    def phases(context, *, head_epochs=2, rate=0.1): ...

    assert taken_by(phases, [("width", 8), ("rate", 0.1), ("head_epochs", 3)]) == {"rate": 0.1, "head_epochs": 3}
    with pytest.raises(SettingsError, match="build_model and phases both take rate, with other defaults"):
        declared(ast.parse(source.replace("rate=0.1): ...\ndef", "rate=0.2): ...\ndef")), "m.py")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"UNFREEZE_AT_EPOCH": 3}, "UNFREEZE_AT_EPOCH=3 is set but FREEZE is empty"),
        ({"FREEZE": "a", "UNFREEZE_LEARNING_RATE": 0.01}, "UNFREEZE_LEARNING_RATE=0.01 is set but UNFREEZE_AT_EPOCH"),
        ({"FREEZE": "a", "UNFREEZE_AT_EPOCH": 1}, "UNFREEZE_AT_EPOCH=1 is not allowed"),
        ({"FREEZE": "a,,b"}, "FREEZE='a,,b' is not allowed"),
    ],
)
def test_phase_settings_that_would_be_ignored_are_refused_before_tensorflow(tmp_path, settings, message):
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", MODEL=MODEL, **settings)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


# --- end to end ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tfds_data_dir) -> tuple[Path, str]:
    """The recipe in one go: FREEZE=backbone_*, UNFREEZE_AT_EPOCH=3, 4 epochs of 10 steps, every step saved."""
    tmp_path = tmp_path_factory.mktemp("phases")
    result = fit(tmp_path, "run", TFDS_DATA_DIR=tfds_data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp_path / "run", result.stdout


@pytest.mark.slow
def test_frozen_layers_and_their_statistics_stay_until_the_boundary_then_train(reference):
    run, stdout = reference
    first, boundary, last = (read_checkpoint(run, step) for step in (0, BOUNDARY, TOTAL))
    for key in BACKBONE:  # the kernel, bias and BatchNormalization's gamma and beta: not a bit moved
        assert np.array_equal(first[key], boundary[key]), key
    for start, end in zip(moving_statistics(first), moving_statistics(boundary), strict=True):  # inference mode
        assert np.array_equal(start, end)
    assert all(not np.array_equal(first[key], boundary[key]) for key in HEAD)  # the head trained
    assert all(not np.array_equal(first[key], last[key]) for key in BACKBONE[:1])  # from epoch 3, the backbone too
    assert all(not np.array_equal(a, b) for a, b in zip(moving_statistics(first), moving_statistics(last), strict=True))
    assert "Step 0: phase 0 (of 2, from epoch 1): 2 layer(s) frozen (backbone_dense, backbone_norm)" in stdout
    assert f"Step {BOUNDARY}: phase 1 (of 2, from epoch 3): every layer trains, learning rate 0.0001" in stdout


@pytest.mark.slow
def test_the_optimizer_gets_fresh_slots_at_the_boundary_its_step_goes_on(reference):
    """Adam's moments of the head one step into phase 1 are that step's alone, m = 0.1 g and v = 0.001 g²
    (m² = 10 v): zeroed at the boundary, as recompiling would; one step before it they are not."""
    run, _ = reference
    after, before = read_checkpoint(run, BOUNDARY + 1), read_checkpoint(run, BOUNDARY - 1)
    m, v = (after[f"optimizer/_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in (10, 11))  # the head's kernel
    assert np.allclose(m**2, 10 * v, rtol=1e-3, atol=1e-12)
    m, v = (before[f"optimizer/_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE"] for i in (10, 11))
    assert not np.allclose(m**2, 10 * v, rtol=1e-3, atol=1e-12)
    assert after["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"] == BOUNDARY + 1  # the step counter went on
    assert after["optimizer/_learning_rate/.ATTRIBUTES/VARIABLE_VALUE"] == np.float32(0.0001)
    assert before["phase/.ATTRIBUTES/VARIABLE_VALUE"] == 0 and after["phase/.ATTRIBUTES/VARIABLE_VALUE"] == 1


@pytest.mark.slow
def test_the_records_name_each_phase_and_the_run_directory_keeps_its_phases(reference, tmp_path, tfds_data_dir):
    run, _ = reference
    epochs = json.loads((run / "epochs.json").read_text())
    assert [(entry["epoch"], entry["phase"]) for entry in epochs] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    expected = [
        {"first_epoch": 1, "first_step": 0, "trainable": ["head"], "learning_rate": None},
        {"first_epoch": 3, "first_step": BOUNDARY, "trainable": ["backbone_dense", "backbone_norm", "head"],
         "learning_rate": 0.0001},
    ]  # fmt: skip
    assert json.loads((run / "run.json").read_text())["phases"] == expected
    assert read_summary(run)["phases"] == expected
    for command in ("evaluate", "predict"):  # they restore the checkpoint that records the phase
        args = [command, "--output-dir", str(run)] + (["--split", "test[:4]"] if command == "predict" else [])
        result = run_train(*args, cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, MODEL=MODEL)
        assert result.returncode == 0, (command, result.stderr[-2000:])
    for other in ({"FREEZE": "head"}, {"UNFREEZE_AT_EPOCH": 2}, {"UNFREEZE_LEARNING_RATE": 0.01}):
        result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=run, TFDS_DATA_DIR=tfds_data_dir, MODEL=MODEL, **other)
        name = next(iter(other))
        assert result.returncode == 2 and f"{name}={other[name]}, the run's" in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_a_glob_that_matches_no_layer_is_refused_naming_the_layers_before_anything_is_written(tmp_path, tfds_data_dir):
    result = fit(tmp_path, "run", TFDS_DATA_DIR=tfds_data_dir, FREEZE="trunk_*", UNFREEZE_AT_EPOCH=None)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "FREEZE=trunk_*: 'trunk_*' match(es) no layer; the layers are: backbone_dense, backbone_norm, head" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()  # nothing written


@pytest.mark.slow
def test_resumed_at_across_and_after_the_boundary_it_ends_where_the_run_in_one_go_does(
    reference, tmp_path, tfds_data_dir
):
    run, _ = reference
    # Exactly at the boundary: a run of 2 epochs ends with the checkpoint of the boundary's step, then goes on.
    assert fit(tmp_path, "at", TFDS_DATA_DIR=tfds_data_dir, EPOCHS=2).returncode == 0
    resumed = fit(tmp_path, "at", TFDS_DATA_DIR=tfds_data_dir)
    assert resumed.returncode == 0 and f"Resuming from {tmp_path / 'at' / 'checkpoints'}/ckpt-{BOUNDARY}" in (
        resumed.stdout
    ), resumed.stderr[-2000:]
    assert sha(tmp_path / "at") == sha(run)
    # SIGKILL one step past the boundary, and SIGTERM (which saves where it stops) anywhere after the start.
    env = {**SMALL, **RECIPE, "TFDS_DATA_DIR": tfds_data_dir}
    killed = start_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "killed", **env)
    kill_mid_run(killed, tmp_path / "killed", pattern=f"checkpoints/ckpt-{BOUNDARY + 1}.index")
    stopped = start_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "stopped", **env)
    wait_for(lambda: any((tmp_path / "stopped").glob("checkpoints/ckpt-1[0-9].index")), stopped, "a checkpoint")
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=60) == 42  # saved where it stopped (EXIT_PREEMPTED)
    for name in ("killed", "stopped"):
        result = fit(tmp_path, name, TFDS_DATA_DIR=tfds_data_dir)
        assert result.returncode == 0 and "Resuming from" in result.stdout, result.stderr[-2000:]
        assert sha(tmp_path / name) == sha(run), name


@pytest.mark.slow
def test_phases_from_the_model_file_take_hp_settings_and_exclude_freeze(tmp_path, tfds_data_dir):
    model = tmp_path / "phased_model.py"
    model.write_text(
        f"import sys\nsys.path.insert(0, {str(MODEL.parent)!r})\n"
        "import phases_model\nfrom train import Phase\n\n\n"
        "def build_model(input_shape, num_classes, learning_rate, *, late_rate=0.0005):\n"
        "    return phases_model.build_model(input_shape, num_classes, learning_rate)\n\n\n"
        "def phases(context, *, head_epochs=1, late_rate=0.0005):  # late_rate: one setting for both\n"
        "    return [Phase(head_epochs, trainable='head'), Phase(1, 'all', late_rate)]\n"
    )
    settings = {**SMALL, "MODEL": model, "TFDS_DATA_DIR": tfds_data_dir, "EPOCHS": 3, "HP_HEAD_EPOCHS": 2}
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    phases = read_summary(tmp_path / "run")["phases"]
    assert [(p["first_epoch"], p["first_step"], p["trainable"], p["learning_rate"]) for p in phases] == [
        (1, 0, ["head"], None), (3, BOUNDARY, ["backbone_dense", "backbone_norm", "head"], 0.0005)
    ]  # fmt: skip
    epochs = json.loads((tmp_path / "run" / "epochs.json").read_text())
    assert [entry["phase"] for entry in epochs] == [0, 0, 1]
    # another phases() result on the run (HP_HEAD_EPOCHS=1) is refused; so is FREEZE beside phases()
    again = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", **{**settings, "HP_HEAD_EPOCHS": 1})
    assert again.returncode == 2 and "the phases (phases() of MODEL=" in again.stderr, again.stderr[-2000:]
    both = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "both", **{**settings, "FREEZE": "head"})
    assert both.returncode == 2 and "defines phases(): each says" in both.stderr, both.stderr[-2000:]
    assert not (tmp_path / "both").exists()  # nothing written


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_learning_rate_phases_can_neither_set_nor_scale_is_refused_in_one_line():
    """A plain callable as the optimizer's rate (Keras takes it): refused when the run has phases, as a
    SettingsError naming the optimizer, not a crash; a run without phases never asks."""
    import keras

    from train.errors import SettingsError
    from train.phased import Phased, layer_tree

    network = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="backbone_dense"),
                                keras.layers.Dense(3, name="head")])  # fmt: skip
    network.compile(optimizer=keras.optimizers.SGD(learning_rate=lambda: 0.01), loss="mse")
    network.optimizer.build(network.trainable_variables)
    built = type("Built", (), {"network": network, "optimizer": network.optimizer})()
    one, _ = resolve(layer_tree(network), [Phase(1)], None, "", 0.01)
    Phased(one, built).rates_as_built()  # no phases: the rate is left alone
    frozen, specs = recipe(("backbone_*",), 2, None, 0.01)
    plan, problem = resolve(layer_tree(network), specs, frozen, "FREEZE=backbone_*", 0.01)
    assert problem is None
    with pytest.raises(SettingsError, match="has a plain callable as its learning_rate"):
        Phased(plan, built)


def test_entering_a_phase_sets_trainable_scales_a_schedule_and_zeroes_the_slots():
    """train.phased on a built model (and the two keras_seams it reads: learning_rate_schedule, slots)."""
    import keras
    import tensorflow as tf

    sys.path.insert(0, str(MODEL.parent))
    import phases_model

    from train.keras_seams import learning_rate_schedule, slots
    from train.phased import Phased, ScaledSchedule, layer_tree

    for schedule in (True, False):
        network = phases_model.build_model((4,), 3, 0.01, schedule=schedule)
        network.optimizer.build(network.trainable_variables)  # on every variable, once, as train.model.build does
        frozen, specs = recipe(("backbone_*",), 2, 0.002, 0.01)
        plan, problem = resolve(layer_tree(network), specs, frozen, "FREEZE=backbone_*", 0.01)
        assert problem is None
        phased = Phased(plan, type("Built", (), {"network": network, "optimizer": network.optimizer})())
        optimizer = network.optimizer
        assert (learning_rate_schedule(optimizer) is not None) == schedule
        phased.enter(0, fresh=True)
        assert [v.path.split("/", 1)[1] for v in network.trainable_variables] == ["head/kernel", "head/bias"]
        assert not network.get_layer("backbone_norm").trainable  # BatchNormalization in inference mode
        x, y = tf.random.normal((8, 4)), tf.zeros((8,), tf.int32)
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = network.compute_loss(x, y, network(x, training=True))
            optimizer.apply(tape.gradient(loss, network.trainable_variables), network.trainable_variables)
        moved = [slot for slot in slots(optimizer) if np.any(slot.numpy())]
        assert moved and len(slots(optimizer)) == 12  # m and v of each of the 6 weights, frozen ones included
        phased.enter(1, fresh=True)
        assert all(not np.any(slot.numpy()) for slot in slots(optimizer)) and int(optimizer.iterations) == 3
        assert len(network.trainable_variables) == 6
        if schedule:  # scaled by UNFREEZE_LEARNING_RATE / LEARNING_RATE, from the optimizer's step
            assert isinstance(learning_rate_schedule(optimizer), ScaledSchedule)
            base = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5)
            assert float(optimizer.learning_rate) == pytest.approx(float(base(3)) * 0.2, rel=1e-6)
            phased.rates_as_built()  # what the export holds: the schedule build_model made
            assert type(learning_rate_schedule(optimizer)) is keras.optimizers.schedules.ExponentialDecay
        else:  # a constant: set to the phase's
            assert float(optimizer.learning_rate) == pytest.approx(0.002)


SHORT = {**SMALL, "EPOCHS": 2, "STEPS_PER_EPOCH": 4, "STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 4}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("first", "then"),
    [
        ({"CPU_DEVICES": 2, "GLOBAL_BATCH_SIZE": 8, "BATCH_SIZE": None}, {"CPU_DEVICES": 1}),  # 2 replicas, then 1
        ({"GLOBAL_BATCH_SIZE": 8, "BATCH_SIZE": 4}, {"BATCH_SIZE": 8}),  # 2 micro-batches a step, then 1
        ({"MODEL": REPO / "examples" / "custom_step.py", "FREEZE": "dense"}, {}),  # the model's own train_step
    ],
    ids=["2 replicas, resumed on 1", "accumulated, resumed whole", "own train_step"],
)
def test_replicas_accumulation_and_an_own_train_step_freeze_then_train(tmp_path, tfds_data_dir, first, then):
    """Ends at the boundary (EPOCHS=2, UNFREEZE_AT_EPOCH=3) with the frozen layer as it began, then resumed (on
    another replica count, or accumulating otherwise: elastic) to 4 epochs, where it has trained."""
    settings = {**SHORT, "TFDS_DATA_DIR": tfds_data_dir, **first}
    result = fit(tmp_path, "run", **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    frozen = BACKBONE[0]  # the first layer's kernel: backbone_dense's, or the custom step model's first Dense
    begun, boundary = read_checkpoint(tmp_path / "run", 0), read_checkpoint(tmp_path / "run", 8)
    assert np.array_equal(begun[frozen], boundary[frozen])
    assert not np.array_equal(begun[HEAD[0]], boundary[HEAD[0]]) if "MODEL" not in first else True
    result = fit(tmp_path, "run", **{**settings, **then, "EPOCHS": 4})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Step 8: phase 1 (of 2, from epoch 3): every layer trains" in result.stdout
    assert not np.array_equal(begun[frozen], read_checkpoint(tmp_path / "run", 16)[frozen])
    assert [entry["phase"] for entry in json.loads((tmp_path / "run" / "epochs.json").read_text())] == [0, 0, 1, 1]


@pytest.mark.slow
def test_two_workers_cross_a_phase_boundary_to_the_same_weights(tmp_path, tfds_data_dir):
    from tests.test_multi_worker import SHA, run_workers

    common = {**SMALL, **RECIPE, "EPOCHS": 2, "STEPS_PER_EPOCH": 3, "UNFREEZE_AT_EPOCH": 2, "STEPS_PER_CALL": 4,
              "CHECKPOINT_EVERY": 3, "SYNC_BATCH_NORM": "false"}  # fmt: skip
    outcomes = run_workers(tmp_path, [{}, {}], tfds_data_dir, **common)
    assert [code for code, _ in outcomes] == [0, 0], outcomes[0][1][-3000:] + outcomes[1][1][-3000:]
    hashes = [SHA.findall(log) for _, log in outcomes]
    assert hashes[0] and hashes[0] == hashes[1]
    assert all("Step 3: phase 1 (of 2, from epoch 2): every layer trains" in log for _, log in outcomes)
    run = tmp_path / "run"
    assert [(p["first_step"], p["trainable"]) for p in read_summary(run)["phases"]] == [
        (0, ["head"]), (3, ["backbone_dense", "backbone_norm", "head"])
    ]  # fmt: skip
    begun, boundary, last = (read_checkpoint(run, step) for step in (0, 3, 6))
    assert np.array_equal(begun[BACKBONE[0]], boundary[BACKBONE[0]])
    assert not np.array_equal(begun[BACKBONE[0]], last[BACKBONE[0]])
