"""Learning to rank on synthetic queries: listwise soft losses vs a pointwise MSE.

No public learning-to-rank data set is used: documents, a hidden scorer and noisy
relevance grades 0–4 are drawn at random, with 5–200 documents per query, padded per
batch (see `softsort_tf.experiments.ranking`). Reports NDCG@10 and MRR on held-out
queries in results.csv:

    python scripts/train_ranking.py --output_dir=/tmp/ranking
    python scripts/train_ranking.py --output_dir=/tmp/ranking --losses=mse,soft_ndcg_sinkhorn \
        --epochs=20 --num_train_queries=5000

Restarting with the same --output_dir resumes (finished losses are skipped).
"""

from absl import flags

from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import ranking

_D = ranking.RankingConfig()
experiment_flags.define_run_flags(epochs=_D.epochs, batch_size=_D.batch_size,
                                  learning_rate=_D.learning_rate,
                                  defaults_help={"steps_per_epoch": "default: one pass over "
                                                 "the training queries"})
flags.DEFINE_list("losses", list(_D.losses), f"Losses to compare, among {ranking.LOSSES}.")
flags.DEFINE_integer("num_features", _D.num_features, "Features per document.",
                     lower_bound=1)
flags.DEFINE_integer("num_train_queries", _D.num_train_queries, "Training queries.",
                     lower_bound=1)
flags.DEFINE_integer("num_val_queries", _D.num_val_queries, "Validation queries.",
                     lower_bound=1)
flags.DEFINE_integer("num_test_queries", _D.num_test_queries, "Held-out test queries.",
                     lower_bound=1)
flags.DEFINE_integer("min_list_size", _D.min_list_size, "Fewest documents per query.",
                     lower_bound=1)
flags.DEFINE_integer("max_list_size", _D.max_list_size, "Most documents per query.",
                     lower_bound=1)
flags.DEFINE_float("label_noise", _D.label_noise,
                   "Standard deviation of the noise added to the hidden scores.",
                   lower_bound=0.0)
flags.DEFINE_float("tau", _D.tau, "SoftSort/NeuralSort temperature (default: the "
                   "operator's, 1.0).", lower_bound=0.0)
flags.DEFINE_float("epsilon", _D.epsilon, "Sinkhorn ε of the soft NDCG and Spearman "
                   "losses (default 0.01).", lower_bound=0.0)
flags.register_validator(
    "losses", lambda names: bool(names) and all(n in ranking.LOSSES for n in names),
    message=f"--losses must be a non-empty list among {ranking.LOSSES}.")
flags.register_multi_flags_validator(
    ["min_list_size", "max_list_size"],
    lambda v: v["min_list_size"] <= v["max_list_size"],
    message="--min_list_size must be <= --max_list_size.")


def main(argv):
    del argv
    config = experiment_flags.dataclass_from_flags(
        ranking.RankingConfig, losses=tuple(flags.FLAGS.losses))
    summary = ranking.run(config)
    if not summary["finished"]:
        print("Interrupted before the end: rerun with the same --output_dir to resume.")
        return
    for name, result in summary["results"].items():
        print(f"{name:24s} test NDCG@10 {result.get('test_ndcg_at_10')}")
    for name, ref in summary["references"].items():
        print(f"({name}){'':10s} test NDCG@10 {ref['ndcg_at_10']:.4f}")


if __name__ == "__main__":
    experiment_flags.run_binary(main)
