"""Several machines: TF_CONFIG read before TensorFlow starts (`tf_config`), what workers agree on
(`agreement`), the seam the loop calls for what multi-worker does differently (`workers`), and N local
workers on loopback for trying it (`launch`: python -m train.cluster.launch N -- fit)."""
