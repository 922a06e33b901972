"""The keras.io DCGAN ("GAN overriding Model.train_step", fchollet, keras-io
examples/generative/dcgan_overriding_train_step.py) as published, plus one function, `export_model`:

    make train MODEL=examples/dcgan.py DATASET=./faces LABEL_KEY=none              # a folder of same-size images
    make train MODEL=examples/dcgan.py DATASET=mnist LABEL_KEY=none HP_LATENT_DIM=64

What the script does around the model is the engine's: the data (DATASET; LABEL_KEY=none gives `train_step`
the images alone, as the script's dataset of `all_digits` does, and as image_dataset_from_directory with
label_mode=None does), `fit` (EPOCHS), and the run's outputs. `build_model` holds the script's model code,
the sizes taken from the data: the discriminator's `keras.Input` is the images' shape, and the generator
upsamples twice (x4) to it, ending in as many channels (Keras 3 warns that LeakyReLU's `alpha` is now
`negative_slope`: kept as published). `latent_dim` is a hyperparameter (HP_LATENT_DIM).

The GAN defines no `call()`: the engine builds it by tracing `train_step` once, and exports what
`export_model` returns, the generator (model.keras and saved_model/ turn latent vectors into images). It
has no `test_step`, so nothing is evaluated. Its `tf.random` draws are not in the checkpoints, so a resumed
run trains on, but not bit for bit as an uninterrupted one: examples/gan.py draws from a SeedGenerator for that.
On N replicas the losses it returns are what Keras's losses give each replica (scaled by 1/N, so that the
replicas' gradients sum to the global batch's): the logged d_loss and g_loss are model.fit's.
"""

# ruff: noqa: UP008, B905  (the class as published: super(GAN, self), zip without strict)

import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super(GAN, self).__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super(GAN, self).compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real_images):
        # Sample random points in the latent space
        batch_size = tf.shape(real_images)[0]
        random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))

        # Decode them to fake images
        generated_images = self.generator(random_latent_vectors)

        # Combine them with real images
        combined_images = tf.concat([generated_images, real_images], axis=0)

        # Assemble labels discriminating real from fake images
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        # Add random noise to the labels - important trick!
        labels += 0.05 * tf.random.uniform(tf.shape(labels))

        # Train the discriminator
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))

        # Sample random points in the latent space
        random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))

        # Assemble labels that say "all real images"
        misleading_labels = tf.zeros((batch_size, 1))

        # Train the generator (note that we should *not* update the weights
        # of the discriminator)!
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"d_loss": d_loss, "g_loss": g_loss}


def build_model(input_shape, num_classes, learning_rate, *, latent_dim: int = 128):
    height, width, channels = input_shape  # the script's (28, 28, 1)
    discriminator = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(alpha=0.2),
            layers.Conv2D(128, (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(alpha=0.2),
            layers.GlobalMaxPooling2D(),
            layers.Dense(1),
        ],
        name="discriminator",
    )
    generator = keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            # We want to generate 128 coefficients to reshape into a 7x7x128 map (the images' size / 4)
            layers.Dense(height // 4 * width // 4 * 128),
            layers.LeakyReLU(alpha=0.2),
            layers.Reshape((height // 4, width // 4, 128)),
            layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
            layers.LeakyReLU(alpha=0.2),
            layers.Conv2DTranspose(128, (4, 4), strides=(2, 2), padding="same"),
            layers.LeakyReLU(alpha=0.2),
            layers.Conv2D(channels, (7, 7), padding="same", activation="sigmoid"),
        ],
        name="generator",
    )
    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return gan


def export_model(model):
    """The one addition: what model.keras and saved_model/ hold, the generator (latent vectors in, images out)."""
    return model.generator
