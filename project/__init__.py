"""Your project: what a fork of this template edits. The engine (`train/`) stays as it is.

    project/model.py        your `build_model(input_shape, num_classes, learning_rate)`; start from a copy of
                            an example (examples/mlp.py, cnn.py, regression.py) and set MODEL=project.model;
                            its keyword-only parameters with defaults are settings (HP_WIDTH), `context` the
                            run's facts, and `build_callbacks(context)` its Keras callbacks (early_stopping.py)
    project/defaults.env    your project's defaults for any setting (MODEL, DATASET, BATCH_SIZE, ...), committed
    project/datasets/       your own TFDS dataset builders, if any: the engine imports `project.datasets`
                            before it opens DATASET, so import them in its __init__.py

Keep this file free of heavy imports: settings are checked before TensorFlow loads.
"""
