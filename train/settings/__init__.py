"""Every setting of the template: declared once, resolved through the layers, checked before TensorFlow loads.

| module     | owns                                                           | must not                       |
|------------|----------------------------------------------------------------|--------------------------------|
| `table`    | `Settings`: one line per setting (type, default, parser, help, | list a setting twice, or read  |
|            | marks); FIELDS, read back from it; the rules between settings  | a layer                        |
|            | (`check_together`)                                             |                                |
| `parse`    | the parsers that turn a setting's text into its value          | know where the text came from  |
|            | (`positive_int`, `true_or_false`, ...)                         |                                |
| `layers`   | the precedence (`load_settings`, which makes Settings.source), | parse or check a value itself, |
|            | `.env` files, likely typos, build_model's flags before         | or write a file                |
|            | parsing; TFDS_DATA_DIR alone, for `data list|prune`            |                                |
|            | (`data_dir`); a run's settings.json, RUN_DEFINING and          |                                |
|            | WORKERS_AGREE, agreed and changed settings                     |                                |

MODEL's file (its syntax tree, hash and hyperparameters) is train.model_file's; build_model's settings, HP_<NAME>,
are train.hparams'; DATASET's kind (a TFDS name, or a path and what it holds) is train.dataset_path's, decided once
by `load_settings` and kept as Settings.source, which is not a setting (never written to settings.json nor
compared). Nothing here imports TensorFlow or train.data, so `--help` and a bad value answer at once.
"""

from train.model_file import DEFAULT_MODEL
from train.settings.layers import (
    ENVIRONMENT_TYPO_CUTOFF,
    RUN_DEFINING,
    RUN_SETTINGS,
    WORKERS_AGREE,
    agreed_settings,
    changed_settings,
    check_run_settings,
    likely_typos,
    load_settings,
    peek_hyperparameters,
    project_defaults_path,
    read_dotenv,
    read_run_settings,
)
from train.settings.table import (
    ALL_REDUCES,
    AUTO_TRUE_FALSE,
    FIELDS,
    FIELDS_BY_ENV,
    MONITOR_MODES,
    PRECISIONS,
    PROGRESS_MODES,
    RESUME_MODES,
    SINGLE_HOST,
    STRATEGIES,
    Field,
    Settings,
    check_together,
)

__all__ = [
    "ALL_REDUCES",
    "AUTO_TRUE_FALSE",
    "DEFAULT_MODEL",
    "ENVIRONMENT_TYPO_CUTOFF",
    "FIELDS",
    "FIELDS_BY_ENV",
    "MONITOR_MODES",
    "PRECISIONS",
    "PROGRESS_MODES",
    "RESUME_MODES",
    "RUN_DEFINING",
    "RUN_SETTINGS",
    "SINGLE_HOST",
    "STRATEGIES",
    "WORKERS_AGREE",
    "Field",
    "Settings",
    "agreed_settings",
    "changed_settings",
    "check_run_settings",
    "check_together",
    "likely_typos",
    "load_settings",
    "peek_hyperparameters",
    "project_defaults_path",
    "read_dotenv",
    "read_run_settings",
]
