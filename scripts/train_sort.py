"""Learning to sort large-MNIST sequences (NeuralSort / SoftSort / Sinkhorn benchmark).

Example (a quick run on the offline digits):

    python scripts/train_sort.py --output_dir=/tmp/sort --n=3 --epochs=2 --steps_per_epoch=50

Restarting with the same --output_dir resumes from the last finished epoch. On a
cluster, run it on every worker with --strategy=multi_worker and TF_CONFIG (README,
"Scaling out"); --batch_size is then the global batch. The flags
are those of `softsort_tf.experiments.flags`, shared with the other experiment binaries.
"""

from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import large_mnist

experiment_flags.define_flags("sort")


def main(argv):
    del argv  # run_binary rejects positional arguments
    large_mnist.run(experiment_flags.config_from_flags("sort"))


if __name__ == "__main__":
    experiment_flags.run_binary(main)
