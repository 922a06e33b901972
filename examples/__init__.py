"""Models that keep the fork contract, each a file you can point MODEL at (or copy to project/model.py).

mlp.py         the documented model, and the default MODEL
mlp_table.py   the same, the default MODEL on a table (CSV, JSON Lines): behind preprocess and adapt that
               normalise numbers (a missing one filled and flagged), one-hot few text values, bag other text
cnn.py         a small CNN with augmentation for 32x32x3 images (cifar10): a hyperparameter (HP_WIDTH) and a
               warmup + cosine schedule over context.total_steps
resnet.py      a ResNet on photos of any size, with preprocess
tabular.py     an MLP over a table's columns, normalized on context.sample
regression.py  a regression head: a scalar label that is not a class
multilabel.py  a multi-label head: a (k,) multi-hot label
early_stopping.py  build_callbacks: EarlyStopping and ReduceLROnPlateau, with MONITOR=val_accuracy
"""
