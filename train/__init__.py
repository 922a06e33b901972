"""A containerised multi-GPU TensorFlow/Keras training template. Run `python -m train --help`.

The engine's map: what each module or package owns, and what it must not do. A fork edits `project/` (its MODEL
file, its datasets) and never a row of this table: docs/fork.md is its guide, docs/design.md gives the reasons.
Model, data, devices, phases, the loop, its hook interface and the plug-ins are the rows in capitals.

| where           | owns                                                           | must not                          |
|-----------------|----------------------------------------------------------------|-----------------------------------|
| cli, command,   | the commands (cli): resolve the settings, call the library,    | compute what a library call       |
| __main__        | map errors to exit codes (command, errors)                     | could; import TF before a command |
|                 |                                                                | needs it                          |
| settings/       | each setting declared once (table), parsed (parse), layered:   | import TensorFlow or train.data;  |
|                 | flag > environment > the run's settings.json > .env > default  | write a file                      |
|                 | (layers; run); checked before TF loads; TF_CONFIG (tf_config)  |                                   |
| dataset_path,   | DATASET's kind, decided once as load_settings checks it        | import settings, data or TF at    |
| datasets/       | (source): TFDS for a TFDS name, or a path's stat survey with   | import time; be asked again       |
|                 | its reader, one per kind (dataset_path), passed down as        | (below, Settings.source is read)  |
|                 | Settings.source; the template's offline TFDS builders, with    |                                   |
|                 | the fork's registered (datasets)                               |                                   |
| signals         | SIGTERM and Ctrl-C heard once (StopRequest, stop_heard); while | import TensorFlow                 |
|                 | data is written, a stop drops it at once (dropping)            |                                   |
| run_files       | settings.json's name, which settings/ and rundir both read     | import anything                   |
| model_file      | MODEL's file: found, parsed, hashed, imported once: the        | import train.settings, or TF at   |
|                 | Experiment, loaded once a command (load_model_file) and passed | import time; be loaded again      |
|                 | down, with its seams (build_model, preprocess, adapt,          | below a command                   |
|                 | build_callbacks, build_hooks, export_model) and whether a      |                                   |
|                 | model has its own train_step                                   |                                   |
| hparams         | build_model's keyword defaults as HP_<NAME> settings           | import train.settings             |
| devices/        | DEVICES: visible GPUs and memory growth, then the strategy, in | be called after other TF work;    |
|                 | that order, and the global batch, once (runtime); the one seam | call TF's device API outside      |
|                 | for GPU-only calls, which tests fake (backend); the start-up   | backend; import cluster/ (they    |
|                 | deadline on the workers' wait (deadline)                       | read settings' Cluster)           |
| batches         | what a step's batch is: global, per replica, micro-batches     | import TensorFlow                 |
| cluster/        | SEVERAL MACHINES: the one seam where multi-worker differs,     | be asked which it is: the engine  |
|                 | (the cluster's TF_CONFIG is settings/tf_config's)              | asks the Role to act, and calls   |
|                 | SingleHost or Workers (workers); the Role, decided once: the   | `peers` alike                     |
|                 | peers, the writer and what only the chief does (role); local   |                                   |
|                 | workers (launch)                                               |                                   |
| data/           | DATA: DATASET opened, or written once (opening, local,         | import the model, the step or the |
|                 | written); what it holds (spec); its splits held in memory or   | run directory                     |
|                 | streamed (source); the general path's examples and preprocess  |                                   |
|                 | (examples); what reading them raises mid-run (reading_errors); |                                   |
|                 | batches behind the Feed protocol, chosen once (feeds.adapter), |                                   |
|                 | in an order fixed by (SEED, step) (feeds)                      |                                   |
| data/adapt,     | MODEL's adapt(context), once a process; the run's facts handed | train; write                      |
| context         | to build_model, build_callbacks and build_hooks                |                                   |
| model           | MODEL: the fork's compiled model checked against the data,     | run a training step, or import    |
|                 | wrapped in its input and scaling, its own train_step traced    | the step; restore                 |
|                 | and every optimizer built before any restore (build); seeds    |                                   |
| exportable,     | the export (model.keras, saved_model/, the averaged weights),  | write into OUTPUT_DIR             |
| outputs         | tried before the first step; the outputs checked against the   |                                   |
|                 | labels and named as TF Serving names them                      |                                   |
| step            | THE STEP: one Step (a call of STEPS_PER_CALL steps under       | know files, epochs or which       |
|                 | strategy.run, and evaluation): the engine's, a model's own     | worker it is on                   |
|                 | train_step, or the engine's in micro-batches, chosen once      |                                   |
|                 | (make_calls, make_evaluator)                                   |                                   |
| keras_seams     | the few places below Keras's public API, each guarded by a     | grow without a test naming it     |
|                 | test                                                           |                                   |
| fit             | THE RUN: fit and evaluate, the chapters below called in order; | write a file itself; ask which    |
|                 | errors told in one line, AUTO_BATCH's retry                    | worker it is on                   |
| start,          | the start: workers agree (agreement), the data loaded, the     | write anything (start); hold Any  |
| agreement       | model built, XLA decided: a frozen Start                       |                                   |
| resume, rundir, | the run directory proven writable before TF, its newest        | train but through the loop;       |
| checkpoints,    | checkpoint that loads (rundir); opened, restored or begun, and | write but through the writer      |
|                 | where the run is: Position; the last evaluation, the export,   |                                   |
|                 | summary.json (resume); what a checkpoint holds, restored       |                                   |
| timeline        | with its seeds (checkpoints); steps mapped to epochs and to    |                                   |
|                 | the data: the one epoch arithmetic (timeline)                  |                                   |
| phases,         | PHASES: which layers train when, at what rate: the plan        | import TensorFlow (phases); run   |
| phased          | (Phase, Phases) of FREEZE/UNFREEZE_* or MODEL's phases(),      | a step or know files (phased)     |
|                 | resolved on the built model once (make_phases); each phase     |                                   |
|                 | entered at its first step (trainable flags, fresh slots, the   |                                   |
|                 | rate), its calls made again (PhaseCalls)                       |                                   |
| init_from,      | INIT_FROM's source, one class per kind, chosen once            | import keras or keras_hub at      |
| presets         | (init_source): checked before TF, matched to the built model   | import time; download (presets:   |
|                 | by layer name or by Keras's paths, applied once before step 0  | the kagglehub cache only)         |
|                 | (init_from); a KerasHub preset's folder, found in kagglehub's  |                                   |
|                 | cache by name (presets: resolve_preset)                        |                                   |
| hooks           | THE HOOK INTERFACE, public: Hook (its moments: run_begin, the  | import TensorFlow or the engine   |
|                 | loop's between calls, summary, run_end), RunInfo, CallResult   |                                   |
| loop,           | THE LOOP: calls on time (loop); between them an ordered list   | run a training call (run_hooks);  |
| run_hooks       | of hooks: profiler, the fork's callbacks, stop requests, the   | know files or workers (loop)      |
|                 | plug-ins' and MODEL's (build_hooks), scalars, progress, finite |                                   |
|                 | loss, checkpoint, in between_calls' order (run_hooks)          |                                   |
| callbacks,      | the fork's Keras callbacks, MONITOR, epochs.json (a hook);     | write but through the writer      |
| progress        | MODEL's build_hooks checked, each moment guarded (callbacks);  |                                   |
|                 | what a run says while it trains (progress: a hook)             |                                   |
| writer          | what the chief writes (settings.json, run.json, epochs.json,   | be bypassed (a checkpoint is a    |
|                 | summary.json, logs), decided once; the other workers' Writer   | collective: checkpoints, peers)   |
|                 | does nothing                                                   |                                   |
| predict         | a trained run opened for evaluate and predict (open_trained);  | train; write into OUTPUT_DIR      |
|                 | `predict`: the export run on files, rows or a split, as JSON   |                                   |
|                 | Lines; what it reads, checked                                  |                                   |
| formats         | model.keras as ONNX and LiteRT (and int8), each run in its     | train; keep an artifact that does |
|                 | runtime against model.keras before formats/ is replaced whole  | not match model.keras             |
| plugins/        | PLUG-INS over the hook interface, imported by the command line | import TensorFlow, or of the      |
|                 | alone: `tune`, an Optuna study over --space (search_space) or  | engine more than hooks, errors,   |
|                 | MODEL's search_space(trial), its trials `fit` processes in run | settings, model_file, rundir; be  |
|                 | directories of STUDY_DIR, claimed, resumed and told by number  | imported by the engine; train but |
|                 | (tune); storage, objective, TUNE_TRIAL (study); a fit run as a | through `fit` (tune); import      |
|                 | trial, each epoch reported, pruned (trial: a hook);            | mlflow at import time, or cost    |
|                 | TRACKING=mlflow, the chief's params, metrics, tags and files   | the training (a failing tracker   |
|                 | in one MLflow run a run directory, a resume's too; `tune`'s    | goes off)                         |
|                 | parent run (tracking: a hook)                                  |                                   |
| errors          | the one-line failures, and every exit code                     | import TensorFlow                 |
| tools/          | the doctor, check and its probe, the benchmark; the copies in  | be imported by the engine         |
|                 | TFDS_DATA_DIR listed and pruned (prepared: data list, prune)   |                                   |

The modules stand in seven layers, top to bottom, each importing only its own or those below (import-linter's
`layers` contract in pyproject.toml): the command line (cli, command); tools, and the plug-ins; the run (fit,
start, agreement, resume, predict, formats); the loop and the engine's hooks (loop, run_hooks, callbacks); the step,
the model, the data and the checkpoints; devices, cluster and the writer; settings and what every layer reads (settings,
model_file, hparams, dataset_path, rundir, errors, phases, timeline, progress, keras_seams, and hooks, the hook
interface).

The "must not" column that imports can show is enforced by import-linter (pyproject.toml's [tool.importlinter],
`make lint`); what they cannot show, and issue 44's counts, by tests/test_layout.py.
"""

from train.phases import Phase  # MODEL's phases() returns these: `from train import Phase` imports no TensorFlow

__version__ = "0.1.0"
__all__ = ["Phase"]
