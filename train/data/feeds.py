"""Batches for the training step and for evaluation, in an order that is a pure function of (SEED, step).

A resumed run reads exactly the batches an uninterrupted one would; replicas and workers take disjoint slices:

- in memory: pass p over the split is the permutation stateless_shuffle(range(N), seed=(SEED, p));
- streamed: pass p reads the files in one fixed shuffled order through a shuffle buffer seeded by (SEED, p).

A feed, chosen once by `adapter`, hands batches to the training step. On one host's CPU devices every input of a
call is a tensor: the step gathers its rows from the split in memory itself (`RowsFeed`), or takes its batch from
a block of the call's batches that tf.data read ahead from the streamed files (`BlocksFeed`). On GPUs and across
workers a tf.data pipeline per worker prefetches each step's batch (`PipelineFeed`). The model gets what is
stored; scaling and augmentation are its layers.

The general path (MODEL's `preprocess`, or a dict of columns: train.data.examples) follows the same plans over the
stored records, decoding and preparing each example after the plan has placed and skipped it (`_prepared`); it is
always fed by a tf.data pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import tensorflow as tf

from train.data.examples import EVAL_PASS, Inputs
from train.data.source import Remainder, SerializedSplit, Split, StreamedSplit, TrainSplit
from train.data.spec import DatasetSpec
from train.errors import SettingsError

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]  # an input pipeline's batches, given its place
GATHER_BATCHES = 32  # training batches gathered by one op in the in-memory tf.data pipeline


def batches_per_pass(split: TrainSplit, global_batch: int, pipelines: int = 1) -> int:
    """Whole global batches in one pass over the split (the remainder waits for the next pass). A streamed split
    read by several `pipelines`, each its own share, makes as many as its smallest share does."""
    if isinstance(split, StreamedSplit):
        batches = split.pass_batches(global_batch // pipelines, pipelines)
    else:
        batches = len(split) // global_batch
    if batches == 0:
        raise SettingsError(
            f"TRAIN_SPLIT has {len(split)} examples, fewer than one global batch of {global_batch}: lower BATCH_SIZE"
        )
    return batches


def pass_order(examples: int, seed: int, pass_number: int | tf.Tensor) -> tf.Tensor:
    """The order of an in-memory split's examples in pass `pass_number`: the same in a graph and eagerly."""
    seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(pass_number, tf.int64)])
    return tf.random.experimental.stateless_shuffle(tf.range(examples, dtype=tf.int64), seed=seeds)


def _no_copy(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """A pipeline that reads an in-memory split's tensors without copying them: tf.data's default graph
    optimisations serialise the pipeline, captured tensors and all (a whole extra copy of the split)."""
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    return dataset.with_options(options)


def _local_replicas(replicas: int, context: tf.distribute.InputContext) -> tuple[int, int]:
    """(how many, the first) of the replicas one input pipeline feeds: all of a worker's, or one (PER_REPLICA)."""
    local = replicas // context.num_input_pipelines
    return local, context.input_pipeline_id * local


def train_dataset(
    strategy: tf.distribute.Strategy,
    split: TrainSplit,
    global_batch: int,
    seed: int,
    start_step: int,
    device_prefetch: int = 1,
    remainder: Remainder | None = None,
) -> tf.data.Dataset | tf.distribute.DistributedDataset:
    """Per-replica training batches from `start_step` on, forever, as a distributed tf.data dataset.

    The k-th global batch of a pass is cut into per-replica slices, replica r taking slice r. A restart at
    step s rebuilds the plan and skips s batches: of indices in memory; of examples read, when streaming.
    `remainder` (streamed): the rest of the pass a run resumed in at another worker count comes first, then
    the plan from `start_step` on.
    """
    dataset_fn = _dataset_fn(adapter(strategy, split), global_batch, seed, start_step, remainder)
    return distribute(strategy, dataset_fn, device_prefetch, per_replica=not isinstance(split, StreamedSplit))


def _dataset_fn(
    feeding: Adapter, global_batch: int, seed: int, start_step: int, remainder: Remainder | None = None
) -> DatasetFn:
    """`train_dataset`'s dataset_fn: an input pipeline's batches, given its tf.distribute.InputContext."""
    split, replicas = feeding.split, feeding.strategy.num_replicas_in_sync
    if isinstance(split, StreamedSplit):
        return _streamed(feeding, global_batch, seed, start_step, remainder)
    pass_batches = feeding.pass_batches(global_batch)
    first_pass, offset = divmod(start_step, pass_batches)
    per_replica = global_batch // replicas

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local, first_replica = _local_replicas(replicas, context)

        def pass_rows(pass_number: tf.Tensor) -> tf.data.Dataset:
            order = pass_order(len(split), seed, pass_number)
            plan = tf.reshape(order[: pass_batches * global_batch], [pass_batches, replicas, per_replica])
            ours = tf.reshape(plan[:, first_replica : first_replica + local, :], [pass_batches * local, per_replica])
            return tf.data.Dataset.from_tensor_slices((ours, tf.fill([pass_batches * local], pass_number)))

        # Each element: one replica's batch of row numbers and its pass. A restart skips row numbers, nothing read.
        rows = tf.data.Dataset.range(first_pass, np.iinfo(np.int64).max).flat_map(pass_rows).skip(offset * local)
        if isinstance(split, SerializedSplit):
            records = rows.map(
                lambda index, number: (tf.gather(split.records, index), index, tf.fill(tf.shape(index), number))
            )
            return _prepared(split.spec, records, per_replica, in_memory=True)
        features, labels = split.tensors
        # One gather per GATHER_BATCHES batches, then handed out one by one: tf.data's cost is per element.
        blocks = rows.batch(GATHER_BATCHES).map(
            lambda index, _: (tf.gather(features, index), tf.gather(labels, index)),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        return _no_copy(blocks.unbatch().prefetch(tf.data.AUTOTUNE))

    return dataset_fn


def _prepared(spec: DatasetSpec, batches: tf.data.Dataset, per_replica: int, in_memory: bool) -> tf.data.Dataset:
    """The general path: batches of (stored records, positions, passes), already in their order and already
    skipped to the resumed step, made into batches of `preprocess`'s (inputs, label), `per_replica` examples
    each. Decoding and `preprocess` run one example at a time, in parallel, in order."""
    examples = batches.unbatch().map(
        lambda record, position, number: spec.examples.prepare(record, position, number, training=True),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    batched = examples.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    # In memory, no graph rewrites (they would copy the records); streamed, tf.data's own (map and batch fused)
    return _no_copy(batched) if in_memory else batched


def _streamed(
    feeding: Adapter, global_batch: int, seed: int, start_step: int, remainder: Remainder | None
) -> DatasetFn:
    """The dataset_fn of a streamed split: each input pipeline reads only its share of the files (or, with fewer
    files than pipelines, of the records), in shuffled windows, and makes its replicas' batches from it.

    So every example is read once per pass across all pipelines, in a new order each pass, and a restart
    with as many pipelines reads exactly the same batches; the order is not one worker's order (each pipeline
    shuffles its own share).
    """
    split, replicas = feeding.split, feeding.strategy.num_replicas_in_sync
    pass_batches, per_replica = feeding.pass_batches(global_batch), global_batch // replicas
    first_pass, offset = divmod(start_step, pass_batches)
    feature_shape, label_shape = list(split.spec.feature_shape), list(split.spec.label_shape)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local, _ = _local_replicas(replicas, context)
        count, index = context.num_input_pipelines, context.input_pipeline_id
        local_batch = local * per_replica

        def one_pass(pass_number: tf.Tensor, mine: tf.Tensor | None = None, length: int = pass_batches):
            batches = split.batches(index, count, seed, pass_number, local_batch, mine=mine).take(length)
            if split.spec.records:  # (records, positions) and the pass, for each example's seed
                return batches.map(lambda records, positions: (records, positions, tf.fill([local_batch], pass_number)))
            return batches

        def per_replica_batches(features: tf.Tensor, labels: tf.Tensor):  # after batching: one vectorised op a batch
            return (
                tf.reshape(features, [local, per_replica, *feature_shape]),
                tf.reshape(labels, [local, per_replica, *label_shape]),
            )

        batches = tf.data.Dataset.range(first_pass, np.iinfo(np.int64).max).flat_map(one_pass).skip(offset)
        if remainder is not None:  # what this pipeline reads of the pass the run resumed in, then the plan
            mine = tf.constant(remainder.marks[index])
            rest = one_pass(tf.constant(remainder.pass_number, tf.int64), mine, remainder.length)
            batches = rest.skip(remainder.done).concatenate(batches)
        if split.spec.records:  # skipped as records: a resume decodes none of what it skips
            return _prepared(split.spec, batches, per_replica, in_memory=False)
        if local > 1:  # one replica's batch is the pipeline's batch already: no split, no per-batch work
            batches = batches.map(per_replica_batches, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            batches = batches.unbatch()
        return batches.prefetch(tf.data.AUTOTUNE)

    return dataset_fn


def _blocks(dataset_fn: DatasetFn, replicas: int, longest: int) -> tf.data.Dataset:
    """The batches `train_dataset` gives one host's CPU replicas from a streamed split (one input pipeline for the
    host, its per-replica batches in replica order), `longest` steps to an element: [longest, replicas,
    per_replica, ...], replica r's batch in slice r."""
    steps = dataset_fn(tf.distribute.InputContext(1, 0, replicas)).batch(replicas, drop_remainder=True)
    return steps.batch(longest, drop_remainder=True).prefetch(1)


def distribute(
    strategy: tf.distribute.Strategy, dataset_fn: DatasetFn, device_prefetch: int = 1, per_replica: bool = True
) -> tf.data.Dataset | tf.distribute.DistributedDataset:
    """The per-replica datasets as `strategy.run` takes them. On GPUs, tf.distribute's default: one input pipeline
    per worker, prefetched to every GPU (DEVICE_PREFETCH batches ahead: its per-replica buffer). On CPU devices that
    MultiDeviceIterator costs more per step than a small model's step itself, so each replica gets a plain tf.data
    iterator on the host: one replica takes the dataset as it is, several take one pipeline each (PER_REPLICA)
    without a copy to the device they already share. `per_replica=False` (a streamed split: `Adapter.pipelines`):
    one pipeline for the host's CPU devices, as on GPUs, without the copy."""
    if _on_gpus(strategy):
        options = tf.distribute.InputOptions(experimental_per_replica_buffer_size=device_prefetch)
        return strategy.distribute_datasets_from_function(dataset_fn, options)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return strategy.distribute_datasets_from_function(dataset_fn)
    if strategy.num_replicas_in_sync == 1:
        return dataset_fn(tf.distribute.InputContext())
    if not per_replica:
        return strategy.distribute_datasets_from_function(
            dataset_fn, tf.distribute.InputOptions(experimental_fetch_to_device=False)
        )
    options = tf.distribute.InputOptions(
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
    )
    return strategy.distribute_datasets_from_function(dataset_fn, options)


def _on_gpus(strategy: tf.distribute.Strategy) -> bool:
    return any("GPU" in device.upper() for device in strategy.extended.worker_devices)


class Feed(Protocol):
    """What the training call asks of its input (train.step), and all it asks.

    A call of `steps` steps is one `tf.function` run: `call_args(steps)` is what it is handed (tensors, or an
    iterator), and moves the feed on by `steps`; inside it, step `step` (from 0) of the call takes
    `step_args(call_args, step)`, which `strategy.run` hands each replica, and the replica's
    `replica_batch(*those)` is its (features, labels). `compilable`: every input of the call is a tensor, so XLA
    can compile the whole call (else only the replica step). `adapter` picks one of the three, once:

    | feed           | where                              | a call is handed                      |
    |----------------|------------------------------------|---------------------------------------|
    | `RowsFeed`     | one host's CPUs, a split in memory | the split and a window of row numbers |
    | `BlocksFeed`   | one host's CPUs, a streamed split  | two blocks of read-ahead batches      |
    | `PipelineFeed` | GPUs, workers, the general path    | a tf.data iterator, one next() a step |
    """

    compilable: bool

    def call_args(self, steps: int) -> tuple[object, ...]: ...  # tensors or an iterator: handed back to step_args

    def step_args(self, call_args: tuple[object, ...], step: tf.Tensor) -> tuple[object, ...]: ...

    def replica_batch(self, *args: tf.Tensor) -> tuple[Inputs, tf.Tensor]: ...


class RowsFeed:
    """An in-memory split on CPU devices: no tf.data in the loop. The step gathers its own rows.

    The host plans whole passes (`pass_order`, as [batches, replicas, per_replica] row numbers). A call takes
    a window of the passes it can reach, the same tensor for every call that starts in the same pass and of
    one shape (so the step is traced once), and the index of its first step in it; every step of the call
    gathers its replica's batch from the split inside the compiled function. A tf.data iterator read once per
    step cost more than a small model's step itself, and so did planning each call's rows on the host
    (docs/performance.md).
    """

    compilable = True  # everything the step reads is a tensor: XLA can compile the whole call

    def __init__(self, split: Split, replicas: int, global_batch: int, seed: int, start_step: int, longest: int):
        self.pass_batches = batches_per_pass(split, global_batch)
        self.shape = (replicas, global_batch // replicas)
        self.seed, self.step, self.longest, self.examples = seed, start_step, longest, len(split)
        # The passes a call of up to `longest` steps can touch, from any step of its first pass.
        self.passes_per_window = -(-(self.pass_batches - 1 + longest) // self.pass_batches)
        # int32 row numbers where they fit: the XLA-compiled call ran faster than with int64 (docs/performance.md).
        self.index_type = np.int32 if len(split) <= np.iinfo(np.int32).max else np.int64
        self.features, self.labels = split.tensors
        self._plans: dict[int, np.ndarray] = {}
        self._window_pass: int | None = None
        self._window: tf.Tensor | None = None

    def _pass_plan(self, pass_number: int) -> np.ndarray:
        plan = self._plans.get(pass_number)
        if plan is None:
            order = pass_order(self.examples, self.seed, pass_number).numpy()
            whole = self.pass_batches * self.shape[0] * self.shape[1]
            plan = order[:whole].astype(self.index_type).reshape(self.pass_batches, *self.shape)
        return plan

    def call_args(self, steps: int) -> tuple[tf.Tensor, ...]:
        """The next `steps` steps' input (at most `longest`); moves on by `steps`."""
        if not 0 < steps <= self.longest:
            raise ValueError(f"a call of {steps} steps: RowsFeed plans calls of 1 to {self.longest} steps")
        first_pass, first_batch = divmod(self.step, self.pass_batches)
        if first_pass != self._window_pass:  # once a pass: the next window, reusing the plans it shares
            passes = range(first_pass, first_pass + self.passes_per_window)
            self._plans = {number: self._pass_plan(number) for number in passes}
            with tf.device("/cpu:0"):
                self._window = tf.constant(np.concatenate([self._plans[number] for number in passes]))
            self._window_pass = first_pass
        self.step += steps
        return self.features, self.labels, self._window, tf.constant(first_batch, tf.int32)

    @staticmethod
    def step_args(call_args: tuple[tf.Tensor, ...], step: tf.Tensor) -> tuple[tf.Tensor, ...]:
        features, labels, window, first_batch = call_args
        # tf.gather, not window[first_batch + step]: XLA takes a slice's start as a compile-time constant
        # where it can, and compiled the call anew for every value of first_batch.
        return features, labels, tf.gather(window, first_batch + step)

    @staticmethod
    def replica_batch(features: tf.Tensor, labels: tf.Tensor, rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        ours = rows[tf.distribute.get_replica_context().replica_id_in_sync_group]
        return tf.gather(features, ours), tf.gather(labels, ours)


class BlocksFeed:
    """A streamed split on one host's CPU devices: each call is handed the block of `longest` steps' batches
    its steps start in and the block they run into (the same one again if they end inside it), read ahead
    by tf.data; each step gathers its batch from them.

    One `next()` a call, not a step: a tf.data iterator read once per step cost more than a small model's
    step itself (rows 2 and 2b of docs/performance.md). Every input of the call is a tensor, so XLA can
    compile it whole, as with `RowsFeed`. The batches are `train_dataset`'s, in its order. Held at most:
    about four blocks (two handed to a call, one read ahead, one being made), each `longest` global batches.
    """

    compilable = True

    def __init__(self, blocks: tf.data.Dataset, longest: int) -> None:
        self.blocks, self.longest = iter(blocks), longest
        self.current: tuple[tf.Tensor, tf.Tensor] | None = None  # read at the first call, inside the loop
        self.cursor = 0  # the first batch of `current` not yet trained on

    def call_args(self, steps: int) -> tuple[tf.Tensor, ...]:
        """The next `steps` steps' input (at most `longest`); moves on by `steps`. A block is read when a call
        first needs it, not before."""
        if not 0 < steps <= self.longest:
            raise ValueError(f"a call of {steps} steps: BlocksFeed hands calls of 1 to {self.longest} steps")
        if self.current is None or self.cursor == self.longest:  # the first call, or the last one used up its block
            self.current, self.cursor = next(self.blocks), 0
        first, start = self.current, self.cursor
        self.cursor += steps
        if self.cursor > self.longest:  # the call runs into the next block
            self.current, self.cursor = next(self.blocks), self.cursor - self.longest
        return (*first, *self.current, tf.constant(start, tf.int32))

    def step_args(self, call_args: tuple[tf.Tensor, ...], step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        features, labels, next_features, next_labels, start = call_args
        index = start + step
        # tf.gather, not a slice: XLA compiled the call anew for every slice start it could see (RowsFeed)
        return tf.cond(
            index < self.longest,
            lambda: (tf.gather(features, index), tf.gather(labels, index)),
            lambda: (tf.gather(next_features, index - self.longest), tf.gather(next_labels, index - self.longest)),
        )

    @staticmethod
    def replica_batch(features: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.gather(features, replica), tf.gather(labels, replica)


class PipelineFeed:
    """A distributed tf.data dataset: one `next()` per step, inside the call."""

    compilable = False  # XLA cannot compile an iterator's get_next: only the replica step is compiled

    def __init__(self, distributed: tf.data.Dataset | tf.distribute.DistributedDataset) -> None:
        self.iterator = iter(distributed)

    def call_args(self, steps: int) -> tuple[object, ...]:
        del steps  # the iterator moves on by itself
        return (self.iterator,)

    @staticmethod
    def step_args(call_args: tuple[Iterator, ...], step: tf.Tensor) -> tuple[Inputs, tf.Tensor]:
        del step
        return next(call_args[0])

    @staticmethod
    def replica_batch(features: Inputs, labels: tf.Tensor) -> tuple[Inputs, tf.Tensor]:
        return features, labels


_HOW = {"rows": "gathered inside the step", "blocks": "read ahead a call at a time", "pipelines": "fed by tf.data"}


@dataclass(frozen=True)
class Adapter:
    """How a training split feeds the step on `strategy`, chosen once by `adapter` (as Keras's `get_data_adapter`
    chooses): the start, the resume's segment and fit's feed ask this one object. Its `kind` names its feed (`Feed`'s
    table): `rows` (`RowsFeed`), `blocks` (`BlocksFeed`) or `pipelines` (`PipelineFeed`). A streamed split is read
    by one input pipeline per worker (each its worker's share: the order is the worker's, whatever its devices), as
    is any split on GPUs or across workers; a split in memory on a host's CPU devices by one per replica."""

    strategy: tf.distribute.Strategy
    split: TrainSplit
    kind: str  # "rows", "blocks" or "pipelines"
    pipelines: int  # input pipelines feeding the replicas (train.data.feeds.distribute)

    @property
    def whole_call(self) -> bool:
        """Whether every input of a call is a tensor, the step gathering its batch from them: XLA can compile the
        whole call (else only the replica step)."""
        return self.kind != "pipelines"

    def pass_batches(self, global_batch: int) -> int:
        """Whole global batches in one pass over the split (`batches_per_pass`, for this many pipelines)."""
        return batches_per_pass(self.split, global_batch, pipelines=self.pipelines)

    def train_feed(
        self,
        global_batch: int,
        seed: int,
        start_step: int,
        longest: int,
        device_prefetch: int = 1,
        remainder: Remainder | None = None,
    ) -> Feed:
        """The training feed from `start_step` on. `longest`: the most steps a call takes (what the CPU feeds plan
        ahead for); `device_prefetch`: DEVICE_PREFETCH; `remainder`: see `train_dataset`."""
        strategy, split, replicas = self.strategy, self.split, self.strategy.num_replicas_in_sync
        if self.kind == "rows":
            return RowsFeed(split, replicas, global_batch, seed, start_step, longest)
        if self.kind == "blocks":
            blocks = _blocks(_dataset_fn(self, global_batch, seed, start_step, remainder), replicas, longest)
            return BlocksFeed(blocks, longest)
        return PipelineFeed(train_dataset(strategy, split, global_batch, seed, start_step, device_prefetch, remainder))

    def describe(self) -> str:
        """How the batches reach the step, in a few words: what `fit` says as it starts."""
        return _HOW[self.kind]


def adapter(strategy: tf.distribute.Strategy, split: TrainSplit) -> Adapter:
    """The one choice of how `split` (the training split) feeds the step on `strategy` (see `Adapter`)."""
    streamed = isinstance(split, StreamedSplit)
    records = isinstance(split, SerializedSplit) or (streamed and split.spec.records)
    pipelined = _on_gpus(strategy) or isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    kind = "pipelines" if pipelined or records else "blocks" if streamed else "rows"
    workers = strategy.num_replicas_in_sync // len(strategy.extended.worker_devices)
    return Adapter(strategy, split, kind, workers if streamed or pipelined else strategy.num_replicas_in_sync)


def eval_steps(split: TrainSplit, global_batch: int) -> int:
    """Global batches that cover the split once (the last one partial)."""
    return -(-len(split) // global_batch)


def _share(rows: tf.Tensor, replica: int | tf.Tensor, replicas: int) -> tuple[tf.Tensor, tf.Tensor]:
    """[start, end) of a batch of `rows` rows that replica `replica` evaluates: the rows split as evenly as they
    go (a partial last batch leaves some replicas fewer rows, or none)."""
    rows = tf.cast(rows, tf.int64)
    return replica * rows // replicas, (replica + 1) * rows // replicas


def eval_dataset(
    strategy: tf.distribute.Strategy, split: TrainSplit, global_batch: int
) -> tuple[tf.data.Dataset | tf.distribute.DistributedDataset, int]:
    """Every example of the split exactly once, in order, cut into `eval_steps` global batches, each split over
    every replica of every worker: so any number of replicas reports exactly what one device would, and every
    replica runs the same number of steps (no collective waits on a replica that ran out)."""
    replicas = strategy.num_replicas_in_sync
    steps = eval_steps(split, global_batch)
    examples = len(split)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local, first_replica = _local_replicas(replicas, context)
        if isinstance(split, Split):
            features, labels = split.tensors

            def rows(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                base = index // local * global_batch
                start, end = _share(
                    tf.minimum(tf.constant(global_batch, tf.int64), examples - base),
                    first_replica + index % local,
                    replicas,
                )
                return features[base + start : base + end], labels[base + start : base + end]

            return _no_copy(tf.data.Dataset.range(steps * local).map(rows).prefetch(tf.data.AUTOTUNE))

        def ours(features: Inputs, labels: tf.Tensor) -> tf.data.Dataset:
            def rows(replica: tf.Tensor) -> tuple[Inputs, tf.Tensor]:
                start, end = _share(tf.shape(labels, tf.int64)[0], replica, replicas)
                return tf.nest.map_structure(lambda tensor: tensor[start:end], (features, labels))

            return tf.data.Dataset.range(first_replica, first_replica + local).map(rows)

        if split.spec.records:  # preprocess(training=False) on each example, in order
            prepared = split.ordered_records().map(
                lambda record, position: split.spec.examples.prepare(record, position, EVAL_PASS, training=False),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
            batches = _no_copy(prepared.batch(global_batch))
        else:
            batches = split.read(shuffle_files=False).batch(global_batch)
        return batches.flat_map(ours).prefetch(tf.data.AUTOTUNE)

    return distribute(strategy, dataset_fn), steps
