"""Code that runs inside a task process; the only part of ClusterDeck that imports TensorFlow."""
