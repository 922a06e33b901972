"""A script that builds each MODEL file given on its command line through the engine's `build` (what fit, evaluate
and check call), in one process, and prints what each was refused with (null: built), as JSON."""

BUILD_EACH = """
import json, sys
from train.data import load_data
from train.devices.runtime import setup_runtime
from train.errors import SettingsError
from train.model import build
from train.model_file import load_model_file
from train.settings import load_settings
settings = load_settings()
runtime, data, said = setup_runtime(settings), load_data(settings, load_model_file(settings.model)), {}
for path in sys.argv[1:]:
    try:
        build(settings.replace(model=path), load_model_file(path), data.spec, runtime.strategy)
        said[path] = None
    except SettingsError as error:
        said[path] = str(error)
print(json.dumps(said))
"""
