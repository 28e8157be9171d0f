"""Why a ranking loss does or does not learn: the measurements of issue 40.

A Keras-RS-style listwise pipeline (300 users × 600 items, 100 rated items per user,
80 for training lists and 20 for test lists, lists of 5, Adam 0.01, batch 64, the
example's model: user and item embeddings of 32, MLP 256, 64, 1). Unlike
`scripts/bench_ltr.py --task=keras_rs`, each list draws its labels afresh: grade = the
quantile bin (40/25/18/11/6 %) of u·v + N(0, 1) (d = 8), so an item's grade varies
from list to list around its user's preference. Before training and after each epoch,
on 2,048 training lists, it prints: the loss; the median standard deviation of a list's
scores (to compare with a temperature in score units); the median norm of the loss's
gradient with respect to a list's scores (centred); its mean cosine with the direction
that raises each item by its gain (gain − the list's mean gain) and the fraction of
lists where that cosine is negative; and the fraction of pairs with y_i > y_j that the
scores order the wrong way; then the test NDCG@5.

    python scripts/diagnose_ranking_loss.py --loss=soft_ndcg --method=lapsum --temperature=1
    python scripts/diagnose_ranking_loss.py --loss=soft_ndcg --method=lapsum
    python scripts/diagnose_ranking_loss.py --loss=listwise --epochs=4
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import softsort_tf as ss  # noqa: E402


def make_data(seed=0, users=300, items=600, rated=100, dim=8, train_lists=50, test_lists=5,
              n=5, noise=1.0, probs=(0.4, 0.25, 0.18, 0.11, 0.06)):
    rng = np.random.default_rng(seed)
    u_vec = rng.normal(size=(users, dim)) / np.sqrt(dim)
    i_vec = rng.normal(size=(items, dim))
    z = (u_vec @ i_vec.T).ravel() + noise * rng.normal(size=users * items)
    cuts = np.quantile(z, np.cumsum(probs)[:-1])
    pools = [rng.choice(items, size=rated, replace=False) for _ in range(users)]
    cut = int(0.8 * rated)

    def lists(per_user, part):
        user, item, label = [], [], []
        for u in range(users):
            pool = pools[u][:cut] if part == 0 else pools[u][cut:]
            for _ in range(per_user):
                chosen = rng.choice(pool, size=n, replace=False)
                r = i_vec[chosen] @ u_vec[u] + noise * rng.normal(size=n)
                user.append(u)
                item.append(chosen)
                label.append(np.searchsorted(cuts, r).astype(np.float32))
        return (np.array(user, np.int32), np.array(item, np.int32)), np.array(label)

    return lists(train_lists, 0), lists(test_lists, 1)


class RankingModel(keras.Model):
    def __init__(self, users=300, items=600, dim=32, **kwargs):
        super().__init__(**kwargs)
        self.users = keras.layers.Embedding(users, dim)
        self.items = keras.layers.Embedding(items, dim)
        self.mlp = keras.Sequential([keras.layers.Dense(256, activation="relu"),
                                     keras.layers.Dense(64, activation="relu"),
                                     keras.layers.Dense(1)])

    def call(self, inputs):
        user, item = inputs
        pair = tf.concat([tf.repeat(self.users(user)[:, None], tf.shape(item)[1], axis=1),
                          self.items(item)], -1)
        return tf.squeeze(self.mlp(pair), -1)


def make_loss(args):
    if args.loss == "listwise":
        return ss.ListwisePermutationLoss()
    if args.loss == "mse":
        return keras.losses.MeanSquaredError()
    cls = ss.SoftNDCGLoss if args.loss == "soft_ndcg" else ss.SpearmanLoss
    kwargs = {} if args.temperature is None else {"temperature": args.temperature}
    return cls(method=args.method, **kwargs)


def diagnose(model, loss, x, y):
    scores = tf.constant(model(x))
    with tf.GradientTape() as tape:
        tape.watch(scores)
        value = loss(tf.constant(y), scores)
    grad = tape.gradient(value, scores).numpy()
    s = scores.numpy()
    grad = grad - grad.mean(-1, keepdims=True)
    gains = np.where(y > 0, 2.0 ** y - 1.0, 0.0)
    gains = gains - gains.mean(-1, keepdims=True)
    norms = np.linalg.norm(grad, axis=-1)
    usable = (np.linalg.norm(gains, axis=-1) > 0) & (norms > 0)
    cos = np.sum(-grad * gains, -1)[usable] / (
        norms[usable] * np.linalg.norm(gains, axis=-1)[usable])
    better = y[:, :, None] > y[:, None, :]
    wrong = better & (s[:, :, None] < s[:, None, :])
    return dict(loss=float(value), score_std=float(np.median(s.std(-1))),
                grad_norm=float(np.median(norms)),
                cos_gains=float(cos.mean()) if cos.size else float("nan"),
                against_gains=float(np.mean(cos < 0)) if cos.size else float("nan"),
                lists_with_gradient=float(np.mean(usable)),
                misordered=float(wrong.sum() / better.sum()))


def test_ndcg(model, x, y):
    metric = ss.NDCGMetric(k=5)
    metric.update_state(y, model.predict(x, batch_size=4096, verbose=0))
    return float(metric.result())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loss", choices=("soft_ndcg", "spearman", "listwise", "mse"),
                        default="soft_ndcg")
    parser.add_argument("--method", default="sinkhorn")
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    (xtr, ytr), (xte, yte) = make_data(args.seed)
    keras.utils.set_random_seed(args.seed)
    loss = make_loss(args)
    model = RankingModel()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss)
    model((xte[0][:2], xte[1][:2]))
    probe = (xtr[0][:2048], xtr[1][:2048]), ytr[:2048]

    def report(tag):
        d = diagnose(model, loss, *probe)
        print(f"{tag:>8s}: test NDCG@5 {test_ndcg(model, xte, yte):.4f} | loss {d['loss']:.4f}"
              f" | list score std {d['score_std']:.3g} | |grad| {d['grad_norm']:.3g} | cos("
              f"-grad, gains) {d['cos_gains']:.3f}, against {d['against_gains']:.3f}, lists "
              f"with gradient {d['lists_with_gradient']:.3f} | mis-ordered pairs "
              f"{d['misordered']:.3f}", flush=True)

    report("init")
    for epoch in range(args.epochs):
        model.fit(xtr, ytr, batch_size=64, epochs=1, verbose=0)
        report(f"epoch {epoch + 1}")


if __name__ == "__main__":
    main()
