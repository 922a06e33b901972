"""The default MODEL on a table (a CSV or JSON Lines DATASET with MODEL unset, or MODEL=examples.mlp): the
documented model of examples/mlp.py, Dense(64, relu) -> Dense(num_classes, softmax), behind a preprocessing
adapted on the train split and carried into the export, so that `serving_default` takes the raw columns.
A label that is a value (as docs/data.md guesses it, or LABEL_KIND=value) gets a regression head instead:
Dense(64, relu) -> Dense(1), mean squared error, MAE and RMSE (`mae`, `rmse`). Its target is normalised with
the train split's mean and deviation (`context.sample(n, labels=True)` over the whole split, summed in float64
in the stored order: the same on every worker and start), and its last layer (Rescaling: y * deviation + mean)
undoes that, so the loss, the metrics and `predict`'s "prediction" are in the label's units.

    python -m train fit --dataset ./table.csv                        # MODEL unset: this file
    python -m train predict --output-dir runs/default rows.csv       # raw rows, an empty cell included

Each column but the label, in the order of their names, is one kind, which `adapt` decides on the train split:
- a number: normalised with the train split's mean and variance; a missing one (an empty cell, stored as NaN)
  is the train mean (0 once normalised), and a float column adds an indicator, 1.0 where it is missing;
- a date: text whose non-empty values (DATE_SHARE of them at least) have one form, ISO `yyyy-mm-dd` or
  `yyyy/mm/dd` (a time after it is left out), or `dd/mm/yyyy` where some first field passes 12 and no second
  does, `mm/dd/yyyy` the other way round (where no field passes 12, the order is unknown: the column is text):
  year, month, day and weekday (Monday 0), computed with tf.strings in `preprocess` (so in the export too),
  normalised as numbers are, and 1.0 where the value is missing or no date (its four features then 0);
- an ID, left out: whole numbers, or text of one word a row, that differ in every row of the train split (of
  ID_ROWS rows at least); KEEP_COLUMNS=id keeps it, as the kind it would be otherwise;
- text with at most LOOKUP_VALUES distinct values in the train split: looked up, one-hot (a value the train
  split lacks: a slot of its own);
- other text: a bag of words, TextVectorization's multi-hot over at most BAG_TOKENS tokens.
All side by side in one float32 vector, the MLP's input. The start says it in one line:

    Columns: 2 numbers (normalised), city looked up (3 values), notes as words (812 tokens), date as a date
    (year, month, day, weekday, missing), id left out (a different value in every row)

and run.json's "adapted" records each column's kind (under "adapt", what `adapt` returns). A column left out
still reaches `preprocess` and the export's inputs; DROP_COLUMNS leaves a column out of the data itself.

`adapt(context)` reads the whole train split once, and once more for each bag of words, in its stored order (the
same on every worker and every start); the statistics are summed in float64 in that order, so every worker holds
the same numbers. The layers are module globals (NUMBERS, DATES, LOOKUPS, BAGS), where the engine finds them:
their state is run.json's "adapted" (compared between workers and at each start) and the export carries them.
examples/tabular.py (numbers only, no preprocess) and examples/tabular_text.py (a lookup) are smaller models to
start your own from.
"""

from __future__ import annotations

import re
from collections import Counter

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from examples import mlp

LOOKUP_VALUES = 50  # text with at most this many distinct values in the train split is one-hot, more: words
BAG_TOKENS = 10_000  # a bag of words' vocabulary, the out-of-vocabulary token included
WHOLE_SPLIT = 2**62  # context.examples(n): every training row
ID_ROWS = 30  # with fewer train rows, values that all differ may be chance, not an ID
DATE_SHARE = 0.95  # a text column is dates where this share of its non-empty train values has one date form
DATE_FORMS = {  # a date's form -> its pattern (RE2 and Python read it alike), the groups of year, month and day
    "yyyy-mm-dd": (r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})(?:[T ].*)?", (1, 2, 3)),
    "yyyy/mm/dd": (r"([0-9]{4})/([0-9]{1,2})/([0-9]{1,2})(?:[T ].*)?", (1, 2, 3)),
    "dd/mm/yyyy": (r"([0-9]{1,2})/([0-9]{1,2})/([0-9]{4})", (3, 2, 1)),
    "mm/dd/yyyy": (r"([0-9]{1,2})/([0-9]{1,2})/([0-9]{4})", (3, 1, 2)),
}
WEEKDAY_OFFSETS = (0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4)  # Sakamoto's weekday algorithm: by month

NUMBERS: layers.Normalization | None = None  # the numeric columns, each to mean 0 and variance 1
DATES: dict[str, layers.Normalization] = {}  # a column of dates -> its year, month, day and weekday normalised
LOOKUPS: dict[str, layers.StringLookup] = {}  # a text column of few values -> its one-hot lookup
BAGS: dict[str, layers.TextVectorization] = {}  # other text -> its multi-hot bag of words
_columns: dict[str, list[str]] = {"numbers": [], "floats": []}  # numeric columns; those that may be NaN
_forms: dict[str, str] = {}  # a column of dates -> its form (DATE_FORMS)
_label: list[str] = ["label"]


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float, *, context) -> keras.Model:
    """A class label: the documented model (examples/mlp.py). A value (num_classes None): the same hidden layer and a
    regression head whose target is normalised with the train split's mean and deviation, undone by its last layer,
    so that the loss, the metrics and the predictions are in the label's units."""
    if num_classes is not None:
        return mlp.build_model(input_shape, num_classes, learning_rate)
    mean, deviation = _label_statistics(context.sample(WHOLE_SPLIT, labels=True))
    model = keras.Sequential(name="regressor")
    model.add(keras.Input(shape=input_shape))
    model.add(layers.Dense(64, activation="relu"))
    model.add(layers.Dense(1, dtype="float32"))  # the target normalised, float32 even under mixed precision
    model.add(layers.Rescaling(deviation, offset=mean, dtype="float32", name="label_units"))  # y * std + mean
    model.add(layers.Reshape(()))  # shape (batch,), as the label is stored: no broadcasting in the loss
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="mean_squared_error",
        metrics=[keras.metrics.MeanAbsoluteError(name="mae"), keras.metrics.RootMeanSquaredError(name="rmse")],
    )
    return model


def _label_statistics(batches: tf.data.Dataset) -> tuple[float, float]:
    """The labels' mean and standard deviation over (inputs, labels) `batches`, summed in float64 in their order (the
    same on every worker and every start, so a resume rebuilds the same model); a deviation of 0 (one value) is 1."""
    labels = np.concatenate([label.astype(np.float64).reshape(-1) for _, label in batches.as_numpy_iterator()])
    return float(labels.mean()), float(labels.std()) or 1.0


def adapt(context) -> dict[str, str]:
    """Each column's kind decided on the train split and its layer fitted; the Columns line said. Returns each
    column's kind: number, date <form>, left out, looked up or words (recorded in run.json)."""
    global NUMBERS
    rows = context.examples(WHOLE_SPLIT)
    label, spec = context.label_key, rows.element_spec
    names = [name for name in sorted(spec) if name != label]
    for name in names:
        _check(name, spec[name])
    unknown = [name for name in context.keep_columns if name not in names]
    if unknown:
        raise ValueError(
            f"KEEP_COLUMNS={','.join(context.keep_columns)!r}: {unknown[0]!r} is not a column the model takes: use "
            f"some of {', '.join(names)}"
        )
    batches = list(rows.as_numpy_iterator())
    values = {name: np.concatenate([batch[name] for batch in batches]) for name in names}
    kinds = {name: _decided(name, values[name], context.keep_columns) for name in names}
    numeric = [name for name in names if kinds[name] == "number"]
    _columns.update(numbers=numeric, floats=[name for name in numeric if values[name].dtype.kind == "f"])
    _label[:] = [label]
    NUMBERS = _normalization(np.stack([values[name] for name in numeric], axis=1)) if numeric else None
    for each in (_forms, DATES, LOOKUPS, BAGS):
        each.clear()
    for name, kind in kinds.items():
        if kind.startswith("date "):
            _forms[name] = kind.removeprefix("date ")
            features, valid = _date(tf.constant(values[name]), _forms[name])
            DATES[name] = _normalization(np.where(valid.numpy()[:, None], features.numpy(), np.nan))
        elif kind == "looked up":  # the most frequent first, ties by value: the same on every worker
            counts = Counter(values[name].tolist())
            vocabulary = sorted((value for value in counts if value != b"[UNK]"), key=lambda v: (-counts[v], v))
            LOOKUPS[name] = layers.StringLookup(vocabulary=[v.decode() for v in vocabulary], output_mode="one_hot")
        elif kind == "words":
            BAGS[name] = layers.TextVectorization(max_tokens=BAG_TOKENS, output_mode="multi_hot")
            BAGS[name].adapt(rows.map(lambda row, name=name: row[name]))
    context.say(_said(kinds))
    return kinds


def _check(name: str, spec) -> None:
    """A column that is one number or one text per row (as a table's columns are), else ValueError."""
    if (
        not isinstance(spec, tf.TensorSpec)
        or spec.shape.rank != 1
        or not (spec.dtype == tf.string or spec.dtype.is_integer or spec.dtype.is_floating)
    ):
        raise ValueError(
            f"examples/mlp_table.py takes a table's columns, each one number or one text a row, but {name!r} is "
            f"{spec}: point MODEL at a model of your own for this data (see examples/tabular_text.py)"
        )


def _decided(name: str, values: np.ndarray, keep: tuple[str, ...]) -> str:
    """A column's kind from its train values: number, date <form>, left out (an ID), looked up or words."""
    every_row = name not in keep and len(values) >= ID_ROWS and len(np.unique(values)) == len(values)
    if values.dtype != object:  # numbers; text is bytes
        return "left out" if every_row and values.dtype.kind == "i" else "number"
    texts = [value.decode().strip() for value in values]
    form = _date_form([text for text in texts if text])
    if form is not None:
        return f"date {form}"
    if every_row and all(len(text.split()) == 1 for text in texts):  # one word a row, never twice: a reference
        return "left out"
    return "looked up" if len(set(values.tolist())) <= LOOKUP_VALUES else "words"


def _date_form(texts: list[str]) -> str | None:
    """The form (DATE_FORMS) that DATE_SHARE of `texts` (a column's non-empty values) have, or None. Day first
    where some first field passes 12 and no second does, month first the other way round: else not a date."""
    for form, (pattern, (year, month, day)) in DATE_FORMS.items():
        found = [match for match in map(re.compile(pattern).fullmatch, texts) if match]
        if not texts or len(found) < DATE_SHARE * len(texts):
            continue
        if year == 3 and (all(int(m[day]) <= 12 for m in found) or any(int(m[month]) > 12 for m in found)):
            continue  # day and month cannot be told apart, or neither order fits
        return form
    return None


def _date(text: tf.Tensor, form: str) -> tuple[tf.Tensor, tf.Tensor]:
    """Year, month, day and weekday (Monday 0) of each text in `form`, float32 (..., 4), 0 where it is no date,
    and where it is one (bool): TensorFlow ops alone, so that the export computes them from the raw text."""
    pattern, groups = DATE_FORMS[form]
    text = tf.strings.strip(text)
    matched = tf.strings.regex_full_match(text, pattern)
    fields = [tf.strings.regex_replace(text, f"^{pattern}$", f"\\{group}") for group in groups]
    year, month, day = (tf.strings.to_number(tf.where(matched, each, "0"), tf.int64) for each in fields)
    valid = matched & (month >= 1) & (month <= 12) & (day >= 1) & (day <= 31)
    before = year - tf.cast(month < 3, tf.int64)  # January and February count with the year before
    offset = tf.gather(tf.constant(WEEKDAY_OFFSETS, tf.int64), tf.clip_by_value(month - 1, 0, 11))
    weekday = (before + before // 4 - before // 100 + before // 400 + offset + day + 6) % 7  # Monday 0
    features = tf.cast(tf.stack([year, month, day, weekday], axis=-1), tf.float32)
    return tf.where(valid[..., None], features, 0.0), valid


def _normalization(values: np.ndarray) -> layers.Normalization:
    """A Normalization to the mean and variance of each column of `values` (rows, columns), NaN left out, summed
    in float64 in the stored order: the same numbers on every worker."""
    values = values.astype(np.float64)
    present = ~np.isnan(values)
    count = np.maximum(present.sum(axis=0), 1)
    mean = np.where(present, values, 0.0).sum(axis=0) / count
    variance = (np.where(present, values - mean, 0.0) ** 2).sum(axis=0) / count
    layer = layers.Normalization(mean=mean.tolist(), variance=variance.tolist())
    layer.build((None, values.shape[1]))
    return layer


def _said(kinds: dict[str, str]) -> str:
    """The start's line: how each column is taken."""
    numbers = list(kinds.values()).count("number")
    said = [f"{numbers} number{'s' * (numbers > 1)} (normalised)"] if numbers else []
    for name, kind in kinds.items():
        if kind == "looked up":
            said.append(f"{name} looked up ({LOOKUPS[name].vocabulary_size() - 1} values)")  # the OOV slot aside
        elif kind == "words":
            said.append(f"{name} as words ({BAGS[name].vocabulary_size() - 1} tokens)")  # [UNK] aside
        elif kind.startswith("date "):
            said.append(f"{name} as a date (year, month, day, weekday, missing)")
        elif kind == "left out":
            said.append(f"{name} left out (a different value in every row)")
    return "Columns: " + ", ".join(said)


def preprocess(example: dict, training: bool, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    del training, seed  # the same in training, evaluation and the export
    parts = []
    if NUMBERS is not None:
        numbers = tf.stack([tf.cast(example[name], tf.float32) for name in _columns["numbers"]])
        missing = tf.math.is_nan(numbers)
        # the layers work on batches: one example goes in as a batch of one, and its one row comes out
        parts.append(tf.where(missing, 0.0, NUMBERS(numbers[None])[0]))  # missing: the train mean, 0 once scaled
        floats = [_columns["numbers"].index(name) for name in _columns["floats"]]
        if floats:
            parts.append(tf.cast(tf.gather(missing, floats), tf.float32))
    parts += [tf.cast(LOOKUPS[name](example[name][None])[0], tf.float32) for name in LOOKUPS]
    parts += [tf.cast(BAGS[name](example[name][None])[0], tf.float32) for name in BAGS]
    for name, form in _forms.items():  # no date: its features 0 (the train mean), and 1.0 beside them
        features, valid = _date(example[name], form)
        parts += [tf.where(valid, DATES[name](features[None])[0], 0.0), tf.cast(~valid, tf.float32)[None]]
    if not parts:
        raise ValueError("the table has no column but its label: add a column to learn from")
    return tf.concat(parts, axis=0), example[_label[0]]
