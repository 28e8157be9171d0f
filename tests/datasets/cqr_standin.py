"""Stand-ins of the six CQR data files (`softsort_tf.datasets.cqr`), in the formats of
the published files, so that the tests never need ../shared/data and never skip."""

import csv

import numpy as np

from softsort_tf.datasets import cqr

ROWS = 150
STAR_EXTRA = ("stark", "lunchk", "schoolk", "experiencek")


def _write_csv(path, header, rows, quote_header=False):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC if quote_header else
                            csv.QUOTE_MINIMAL)
        if header is not None:
            writer.writerow(header)
        writer = csv.writer(f)
        writer.writerows(rows)


def write(d) -> dict:
    """Writes the six files, `ROWS` rows each, into the folder `d` (a `pathlib.Path`).

    Returns:
      What each data set must read as: `{"bio": (x, y), "concrete": (x, y), "bike": rows,
      "star": the kept rows' summed scores, "community": (values, imputed OtherPerCap)}`.
    """
    rng = np.random.default_rng(0)
    truth = {}
    # bio: "RMSD","F1".."F9", quoted header.
    x = rng.normal(size=(ROWS, 9)) * 10 + 50
    y = np.abs(rng.normal(size=ROWS)) * 5
    _write_csv(d / "CASP.csv", ["RMSD"] + [f"F{i}" for i in range(1, 10)],
               np.column_stack([y, x]).round(4).tolist(), quote_header=True)
    truth["bio"] = (np.round(x, 4), np.round(y, 4))
    # concrete: 8 features then the strength, cells with trailing spaces.
    x = rng.uniform(0, 500, size=(ROWS, 8)).round(1)
    y = rng.uniform(5, 80, size=ROWS).round(2)
    with open(d / "Concrete_Data.csv", "w") as f:
        f.write(",".join(f"c{i}" for i in range(8)) + ',"Concrete compressive strength(MPa, '
                'megapascals) "\n')
        for row in np.column_stack([x, y]):
            f.write(",".join(f"{v} " for v in row) + "\n")
    truth["concrete"] = (x, y)
    # bike: hourly records of 2011-2012.
    header = ["datetime", "season", "holiday", "workingday", "weather", "temp", "atemp",
              "humidity", "windspeed", "casual", "registered", "count"]
    rows = []
    for i in range(ROWS):
        casual, registered = int(rng.integers(0, 50)), int(rng.integers(0, 300))
        rows.append([f"{2011 + i % 2}-{1 + i % 12:02d}-{1 + i % 28:02d} {i % 24:02d}:00:00",
                     1 + i % 4, i % 2, (i + 1) % 2, 1 + (i // 4) % 4, 9.84, 14.395, 81, 0,
                     casual, registered, casual + registered])
    _write_csv(d / "bike_train.csv", header, rows)
    truth["bike"] = rows
    # star: R's write.csv layout (unnamed id column, quoted strings, NA).
    scores = list(cqr.STAR_SCORES)
    header = ["", "gender", "ethnicity", "birth"] + scores + list(STAR_EXTRA)
    rows, kept = [], []
    for i in range(ROWS):
        score = rng.integers(300, 700, size=8)
        row = [str(1000 + i), ["female", "male"][i % 2], ["cauc", "afam", "asian"][i % 3],
               1979.5 + (i % 3) * 0.25] + score.tolist() + [
                   ["small", "regular", "regular+aide"][i % 3], ["free", "non-free"][i % 2],
                   ["rural", "suburban", "inner-city"][(i // 2) % 3], i % 20]
        if i % 5 == 0:
            row[4 + int(rng.integers(0, 8))] = "NA"  # a missing score: row dropped
        else:
            kept.append(score.sum())
        rows.append(row)
    _write_csv(d / "STAR.csv", header, rows)
    truth["star"] = np.array(kept, float)
    # community: attribute names (one per line, trailing spaces) and '?' for missing.
    names = (["state", "county", "community", "communityname", "fold", "population",
              "OtherPerCap", "householdsize", "LemasSwornFT"] + [f"a{i}" for i in range(4)]
             + ["ViolentCrimesPerPop"])
    with open(d / "communities_attributes.csv", "w") as f:
        f.write("attributes\n" + "".join(f"{n}  \n" for n in names))
    values = rng.uniform(size=(ROWS, len(names) - 5)).round(3)
    with open(d / "communities.data", "w") as f:
        for i, row in enumerate(values):
            cells = [str(8 + i % 3), "?", "?", f"Town{i}city", str(1 + i % 10)]
            cells += [str(v) for v in row]
            if i == 3:
                cells[6] = "?"  # OtherPerCap: imputed with the mean
            if i % 7 == 0:
                cells[8] = "?"  # LemasSwornFT: dropped (still missing)
            f.write(",".join(cells) + "\n")
    other = values[:, 1].copy()
    other[3] = np.mean(np.delete(other, 3))
    truth["community"] = (values, other)
    return truth
