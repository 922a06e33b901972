"""Several machines: the seam the loop calls for what multi-worker does differently (`workers`), the Role decided
once (`role`), and N local workers on loopback for trying it (`launch`: python -m train.cluster.launch N -- fit).
TF_CONFIG is read before TensorFlow starts by train.settings.tf_config; what workers agree on is train.agreement."""
