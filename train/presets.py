"""A KerasHub preset found on this machine: a local folder, or a preset name (or `kaggle://` handle) resolved
in kagglehub's cache (KAGGLEHUB_CACHE, default ~/.cache/kagglehub). Nothing downloads: a preset that is not in
the cache is refused in one line naming the folder to mount or fill.

No TensorFlow and no `import keras_hub` here: the preset names come from keras_hub's own registry files (each
model's `*_presets.py`, read as text), so INIT_FROM and HP_PRESET are checked before TensorFlow loads.
`resolve_preset(text) -> Path` is what INIT_FROM (train.init_from) and examples/finetune.py call.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from functools import cache
from pathlib import Path

from train.errors import SettingsError

CONFIG_FILE, METADATA_FILE = "config.json", "metadata.json"  # what KerasHub's save_to_preset writes
KAGGLE_PREFIX = "kaggle://"
# kagglehub's layout (kagglehub.cache): models/<owner>/<model>/<framework>/<variation>/<version>/, complete once
# the marker <version>.complete sits beside it (a download cut short has no marker)
MODELS = "models"


def cache_dir() -> Path:
    """kagglehub's cache folder, as kagglehub.config.get_cache_folder finds it."""
    return Path(os.environ.get("KAGGLEHUB_CACHE") or Path.home() / ".cache" / "kagglehub").expanduser()


def is_preset_dir(path: Path) -> bool:
    """A folder KerasHub's save_to_preset wrote (its config.json and metadata.json)."""
    return path.is_dir() and (path / CONFIG_FILE).is_file() and (path / METADATA_FILE).is_file()


def looks_like_name(text: str) -> bool:
    """A preset name (resnet_18_imagenet) or a kaggle:// handle, not a path."""
    return text.startswith(KAGGLE_PREFIX) or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", text) is not None


def resolve_preset(text: str, setting: str = "HP_PRESET") -> Path:
    """The local folder of the preset `text`: a folder as it is, or a preset name or kaggle:// handle found in
    the kagglehub cache. Raises SettingsError (one line, naming `setting`) where it is not on this machine."""
    path = Path(text).expanduser()
    if path.exists() or not looks_like_name(text):
        if not is_preset_dir(path):
            raise SettingsError(
                f"{setting}={text!r} is not a KerasHub preset folder (no {CONFIG_FILE} and {METADATA_FILE} in it"
                f"{'' if path.exists() else ': it does not exist'}): give a folder save_to_preset wrote, or a "
                "preset name in the kagglehub cache"
            )
        return path
    handle = text.removeprefix(KAGGLE_PREFIX) if text.startswith(KAGGLE_PREFIX) else _registry().get(text)
    if handle is None:
        raise SettingsError(
            f"{setting}={text!r} is neither a folder nor a KerasHub preset name"
            f"{'' if _registry() else ' (keras-hub is not installed: make setup EXTRAS=dev,hub)'}: give a folder "
            "save_to_preset wrote, a preset name such as resnet_18_imagenet, or a kaggle:// handle"
        )
    parts = handle.strip("/").split("/")
    if len(parts) not in (4, 5):
        raise SettingsError(
            f"{setting}={text!r} is not a kaggle handle: use kaggle://<owner>/<model>/<framework>/<variation>"
            "[/<version>]"
        )
    variation = cache_dir() / MODELS / Path(*parts[:4])
    found = _cached_version(variation, parts[4] if len(parts) == 5 else None)
    if found is None:
        version = f" version {parts[4]}" if len(parts) == 5 else ""
        raise SettingsError(
            f"{setting}={text!r}: preset kaggle://{'/'.join(parts[:4])}{version} is not in the kagglehub cache: "
            f"mount or fill {variation} (KAGGLEHUB_CACHE={cache_dir()}; nothing downloads at run time)"
        )
    return found


def _cached_version(variation: Path, version: str | None) -> Path | None:
    """The complete cached version of a model variation: `version`, or the highest one there."""
    try:
        names = os.listdir(variation)
    except OSError:
        return None
    complete = sorted(
        (int(name), variation / name)
        for name in names
        if name.isdigit() and (variation / f"{name}.complete").exists() and is_preset_dir(variation / name)
    )
    if version is not None:
        complete = [each for each in complete if str(each[0]) == version]
    return complete[-1][1] if complete else None


@cache
def _registry() -> dict[str, str]:
    """KerasHub's preset names -> kaggle handles (without kaggle://), read from its `*_presets.py` files without
    importing it (keras_hub imports TensorFlow). Empty where keras-hub is not installed."""
    spec = importlib.util.find_spec("keras_hub")
    if spec is None or not spec.submodule_search_locations:
        return {}
    handles: dict[str, str] = {}
    for root in spec.submodule_search_locations:
        for file in sorted(Path(root, "src", "models").glob("*/*_presets.py")):
            try:
                tree = ast.parse(file.read_text(encoding="utf-8"))
            except (OSError, SyntaxError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Dict):
                    handles.update(_handles(node))
    return handles


def _handles(node: ast.Dict) -> dict[str, str]:
    """{name: handle} of a dict literal {"name": {..., "kaggle_handle": "kaggle://..."}}."""
    found = {}
    for key, value in zip(node.keys, node.values, strict=True):
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Dict)):
            continue
        for inner_key, inner in zip(value.keys, value.values, strict=True):
            if (
                isinstance(inner_key, ast.Constant)
                and inner_key.value == "kaggle_handle"
                and isinstance(inner, ast.Constant)
                and isinstance(inner.value, str)
            ):
                found[key.value] = inner.value.removeprefix(KAGGLE_PREFIX)
    return found
