"""What workers must agree on, and the one answer each auto resolves to (train.agreement: pure logic,
every worker computes it alike from every worker's report). The real workers are in test_multi_worker.py."""

from __future__ import annotations

import pytest

from train.agreement import reconcile, report
from train.errors import SettingsError

FACTS = {"local replicas": 1, "examples": "16384 train, 2048 eval", "feature": "features [32] float32"}


def worker(fits: bool = True, precision: str = "float32", recorded: dict | None = None, **settings: str) -> dict:
    text = {"BATCH_SIZE": "128", "SEED": "42", "DATA_IN_MEMORY": "auto", "MIXED_PRECISION": "auto",
            "JIT_COMPILE": "auto", **settings}  # fmt: skip
    return report(text, "a" * 64, dict(FACTS), fits, precision, recorded)


def test_one_host_is_a_cluster_of_one():
    decision = reconcile([worker()])
    assert (decision.data_in_memory, decision.precision, decision.jit_compile) == (True, "float32", "auto")
    assert reconcile([worker(fits=False)]).data_in_memory is False


def test_an_explicit_value_on_one_worker_settles_the_others_auto():
    assert reconcile([worker(), worker(DATA_IN_MEMORY="false")]).data_in_memory is False
    assert reconcile([worker(DATA_IN_MEMORY="true"), worker(fits=False)]).data_in_memory is True
    assert reconcile([worker(JIT_COMPILE="false"), worker()]).jit_compile == "false"


def test_autos_settle_on_the_most_conservative_answer_of_any_worker():
    decision = reconcile([worker(), worker(fits=False)])
    assert decision.data_in_memory is False  # streamed everywhere: worker 1 cannot hold the splits
    assert decision.notes == ("DATA_IN_MEMORY=auto: streaming on every worker: the splits do not fit on worker 1.",)
    decision = reconcile([worker(precision="mixed_bfloat16"), worker(precision="mixed_float16")])
    assert decision.precision == "mixed_float16"  # A100 and V100: float16 runs on both
    assert reconcile([worker(precision="mixed_bfloat16"), worker(precision="float32")]).precision == "float32"


def test_a_resume_keeps_what_the_runs_first_start_decided():
    recorded = {"data_in_memory": False, "precision": "mixed_float16"}
    decision = reconcile([worker(precision="mixed_bfloat16", recorded=recorded)])
    assert (decision.data_in_memory, decision.precision) == (False, "mixed_float16")
    # held in memory at first, and it no longer fits: streamed (the conservative answer), not an error
    assert reconcile([worker(fits=False, recorded={"data_in_memory": True})]).data_in_memory is False


@pytest.mark.parametrize(
    ("chief", "other", "named"),
    [
        ({}, {"BATCH_SIZE": "64"}, "BATCH_SIZE='64' on worker 1 but '128' on the chief"),
        ({"DATA_IN_MEMORY": "true"}, {"DATA_IN_MEMORY": "false"}, "DATA_IN_MEMORY='false' on worker 1 but 'true'"),
        ({"MIXED_PRECISION": "off"}, {"MIXED_PRECISION": "mixed_float16"}, "MIXED_PRECISION='mixed_float16' on "),
    ],
)
def test_explicit_values_that_differ_are_refused_naming_them(chief, other, named):
    with pytest.raises(SettingsError, match=r"^worker 1 does not match the chief: ") as raised:
        reconcile([worker(**chief), worker(**other)])
    assert named in str(raised.value)


def test_facts_that_cannot_be_made_equal_are_refused():
    other = worker()
    other["facts"]["local replicas"] = 2
    other["model_sha256"] = "b" * 64
    with pytest.raises(SettingsError) as raised:
        reconcile([worker(), worker(), other])
    message = str(raised.value)
    assert message.startswith("worker 2 does not match the chief: ")
    assert "MODEL's code on worker 2 differs from the chief's (bbbbbbbbbbbb against aaaaaaaaaaaa)" in message
    assert "local replicas 2 on worker 2 but 1 on the chief" in message
