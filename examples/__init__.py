"""Models that keep the fork contract, each a file you can point MODEL at (or copy to project/model.py).

mlp.py         the documented model, and the default MODEL
cnn.py         a small CNN with augmentation for 32x32x3 images (cifar10)
regression.py  a regression head: a scalar label that is not a class
multilabel.py  a multi-label head: a (k,) multi-hot label
"""
