"""The plug-ins: what only some runs want, on top of the engine. They reach a run through the public hook interface
(train.hooks) alone, as a fork's own hooks do (MODEL's build_hooks); the command line (train.cli) is the only
module that imports them, and the engine imports none (pyproject.toml's contracts).

| module       | owns                                                                                             |
|--------------|--------------------------------------------------------------------------------------------------|
| tune         | `python -m train tune`: an Optuna study whose trials are `fit` processes in STUDY_DIR's run dirs |
| study        | its storage, objective and a trial's value; TUNE_TRIAL, the trial a fit runs as (`TrialRef`)     |
| search_space | --space NAME=SPEC, or MODEL's search_space(trial), checked before any trial                      |
| trial        | a fit run as a trial: each epoch reported, the pruner heard (a hook)                             |
| tracking     | TRACKING=mlflow: the chief's params, metrics and files in one MLflow run a run directory (a hook) |

None imports TensorFlow: the command line makes their hooks before it loads.
"""

from __future__ import annotations

from train.errors import SettingsError
from train.hooks import Hook
from train.plugins.study import TRIAL_ENV, TrialRef
from train.plugins.tracking import MlflowTracking
from train.plugins.trial import TrialReport


def fit_hooks(tracking: str, multi_worker: bool) -> list[Hook]:
    """The plug-ins' hooks a fit runs with, in this order: the tune's trial it runs as (TUNE_TRIAL), TRACKING's
    tracker (`tracking`: its value). Made before TensorFlow loads. Raises SettingsError for a TUNE_TRIAL `tune` did
    not write, and for one on a multi-worker run (each worker would report to the trial, and be pruned, alone)."""
    trial = TrialRef.from_env()
    if trial is not None and multi_worker:
        raise SettingsError(
            f"{TRIAL_ENV} is set on a multi-worker run (TF_CONFIG, STRATEGY=multi_worker), but a tune's trial is one "
            "process: unset TF_CONFIG where `tune` starts"
        )
    return [*([TrialReport(trial)] if trial else []), *([MlflowTracking()] if tracking == "mlflow" else [])]
