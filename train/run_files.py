"""The name of a run's file in OUTPUT_DIR that two layers read: settings/ (the run's own settings, a layer) and
rundir (what a run writes, proven writable before TensorFlow loads). Imports nothing: below both."""

RUN_SETTINGS = "settings.json"  # in OUTPUT_DIR: the settings a run was started with
