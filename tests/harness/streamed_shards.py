"""What one worker of a multi-worker run reads of a streamed split (tests/test_multi_worker.py).

    TF_CONFIG=... TFDS_DATA_DIR=... python -m tests.harness.streamed_shards OUTPUT_JSON

Prints nothing; writes, for two passes, the example ids this worker's replica trains on at each step (an
example's id is its position in the split, found from its features), the ids of its share (what it reads),
the same from a restart at step 5, and how many examples the whole split has.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from train.data import load_data
from train.data.feeds import train_dataset
from train.devices.runtime import setup_runtime
from train.model_file import load_model_file
from train.settings import load_settings

settings = load_settings({"BATCH_SIZE": "512", "DATA_IN_MEMORY": "false"})
runtime = setup_runtime(settings)
data = load_data(settings, load_model_file(settings.model))
split = data.train
rows = np.concatenate([f.numpy() for f, _ in split.read(shuffle_files=False).batch(4096)])
ids = {row.tobytes(): i for i, row in enumerate(rows)}
passes = split.pass_batches(runtime.global_batch // runtime.workers, runtime.workers)


def read(start: int, stop: int) -> list[list[int]]:
    iterator = iter(train_dataset(runtime.strategy, split, runtime.global_batch, settings.seed, start))
    steps = []
    for _ in range(start, stop):
        features = runtime.strategy.experimental_local_results(next(iterator)[0])[0].numpy()
        steps.append([ids[row.tobytes()] for row in features])
    return steps


files, share = split.share(runtime.worker_index, runtime.workers)
found = {
    "worker": runtime.worker_index, "workers": runtime.workers, "files": len(split.files),
    "share": share, "passes": passes, "examples": len(split),
    "seen": read(0, 2 * passes), "resumed": read(5, 2 * passes),
}  # fmt: skip
with open(sys.argv[1], "w") as output:
    json.dump(found, output)
