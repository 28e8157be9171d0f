"""The regression data sets of the soft quantile-regression benchmark (Cuturi et al. 2019, Table 1).

Cuturi, Teboul & Vert (2019, §4) compare the pinball loss with the τ-S-quantile on the
data sets shared by "Conformalized Quantile Regression" (Romano, Patterson & Candès
2019). Five of them are read here from their public files (the project does not ship
them; pass the folder that holds them as `data_dir`):

| name        | file(s)                                             | target                     |
|-------------|-----------------------------------------------------|----------------------------|
| `bio`       | `CASP.csv`                                          | `RMSD` (column 0)          |
| `bike`      | `bike_train.csv`                                    | `count`                    |
| `star`      | `STAR.csv`                                          | sum of the 8 test scores   |
| `concrete`  | `Concrete_Data.csv`                                 | last column (strength)     |
| `community` | `communities.data` + `communities_attributes.csv`   | `ViolentCrimesPerPop`      |

Pre-processing follows the reference protocol:
- bike: one-hot `season` and `weather`; hour, day of week, month and year (2011 → 0,
  2012 → 1) from `datetime`; `datetime`, `casual` and `registered` dropped;
- star: categorical (text) columns coded as integers (codes in order of first
  appearance), rows with a missing value dropped, the 8 score columns removed from the
  features; the unnamed row-identifier column is dropped too (an index, not a feature);
- community: `state`, `county`, `community`, `communityname`, `fold` dropped, `?` read
  as missing, `OtherPerCap` imputed with its mean, then every column that still has a
  missing value dropped.

Split (`load_split`): 80 % train / 20 % test with scikit-learn's
`train_test_split(test_size=0.2, random_state=seed)`; features standardised with the
training mean and standard deviation; the response divided by the mean absolute
training response. For early stopping, a validation part (default 20 %) is then
carved out of the training part (`random_state=seed` too); the scaling is the one of
the whole training part, so the test set is scaled exactly as in the reference
protocol.

Only the standard library, numpy and scikit-learn are needed (no pandas).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import os

import numpy as np

from softsort_tf.datasets.arrays import Splits

__all__ = ["ALL_DATASETS", "DATASETS", "FILES", "RegressionSplit", "load_dataset",
           "load_split", "synthetic"]

DATASETS = ("bio", "bike", "star", "concrete", "community")
# `synthetic` needs no file (the binaries' offline default); not a data set of the paper.
ALL_DATASETS = DATASETS + ("synthetic",)
SYNTHETIC_SIZE = 2000
FILES = {
    "bio": ("CASP.csv",),
    "bike": ("bike_train.csv",),
    "star": ("STAR.csv",),
    "concrete": ("Concrete_Data.csv",),
    "community": ("communities.data", "communities_attributes.csv"),
}
STAR_SCORES = ("readk", "read1", "read2", "read3", "mathk", "math1", "math2", "math3")
COMMUNITY_DROPPED = ("state", "county", "community", "communityname", "fold")
MISSING = ("", "NA", "?")


def _path(data_dir: str | None, name: str) -> str:
    if not data_dir:
        raise ValueError(f"The real data sets need `data_dir` (--data_dir), the folder that "
                         f"holds {name!r}; only 'synthetic' works without it.")
    path = os.path.join(data_dir, name)
    if not os.path.exists(path):
        raise ValueError(f"data_dir={data_dir!r} has no file {name!r} (see "
                         f"softsort_tf.datasets.cqr for the expected files).")
    return path


def _read_csv(path: str, header: bool = True) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        rows = [[cell.strip() for cell in row] for row in csv.reader(f) if row]
    if header:
        return rows[0], rows[1:]
    return [], rows


def _floats(rows: list[list[str]]) -> np.ndarray:
    """Numeric table; missing cells ('', 'NA', '?') become NaN."""
    return np.array([[np.nan if c in MISSING else float(c) for c in row] for row in rows],
                    dtype=np.float64)


def _bio(data_dir):
    _, rows = _read_csv(_path(data_dir, "CASP.csv"))
    table = _floats(rows)
    return table[:, 1:], table[:, 0]


def _concrete(data_dir):
    _, rows = _read_csv(_path(data_dir, "Concrete_Data.csv"))
    table = _floats(rows)
    return table[:, :-1], table[:, -1]


def _bike(data_dir):
    names, rows = _read_csv(_path(data_dir, "bike_train.csv"))
    col = {n: i for i, n in enumerate(names)}
    features = []
    for row in rows:
        when = datetime.datetime.strptime(row[col["datetime"]], "%Y-%m-%d %H:%M:%S")
        season, weather = int(float(row[col["season"]])), int(float(row[col["weather"]]))
        numeric = [float(row[col[n]]) for n in ("holiday", "workingday", "temp", "atemp",
                                                  "humidity", "windspeed")]
        features.append(numeric + [float(season == s) for s in (1, 2, 3, 4)]
                        + [float(weather == w) for w in (1, 2, 3, 4)]
                        + [when.hour, when.weekday(), when.month, float(when.year == 2012)])
    y = np.array([float(row[col["count"]]) for row in rows])
    return np.array(features, np.float64), y


def _star(data_dir):
    names, rows = _read_csv(_path(data_dir, "STAR.csv"))
    rows = [row for row in rows if not any(c in MISSING for c in row[1:])]
    if not rows:
        raise ValueError("STAR.csv has no row without missing values.")
    columns = list(zip(*rows, strict=True))
    features, scores = [], []
    for name, values in zip(names, columns, strict=True):
        if name == "":  # the row identifier written by R
            continue
        try:
            numeric = [float(v) for v in values]
        except ValueError:  # categorical: integer codes in order of first appearance
            codes = {}
            numeric = [float(codes.setdefault(v, len(codes))) for v in values]
        (scores if name in STAR_SCORES else features).append(numeric)
    if len(scores) != len(STAR_SCORES):
        raise ValueError(f"STAR.csv must have the score columns {STAR_SCORES}.")
    return np.array(features, np.float64).T, np.sum(scores, axis=0)


def _community(data_dir):
    _, attributes = _read_csv(_path(data_dir, "communities_attributes.csv"))
    names = [row[0].split()[0] for row in attributes]
    _, rows = _read_csv(_path(data_dir, "communities.data"), header=False)
    if any(len(row) != len(names) for row in rows):
        raise ValueError("communities.data rows must have one value per attribute of "
                         "communities_attributes.csv.")
    keep = [i for i, n in enumerate(names) if n not in COMMUNITY_DROPPED]
    kept_names = [names[i] for i in keep]
    table = _floats([[row[i] for i in keep] for row in rows])
    other = kept_names.index("OtherPerCap")
    column = table[:, other]
    column[np.isnan(column)] = np.nanmean(column)
    complete = ~np.isnan(table).any(axis=0)
    table = table[:, complete]
    kept_names = [n for n, ok in zip(kept_names, complete, strict=True) if ok]
    target = kept_names.index("ViolentCrimesPerPop")
    return np.delete(table, target, axis=1), table[:, target]


def synthetic(num_examples: int = SYNTHETIC_SIZE, seed: int = 0):
    """A heteroscedastic regression problem generated in memory (no file, no network).

    x ~ U[0, 1]^5; y = 2 + sin(2π x_1) + x_2 + (0.2 + x_3) · e with e ~ Exp(1) − 1
    (skewed noise whose spread grows with x_3, so the conditional quantiles differ).

    Returns:
      `(x [N, 5], y [N])` float64.
    """
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=(num_examples, 5))
    noise = rng.exponential(size=num_examples) - 1.0
    y = 2.0 + np.sin(2 * np.pi * x[:, 0]) + x[:, 1] + (0.2 + x[:, 2]) * noise
    return x, y


_LOADERS = {"synthetic": lambda data_dir: synthetic(), "bio": _bio, "bike": _bike,
            "star": _star, "concrete": _concrete, "community": _community}


def load_dataset(name: str, data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """Features and response of one data set, pre-processed (module docstring).

    Args:
      name: one of `ALL_DATASETS` (`'synthetic'`: see `synthetic`, no file needed).
      data_dir: the folder with the files of `FILES[name]`.

    Returns:
      `(x [N, d] float64, y [N] float64)`, before splitting and scaling.
    """
    if name not in ALL_DATASETS:
        raise ValueError(f"dataset must be one of {ALL_DATASETS}, got {name!r}.")
    x, y = _LOADERS[name](data_dir)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError(f"{name}: non-finite values left after pre-processing.")
    return x, y


@dataclasses.dataclass(frozen=True)
class RegressionSplit(Splits):
    """Scaled train / validation / test arrays of one data set and seed (float32).

    `y_scale` is the mean absolute training response the responses were divided by;
    `x_mean`, `x_std` the training statistics of the features.
    """

    y_scale: float
    x_mean: np.ndarray
    x_std: np.ndarray


def load_split(name: str, data_dir: str, seed: int,
               validation_fraction: float = 0.2) -> RegressionSplit:
    """The reference split and scaling of one data set for one seed (module docstring).

    Args:
      name: one of `ALL_DATASETS`.
      data_dir: folder of the files (unused for 'synthetic').
      seed: `random_state` of the test split and of the validation split.
      validation_fraction: share of the training part held out for early stopping,
        in [0, 1) (0: no validation part; the validation arrays are then empty).

    Returns:
      A `RegressionSplit`.
    """
    from sklearn.model_selection import train_test_split  # noqa: PLC0415 (heavy import)

    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}.")
    x, y = load_dataset(name, data_dir)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2,
                                                        random_state=seed)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    y_scale = float(np.mean(np.abs(y_train)))
    if not y_scale > 0:
        raise ValueError(f"{name}: the training responses are all 0.")
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    y_train, y_test = y_train / y_scale, y_test / y_scale
    if validation_fraction > 0:
        x_train, x_val, y_train, y_val = train_test_split(
            x_train, y_train, test_size=validation_fraction, random_state=seed)
    else:
        x_val, y_val = x_train[:0], y_train[:0]
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    return RegressionSplit(f32(x_train), f32(y_train), f32(x_val), f32(y_val), f32(x_test),
                           f32(y_test), y_scale, f32(mean), f32(std))
