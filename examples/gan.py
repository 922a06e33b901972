"""A small GAN on 32x32x3 images, in the keras-io pattern ("DCGAN overriding train_step"): a discriminator and
a generator, each with its own optimizer, set in an overridden `compile`; the step trains one, then the other.

    make train MODEL=examples/gan.py DATASET=synthetic_images
    make train MODEL=examples/gan.py DATASET=synthetic_images CPU_DEVICES=2

The engine calls `train_step((images, labels))` on every replica (the labels go unused) and logs what it
returns, `d_loss` and `g_loss`, averaged over the replicas. Both optimizers are attributes of the model, so
both are in every checkpoint: a run killed and rerun ends with the weights of the uninterrupted run. The model
has no compiled loss and no `test_step`, so nothing is evaluated (summary.json's "eval" is {}). What is
exported is the generator (`export_model`): model.keras and saved_model/ turn latent vectors into images.
examples/dcgan.py is the keras.io DCGAN as published (no call(), tf.random), given the images alone by
LABEL_KEY=none; this one draws from a SeedGenerator so that a resumed run ends where an uninterrupted one does.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers, ops

LATENT_DIM = 16


@keras.saving.register_keras_serializable(package="gan")
class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim, **kwargs):
        super().__init__(**kwargs)
        self.discriminator, self.generator, self.latent_dim = discriminator, generator, latent_dim
        # keras.random keyed on a SeedGenerator: its state is in every checkpoint, and each replica draws its own
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def call(self, images):
        """What the served GAN computes: the discriminator's score (the generator is exported on its own)."""
        return self.discriminator(images)

    def train_step(self, data):
        real_images, _ = data  # the labels are not used
        batch_size = ops.shape(real_images)[0]
        latent = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        combined = ops.concatenate([self.generator(latent), real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)  # label noise
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        gradients = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(gradients, self.discriminator.trainable_weights, strict=True))

        latent = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((batch_size, 1)), self.discriminator(self.generator(latent)))
        gradients = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(gradients, self.generator.trainable_weights, strict=True))

        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float) -> keras.Model:
    if tuple(input_shape) != (32, 32, 3):
        raise ValueError(f"this GAN makes 32x32x3 images, not {input_shape}: DATASET=synthetic_images or cifar10")
    discriminator = keras.Sequential([
        keras.Input(shape=input_shape),
        layers.Conv2D(16, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2D(32, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Flatten(),
        layers.Dense(1, activation="sigmoid"),
    ], name="discriminator")  # fmt: skip
    generator = keras.Sequential([
        keras.Input(shape=(LATENT_DIM,), name="latent"),
        layers.Dense(8 * 8 * 32), layers.Reshape((8, 8, 32)), layers.LeakyReLU(0.2),
        layers.Conv2DTranspose(32, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2DTranspose(16, 4, strides=2, padding="same"), layers.LeakyReLU(0.2),
        layers.Conv2D(3, 5, padding="same", activation="sigmoid", name="images"),  # in [0, 1], as the engine scales
    ], name="generator")  # fmt: skip
    gan = GAN(discriminator, generator, LATENT_DIM, name="gan")
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        g_optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss_fn=keras.losses.BinaryCrossentropy(),
    )
    return gan


def export_model(model: GAN) -> keras.Model:
    """What model.keras and saved_model/ hold: the generator, latent vectors in, images out."""
    return model.generator
