"""Differentiable kNN with SoftSort / NeuralSort (SoftSort paper §5.4).

Trains the embedding CNN on episodes (100 queries × 100 candidates) and reports the
test accuracy of a plain kNN classifier on the learned embeddings. The offline default
is scikit-learn's digits resized to 28×28:

    python scripts/train_knn.py --output_dir=/tmp/knn --k=9
    python scripts/train_knn.py --output_dir=/tmp/knn_mnist \
        --mnist_npz=../shared/data/mnist.npz --epochs=20 --steps_per_epoch=500

Restarting with the same --output_dir resumes the run.
"""

from absl import flags

from softsort_tf.datasets import images
from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import knn

_D = knn.KnnConfig()
experiment_flags.define_run_flags(epochs=_D.epochs, steps_per_epoch=_D.steps_per_epoch,
                                  learning_rate=_D.learning_rate,
                                  defaults_help={"learning_rate": "SGD with momentum 0.9",
                                                 "batch_size": "unused: see num_queries"})
experiment_flags.define_relaxation_flags()
# Keras runs the kNN model without XLA under op determinism (several times slower).
flags.FLAGS.set_default("deterministic_ops", False)
flags.DEFINE_enum("dataset", _D.dataset, images.SOURCES,
                  "Images: embedded (offline digits, 28×28), mnist, fashion_mnist, cifar10 "
                  "(tensorflow-datasets), npz.")
flags.DEFINE_string("mnist_npz", None, "MNIST-format npz (--dataset=npz; implied when given).")
flags.DEFINE_integer("k", _D.k, "Neighbours (papers: 1, 3, 5, 9).", lower_bound=1)
flags.DEFINE_integer("num_queries", _D.num_queries, "Queries per episode.", lower_bound=1)
flags.DEFINE_integer("num_candidates", _D.num_candidates, "Candidates per episode.",
                     lower_bound=1)
flags.DEFINE_integer("num_val_episodes", _D.num_val_episodes, "Validation episodes.",
                     lower_bound=1)
flags.DEFINE_integer("limit_per_split", None, "Keep only this many images per split.")
flags.DEFINE_bool("jit_compile", _D.jit_compile, "XLA-compile the training and evaluation "
                  "steps.")


def main(argv):
    del argv
    f = flags.FLAGS
    overrides = {"tau": f.temperature if f.temperature is not None else _D.tau}
    knn.run(experiment_flags.dataclass_from_flags(knn.KnnConfig, **overrides))


if __name__ == "__main__":
    experiment_flags.run_binary(main)
