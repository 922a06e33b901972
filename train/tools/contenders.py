"""The ways of training that `bench` measures against each other, each built from the engine's public parts.

A contender trains a fresh copy of the same model (`train.model.build`) on the same data and measures how many
examples a second it takes. The template's own contender is what `fit` runs: its feed (`adapter`), its
training calls (`make_calls`) in the lengths `fit` cuts them (`call_steps`), XLA as `fit` decides it. The
ceilings feed the same training calls batches that cost nothing to make (through the engine's `Feed` seam), so
the gap to them is what the input costs; Keras `model.fit` trains the same model as Keras would.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf

from train.context import Context
from train.data.feeds import BlocksFeed, PipelineFeed, adapter, distribute
from train.data.source import Data, Split
from train.devices.runtime import Runtime, choose_xla
from train.errors import TrainingError, first_line
from train.loop import call_steps, longest_call
from train.model import build
from train.model_file import Experiment
from train.settings import Settings
from train.start import run_context, steps_per_epoch
from train.step import make_calls

if TYPE_CHECKING:
    import tensorflow_datasets as tfds

    from train.data.examples import Inputs
    from train.data.feeds import Feed
    from train.data.source import TrainSplit
    from train.model import Built

TUTORIAL_BATCH = 32  # Keras fit's default batch_size
Say = Callable[[str], None]


@dataclass
class Contender:
    """One way of training. `measure(seconds)` trains for about that long and returns (examples, seconds)."""

    name: str
    measure: Callable[[float], tuple[int, float]]
    batch: int  # global batch
    strategy: str
    note: str
    crashed: list[str] = field(default_factory=list)


def template_xla(settings: Settings, runtime: Runtime, built: Built, data: Data) -> tuple[bool, str]:
    """XLA as `fit` decides it for this model on these devices."""
    whole_call = adapter(runtime.strategy, data.train).whole_call
    return choose_xla(settings.jit_compile, runtime, whole_call, built.convolutional, built.layer_without_xla())


def loop_contender(
    name: str,
    settings: Settings,
    experiment: Experiment,
    runtime: Runtime,
    data: Data,
    feed_for: Callable[[], Feed] | None = None,
) -> Contender:
    """The training loop as `fit` runs it: calls as long as `fit` makes them (STEPS_PER_CALL, cut at epoch ends,
    CHECKPOINT_EVERY and LOG_EVERY), each returning the metrics (which waits for the call). `feed_for(built,
    longest)` gives another feed than the template's own (a ceiling)."""
    per_epoch, global_batch = steps_per_epoch(settings, data, runtime), runtime.global_batch
    built = build(settings, experiment, data.spec, runtime.strategy, run_context(settings, runtime, data, per_epoch))
    jit, _ = template_xla(settings, runtime, built, data)
    longest = longest_call(settings, per_epoch)
    feeding = adapter(runtime.strategy, data.train)
    if feed_for is None:
        feed = feeding.train_feed(global_batch, settings.seed, 0, longest, settings.device_prefetch)
    else:
        feed = feed_for()
    jit = jit and (feed.compilable or not feeding.whole_call)
    calls = make_calls(built, runtime.strategy, feed, global_batch, jit, runtime.accumulation)
    step = 0  # goes on from one measurement to the next, as a run's step does

    def measure(seconds: float) -> tuple[int, float]:
        nonlocal step
        examples, started = 0, time.perf_counter()
        while True:
            steps = call_steps(settings, step, per_epoch, sys.maxsize)
            calls(steps)
            examples, step = examples + steps * global_batch, step + steps
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                return examples, elapsed

    note = f"STEPS_PER_CALL={settings.steps_per_call}, XLA {'on' if jit else 'off'}"
    if runtime.accumulation > 1:
        note += f", {runtime.accumulation} micro-batches of {runtime.per_replica_batch} a step"
    return Contender(name, measure, global_batch, runtime.strategy_name, note)


def accumulating(runtime: Runtime, accumulation: int) -> Runtime:
    """The runtime at the same micro-batch, each step accumulating `accumulation` of them (a larger global batch)."""
    return dataclasses.replace(runtime, accumulation=accumulation)


def _first_rows(data: Data, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` training examples as NumPy arrays, in memory or read from the stream."""
    if isinstance(data.train, Split):
        return data.train.features[:count], data.train.labels[:count]
    batch = next(iter(data.train.read(shuffle_files=False).batch(count)))
    return batch[0].numpy(), batch[1].numpy()


class SameBatchFeed:
    """No input at all: every step of every call trains on the same batch, handed over once. Replica r gets
    rows [r x per_replica, (r + 1) x per_replica) of the train split; the step only slices its part."""

    compilable = True

    def __init__(self, runtime: Runtime, data: Data) -> None:
        shape = (runtime.replicas, runtime.per_replica_batch)
        features, labels = _first_rows(data, runtime.global_batch)
        self.batch = (
            tf.constant(features.reshape(*shape, *features.shape[1:])),
            tf.constant(labels.reshape(*shape, *labels.shape[1:])),
        )

    def call_args(self, steps: int) -> tuple[tf.Tensor, tf.Tensor]:
        return self.batch

    @staticmethod
    def step_args(call_args: tuple[tf.Tensor, tf.Tensor], step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return call_args

    @staticmethod
    def replica_batch(features: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return features[replica], labels[replica]


class LaidOutBatchesFeed(SameBatchFeed):
    """A new batch every step with no input work: a call's batches, taken in order from the split and laid out
    one after another in memory, handed over once; step k of a call slices batch k."""

    def __init__(self, runtime: Runtime, data: Data, longest: int) -> None:
        count = longest * runtime.global_batch
        features, labels = _first_rows(data, count)
        if len(labels) < count:  # a split shorter than one call: its rows again, in order
            rows = np.resize(np.arange(len(labels)), count)
            features, labels = features[rows], labels[rows]
        shape = (longest, runtime.replicas, runtime.per_replica_batch)
        self.batch = (
            tf.constant(features.reshape(*shape, *features.shape[1:])),
            tf.constant(labels.reshape(*shape, *labels.shape[1:])),
        )

    @staticmethod
    def step_args(call_args: tuple[tf.Tensor, tf.Tensor], step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        features, labels = call_args
        return features[step], labels[step]


def laid_out_bytes(runtime: Runtime, data: Data, longest: int) -> int:
    """What the laid-out ceiling holds: one call's batches as stored."""
    return longest * runtime.global_batch * data.spec.example_bytes


def same_batch_dataset_feed(runtime: Runtime, data: Data) -> PipelineFeed:
    """One per-replica batch repeated through tf.data, distributed as the template's pipeline is: the iterator's
    own cost, without the pipeline's work."""
    per_replica = runtime.per_replica_batch
    features, labels = _first_rows(data, runtime.global_batch)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        start = context.input_pipeline_id * (runtime.replicas // context.num_input_pipelines) * per_replica
        return tf.data.Dataset.from_tensors(
            (features[start : start + per_replica], labels[start : start + per_replica])
        ).repeat()

    return PipelineFeed(distribute(runtime.strategy, dataset_fn))


# --- Keras model.fit ------------------------------------------------------------------------------------------


def keras_pipeline(data: Data, global_batch: int) -> tf.data.Dataset:
    """The tuned tf.data pipeline for `model.fit`: indices reshuffled every pass, batched, then one gather."""
    features, labels = data.train.tensors
    indices = tf.data.Dataset.range(len(data.train)).shuffle(len(data.train), reshuffle_each_iteration=True)
    batches = indices.batch(global_batch, drop_remainder=True).repeat()
    batches = batches.map(lambda index: (tf.gather(features, index), tf.gather(labels, index)), tf.data.AUTOTUNE)
    return batches.prefetch(tf.data.AUTOTUNE)


def _clock(seconds: float) -> keras.callbacks.Callback:
    """Times `model.fit` from the end of its first execution on, and stops it after `seconds`.

    The first execution of every `fit` call makes that call's iterator: a cost of measuring in slices, which
    one long `fit` pays once, so it is left out, in Keras's favour.
    """

    class Clock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.started: float | None = None
            self.ended: float | None = None
            self.first_step = self.last_step = 0

        def _step(self) -> int:
            return int(self.model.optimizer.iterations.numpy())

        def on_train_batch_end(
            self, batch: int, logs: dict | None = None
        ) -> None:  # synchronous: fit waited for the execution
            now = time.perf_counter()
            if self.started is None:
                self.started, self.first_step = now, self._step()
            elif now - self.started >= seconds:
                self.ended, self.last_step = now, self._step()
                self.model.stop_training = True

    return Clock()


def keras_contender(
    name: str,
    settings: Settings,
    experiment: Experiment,
    strategy: Any,
    strategy_name: str,
    data: Data,
    tutorial: bool,
    global_batch: int,
    steps_per_execution: int = 1,
    jit_compile: bool | None = None,
    context: Context | None = None,
) -> Contender:
    """The same model (as exported: input, scaling, the fork's model) trained by `model.fit`, compiled as
    build_model compiled it; `tutorial`: numpy arrays at fit's default batch, else with these settings."""
    built = build(settings, experiment, data.spec, strategy, context)
    model = built.serving
    with strategy.scope():
        config = built.network.get_compile_config()
        if not tutorial:
            config.update(steps_per_execution=steps_per_execution, jit_compile=jit_compile)
        model.compile_from_config(config)
    batch = TUTORIAL_BATCH if tutorial else global_batch
    dataset = None if tutorial else keras_pipeline(data, batch)

    def measure(seconds: float) -> tuple[int, float]:
        clock = _clock(seconds)
        with strategy.scope():
            if tutorial:  # arrays, default batch size, shuffled every epoch
                model.fit(data.train.features, data.train.labels, epochs=10**6, verbose=0, callbacks=[clock])
            else:
                model.fit(dataset, epochs=1, steps_per_epoch=10**9, shuffle=False, verbose=0, callbacks=[clock])
        if clock.ended is None or clock.started is None:
            raise TrainingError("model.fit stopped before the measurement ended")
        return (clock.last_step - clock.first_step) * batch, clock.ended - clock.started

    note = f"steps_per_execution={model.steps_per_execution}, jit_compile={model.jit_compile}"
    return Contender(name, measure, batch, strategy_name, note)


def best_keras_fit(
    settings: Settings, experiment: Experiment, runtime: Runtime, data: Data, trial_seconds: float, say: Say
) -> Contender:
    """Keras fit at its best here: the largest steps_per_execution that runs, XLA on or off, whichever is faster.

    A setting that crashes under the runtime's strategy is said and skipped; one device only if none runs.
    """
    strategies = [(runtime.strategy, runtime.strategy_name)]
    context = run_context(settings, runtime, data, steps_per_epoch(settings, data, runtime))
    if runtime.replicas > 1:
        strategies.append((tf.distribute.OneDeviceStrategy(runtime.devices[0]), "one_device"))
    crashed: list[str] = []
    for strategy, strategy_name in strategies:
        for steps_per_execution in sorted({settings.steps_per_call, 1}, reverse=True):
            ran: list[tuple[float, Contender]] = []
            for jit in (True, False):
                tried = f"{strategy_name}, steps_per_execution={steps_per_execution}, jit_compile={jit}"
                try:
                    contender = keras_contender(
                        "keras_fit",
                        settings,
                        experiment,
                        strategy,
                        strategy_name,
                        data,
                        False,
                        runtime.global_batch,
                        steps_per_execution,
                        jit,
                        context,
                    )
                    contender.measure(min(0.2, trial_seconds))  # traces
                    examples, seconds = contender.measure(trial_seconds)
                except Exception as error:  # what crashes under MirroredStrategy varies: say it, try the next
                    crashed.append(f"{tried}: {type(error).__name__}: {first_line(error, 160)}")
                    say(f"  keras_fit trial: {crashed[-1]}")
                    continue
                ran.append((examples / seconds, contender))
                say(f"  keras_fit trial: {tried}: {examples / seconds:,.0f} examples/s")
            if ran:
                contender = max(ran, key=lambda pair: pair[0])[1]
                contender.crashed = crashed
                return contender
    raise TrainingError("Keras model.fit crashed with every setting: " + "; ".join(crashed))


# --- streamed splits -------------------------------------------------------------------------------------------


def streamed(settings: Settings, experiment: Experiment) -> Data:
    """The same splits, streamed from the prepared TFDS files as DATA_IN_MEMORY=false reads them."""
    from train.data import open_dataset

    return open_dataset(settings, experiment).load(settings, in_memory=False)


def _tuned_read(
    split: TrainSplit, seed: int, decoders: dict[str, tfds.decode.Decoder] | None = None
) -> tf.data.Dataset:
    """The split's examples as TFDS reads them at its best: files interleaved and decoded in parallel, in one
    order drawn from `seed`, deterministic. try_autocache=False: with a shuffle seed TFDS caches a small split,
    decoded, in memory after its first pass (docs/performance.md): that would be in memory, not streamed."""
    import tensorflow_datasets as tfds

    options = tf.data.Options()
    options.deterministic = True
    read_config = tfds.ReadConfig(
        shuffle_seed=seed,
        interleave_cycle_length=16,
        num_parallel_calls_for_interleave_files=tf.data.AUTOTUNE,
        num_parallel_calls_for_decode=tf.data.AUTOTUNE,
        options=options,
        try_autocache=False,
    )
    return split.builder.as_dataset(split=split.split, shuffle_files=True, read_config=read_config, decoders=decoders)


def tuned_tfdata_feed(runtime: Runtime, data: Data, seed: int) -> PipelineFeed:
    """The same TFDS files read the way a tuned tf.data pipeline reads them: TFDS's interleaved file reads and
    parallel decoding, a shuffle buffer, batching, a vectorised map after batching, AUTOTUNE, prefetch; seeded
    and deterministic like the template's, and read from the files every pass, so the two compare like for
    like."""

    split, replicas, per_replica = data.train, runtime.replicas, runtime.per_replica_batch
    if split.spec.records:
        return _tuned_preprocess_feed(runtime, split, seed)
    feature_shape, label_shape = list(split.spec.feature_shape), list(split.spec.label_shape)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines
        examples = _tuned_read(split, seed)
        examples = examples.map(split.spec.pair, num_parallel_calls=tf.data.AUTOTUNE)
        examples = examples.shard(context.num_input_pipelines, context.input_pipeline_id)
        batches = examples.shuffle(split.shuffle_buffer, seed=seed).repeat()
        batches = batches.batch(local * per_replica, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE)

        def per_replica_batches(
            features: tf.Tensor, labels: tf.Tensor
        ) -> tuple[tf.Tensor, tf.Tensor]:  # vectorised, after batching
            return (
                tf.reshape(features, [local, per_replica, *feature_shape]),
                tf.reshape(labels, [local, per_replica, *label_shape]),
            )

        batches = batches.map(per_replica_batches, num_parallel_calls=tf.data.AUTOTUNE)
        return batches.unbatch().prefetch(tf.data.AUTOTUNE)

    return PipelineFeed(distribute(runtime.strategy, dataset_fn, per_replica=False))  # streamed: one per worker


def _tuned_preprocess_feed(runtime: Runtime, split: TrainSplit, seed: int) -> PipelineFeed:
    """The general path's tuned tf.data pipeline (flax's imagenet input_pipeline): TFDS reads the files
    interleaved, images undecoded (SkipDecoding), shuffles the bytes, then decodes and runs the same
    `preprocess` per example in a parallel, deterministic map, batches and prefetches; each example's seed from
    its place in the stream."""
    import tensorflow_datasets as tfds

    from train.data.examples import example_seed

    examples_of = split.spec.examples
    per_replica = runtime.per_replica_batch

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        stored = _tuned_read(split, seed, {key: tfds.decode.SkipDecoding() for key in examples_of.images})
        stored = stored.shard(context.num_input_pipelines, context.input_pipeline_id)
        stored = stored.shuffle(split.shuffle_buffer, seed=seed).repeat().enumerate()

        def prepare(index: tf.Tensor, example: dict[str, tf.Tensor]) -> tuple[Inputs, tf.Tensor]:
            return examples_of.call(examples_of.with_images(example), True, example_seed(seed, 0, index))

        prepared = stored.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
        return prepared.batch(per_replica, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return PipelineFeed(distribute(runtime.strategy, dataset_fn, per_replica=False))


def input_contender(name: str, settings: Settings, runtime: Runtime, data: Data, tuned: bool) -> Contender:
    """The input pipeline alone, no step: the template's streamed feed as `fit` makes it, or (`tuned`) the tuned
    tf.data pipeline of the same files. Where the step dominates, rows 5 and 6 tie whatever the input does;
    these two compare the pipelines themselves."""
    global_batch = runtime.global_batch
    longest = longest_call(settings, steps_per_epoch(settings, data, runtime))  # the blocks fit makes
    if tuned:
        feed = tuned_tfdata_feed(runtime, data, settings.seed)
    else:
        feeding = adapter(runtime.strategy, data.train)
        feed = feeding.train_feed(global_batch, settings.seed, 0, longest, settings.device_prefetch)

    def measure(seconds: float) -> tuple[int, float]:
        examples, started = 0, time.perf_counter()
        while True:
            if isinstance(feed, BlocksFeed):  # one host's CPUs: a call's batches at once
                feed.call_args(longest)  # eager: the next block is made when it returns
                examples += longest * global_batch
            else:
                next(feed.iterator)  # eager: the batch is made when next returns
                examples += global_batch
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                return examples, elapsed

    return Contender(name, measure, global_batch, runtime.strategy_name, "input only, no step")


def reading_per_share(
    data: Data, seed: int, global_batch: int, counts: tuple[int, ...] = (1, 2, 4), batches: int = 64
) -> dict:
    """What each of 1, 2 and 4 workers reads of a streamed split, and how fast: each its own share (the input
    pipeline each worker would run, timed alone). The same pipeline fit runs; no training."""
    split = data.train
    report: dict[str, Any] = {}
    for count in counts:
        local_batch = max(1, global_batch // count)
        per_worker = []
        for index in range(count):
            _, share = split.share(index, count)
            take = min(batches, max(1, share // local_batch))
            dataset = split.batches(index, count, seed, 0, local_batch).take(take)
            iterator = iter(dataset)
            next(iterator)  # the first window: tracing and the first read, not counted
            started, read = time.perf_counter(), 1
            for _ in iterator:
                read += 1
            seconds = time.perf_counter() - started
            per_worker.append(
                {"share_examples": share, "examples_per_sec": (read - 1) * local_batch / seconds if read > 1 else None}
            )
        report[str(count)] = per_worker
    return report
