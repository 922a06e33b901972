"""A text classifier: words to ids by a TextVectorization adapted on the raw training texts, then an Embedding,
average pooling and a softmax (keras-io's text_classification_from_scratch, small):

    MODEL=examples/text.py DATASET=synthetic_reviews python -m train fit     # offline, generated here
    MODEL=examples/text.py DATASET=imdb_reviews python -m train fit          # once prepared

Nothing here names a dataset: only the keys `text` and `label` that TFDS's text datasets use.

`adapt(context)` runs once in each process before anything else of this file: it learns the vocabulary from
the first ADAPT_EXAMPLES stored training texts (`context.examples`, the same on every worker and start; the
engine records a fingerprint of the vocabulary in run.json and refuses a start whose vocabulary differs).
`preprocess` turns each text into SEQUENCE_LENGTH word ids in tf.data, so no string reaches a replica, and the
export's `serving_default` takes the raw `text` strings, the vocabulary inside the SavedModel.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

MAX_TOKENS = 20_000  # the vocabulary's words, the padding and the out-of-vocabulary id included
SEQUENCE_LENGTH = 200  # word ids per text: longer texts are cut, shorter ones padded with 0
ADAPT_EXAMPLES = 50_000  # training texts the vocabulary is learnt from (all of them for a smaller split)
EMBEDDING = 64  # dimensions of a word's vector
HIDDEN = 64

VOCABULARY = layers.TextVectorization(max_tokens=MAX_TOKENS, output_sequence_length=SEQUENCE_LENGTH)


def adapt(context) -> None:
    VOCABULARY.adapt(context.examples(ADAPT_EXAMPLES).map(lambda example: example["text"]))


def preprocess(example: dict, training: bool, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """One stored example (`text`, `label`) -> (SEQUENCE_LENGTH int64 word ids, label)."""
    del training, seed  # the same words in training and evaluation
    return VOCABULARY(example["text"]), example["label"]


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float) -> keras.Model:
    if num_classes is None:
        raise ValueError("this model classifies: use a dataset whose label is a class")
    inputs = keras.Input(shape=input_shape, dtype="int64", name="inputs")
    x = layers.Embedding(VOCABULARY.vocabulary_size(), EMBEDDING, mask_zero=True)(inputs)  # adapt ran first
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(HIDDEN, activation="relu")(x)
    # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    model = keras.Model(inputs, outputs, name="text")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
