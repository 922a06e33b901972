"""What every worker must agree on before training, and the one answer each `auto` resolves to.

Each worker reports its settings (the ones marked "workers agree" in train.settings), its model's hash,
the facts it found (local replicas, the dataset's counts and shapes) and what its `auto`s would resolve
to on its own (does the data fit here, which precision its GPUs want). `reconcile` turns the reports of all
workers into one decision that every worker computes alike, or one error naming what differs. One host is
a cluster of one: the same function decides for it. Pure logic, no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

from train.data.adapt import difference
from train.errors import SettingsError

# Settings whose `auto` each worker may resolve differently on its own: resolved here to one answer.
AUTO_RESOLVED = ("DATA_IN_MEMORY", "MIXED_PRECISION", "JIT_COMPILE")
# From the most conservative (works everywhere) to the least: where workers resolve auto differently, the
# cluster takes the first any of them resolved to.
PRECISION_ORDER = ("float32", "mixed_float16", "mixed_bfloat16")
Json = dict[str, object]  # a JSON document's object: a report, a fact sheet, run.json


@dataclass(frozen=True)
class Decision:
    """The cluster's answers: data in memory or streamed, the dtype policy, and JIT_COMPILE ("true", "false",
    or "auto": the chief decides once its model is built). `notes` say where an auto was settled for all."""

    data_in_memory: bool
    precision: str
    jit_compile: str
    notes: tuple[str, ...] = ()


def _where(index: int) -> str:
    return "the chief" if index == 0 else f"worker {index}"


def report(
    settings_text: dict[str, str],
    model_sha256: str,
    facts: Json,
    fits_in_memory: bool,
    precision: str,
    recorded: Json | None = None,
    adapted: Json | None = None,
) -> Json:
    """This worker's report. `facts` must be equal everywhere (replicas, dataset shape); `recorded`: what the
    run's first start decided (the chief reads it from the run directory; a resume keeps those choices);
    `adapted`: what MODEL's adapt fitted here (train.data.adapt.fingerprint), the same everywhere."""
    return {
        "settings": settings_text,
        "model_sha256": model_sha256,
        "facts": facts,
        "fits_in_memory": fits_in_memory,
        "precision": precision,
        "recorded": recorded or {},
        "adapted": adapted or {},
    }


def _differences(reports: list[Json]) -> list[tuple[int, str]]:
    """(worker, what differs from the chief) for every difference."""
    chief = reports[0]
    differ = []
    for index, other in enumerate(reports[1:], start=1):
        for name, value in chief["settings"].items():
            theirs = other["settings"].get(name)
            if name in AUTO_RESOLVED and "auto" in (value, theirs):
                continue
            if theirs != value:
                differ.append((index, f"{name}={theirs!r} on worker {index} but {value!r} on the chief"))
        if other["model_sha256"] != chief["model_sha256"]:
            chiefs, theirs = chief["model_sha256"][:12], other["model_sha256"][:12]
            text = f"MODEL's code on worker {index} differs from the chief's ({theirs} against {chiefs})"
            differ.append((index, text))
        adapted = difference(chief.get("adapted") or {}, other.get("adapted") or {})
        if adapted:
            differ.append(
                (
                    index,
                    f"adapt gave other state on worker {index} than on the chief: {adapted} (does it "
                    "read the same training data?)",
                )
            )
        for name, value in chief["facts"].items():
            if other["facts"].get(name) != value:
                differ.append((index, f"{name} {other['facts'].get(name)} on worker {index} but {value} on the chief"))
    return differ


def _explicit(reports: list[Json], name: str) -> str | None:
    """The value a worker set (not auto); workers that set one all set the same (checked before)."""
    return next((r["settings"][name] for r in reports if r["settings"][name] != "auto"), None)


def reconcile(reports: list[Json]) -> Decision:
    """One decision for every worker, from every worker's report (the chief's first). Raises SettingsError."""
    differ = _differences(reports)
    if differ:
        raise SettingsError(
            f"worker {differ[0][0]} does not match the chief: {'; '.join(text for _, text in differ)}. Give every "
            "worker the same settings (and as many GPUs)"
        )
    notes = []
    recorded = reports[0]["recorded"]
    memory = _explicit(reports, "DATA_IN_MEMORY")
    everywhere = all(r["fits_in_memory"] for r in reports)
    if memory is not None:
        in_memory = memory == "true"
    elif "data_in_memory" in recorded and (everywhere or not recorded["data_in_memory"]):
        in_memory = bool(recorded["data_in_memory"])
    else:
        in_memory = everywhere
        if not everywhere and reports[0]["fits_in_memory"]:
            short = [_where(i) for i, r in enumerate(reports) if not r["fits_in_memory"]]
            notes.append(
                f"DATA_IN_MEMORY=auto: streaming on every worker: the splits do not fit on {', '.join(short)}."
            )
    precision = _explicit(reports, "MIXED_PRECISION")
    if precision is not None:
        policy = "float32" if precision == "off" else precision
    elif "precision" in recorded:
        policy = recorded["precision"]
    else:
        policy = min((r["precision"] for r in reports), key=PRECISION_ORDER.index)
        if len({r["precision"] for r in reports}) > 1:
            notes.append(f"MIXED_PRECISION=auto: {policy} on every worker, the one all of their GPUs support.")
    jit = _explicit(reports, "JIT_COMPILE") or "auto"
    return Decision(in_memory, policy, jit, tuple(notes))
