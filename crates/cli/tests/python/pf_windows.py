"""Reference windows from pytorch-forecasting's TimeSeriesDataSet, for the test that compares
kiln's windowed dataset with it (and the data suite's windows row).

    pf_windows.py --csv FILE --time COL --group COL --target COL --known A,B --unknown C,D
                  --static E,F --encoder-length E [--min-encoder-length M] --horizon H
                  --val-steps V --normalize group|none --out OUT.json

The CSV is long format (one row per series and time step) and every series ends at the same
time index; cutoff = max time - V. Training is a TimeSeriesDataSet on the rows with
time <= cutoff, validation is `from_dataset(training, all rows, min_prediction_idx=cutoff+1)`
(only when V > 0), both with fixed prediction lengths and encoder lengths from M (default E)
to E. The target
normaliser is GroupNormalizer(groups=[group]) or, with `--normalize none`, PF's identity
normaliser (target_normalizer=None); every other real passes unscaled (scalers={name: None}).
Empty --known/--unknown/--static mean none; the target may be listed among the unknown reals.

Output: {"train": [w...], "val": [w...], "notes": {...}}, windows in PF's index order, each
    w = {"group", "decoder_start", "encoder_length" e, "encoder_cont" [e][known + unknown],
         "decoder_known" [H][known], "encoder_target" [e], "target" [H],
         "target_scale" [center, scale], "static_cat" [codes, in --static order]}
Values are what `dataset[i]` gives: float32 reals (the target column of encoder_cont is the
normalised target), raw encoder_target/target, float64 target_scale ([0, 1] with none). The
time column is read as int64, group and static columns as strings, the target and reals as
float64 (PF would take an integer target for a categorical one). Needs the peers closure of
benches/python/peers-requirements.txt on PYTHONPATH.
"""

import argparse
import json
import warnings

import numpy as np
import pandas as pd


def names(text):
    return [n for n in text.split(",") if n]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--csv", "--time", "--group", "--target", "--out"):
        p.add_argument(flag, required=True)
    for flag in ("--known", "--unknown", "--static"):
        p.add_argument(flag, type=names, default=[])
    p.add_argument("--encoder-length", type=int, required=True)
    p.add_argument("--horizon", type=int, required=True)
    p.add_argument("--min-encoder-length", type=int, default=None)
    p.add_argument("--val-steps", type=int, default=0)
    p.add_argument("--normalize", choices=("group", "none"), default="group")
    return p.parse_args()


def load(args):
    text = [args.group] + args.static
    df = pd.read_csv(args.csv, dtype={c: str for c in text})
    df[args.time] = df[args.time].astype("int64")
    for c in dict.fromkeys([args.target] + args.known + args.unknown):
        df[c] = df[c].astype("float64")
    return df


def windows(ds, args):
    """Every window of `ds`, in index order, as the JSON records described above."""
    reals = ds.reals
    cont = [reals.index(n) for n in args.known + args.unknown]
    known = [reals.index(n) for n in args.known]
    static = [ds.flat_categoricals.index(n) for n in args.static]
    decoded = ds.decoded_index
    out = []
    for i in range(len(ds)):
        x, (y, _weight) = ds[i]
        enc = int(x["encoder_length"])
        shortest = args.min_encoder_length or args.encoder_length
        assert shortest <= enc <= args.encoder_length, (i, enc)
        assert x["decoder_length"] == args.horizon, (i, enc)
        start = int(x["encoder_time_idx_start"]) + enc
        assert start == int(decoded["time_idx_first_prediction"].iloc[i])
        x_cont = x["x_cont"]
        out.append({
            "group": str(decoded[args.group].iloc[i]),
            "decoder_start": start,
            "encoder_length": enc,
            "encoder_cont": x_cont[:enc, cont].tolist(),
            "decoder_known": x_cont[enc:, known].tolist(),
            "encoder_target": x["encoder_target"].tolist(),
            "target": y.tolist(),
            # NaN (a series with one step before the cutoff has no standard deviation) as null.
            "target_scale": [None if np.isnan(v) else float(v)
                             for v in np.asarray(x["target_scale"]).reshape(-1)],
            "static_cat": [int(c) for c in x["x_cat"][0, static]] if static else [],
        })
    return out


def main():
    args = parse_args()
    from pytorch_forecasting import GroupNormalizer, TimeSeriesDataSet
    import pytorch_forecasting

    df = load(args)
    cutoff = int(df[args.time].max()) - args.val_steps
    normalizer = GroupNormalizer(groups=[args.group]) if args.normalize == "group" else None
    others = [n for n in args.known + args.unknown if n != args.target]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train = TimeSeriesDataSet(
            df[df[args.time] <= cutoff],
            time_idx=args.time,
            target=args.target,
            group_ids=[args.group],
            max_encoder_length=args.encoder_length,
            min_encoder_length=args.min_encoder_length or args.encoder_length,
            max_prediction_length=args.horizon,
            min_prediction_length=args.horizon,
            static_categoricals=args.static,
            time_varying_known_reals=args.known,
            time_varying_unknown_reals=args.unknown,
            target_normalizer=normalizer,
            scalers={n: None for n in others},
        )
        val = None
        if args.val_steps > 0:
            val = TimeSeriesDataSet.from_dataset(train, df, min_prediction_idx=cutoff + 1)
        result = {"train": windows(train, args), "val": windows(val, args) if val else []}
    encoders = train.get_parameters()["categorical_encoders"]
    result["notes"] = {
        "pytorch_forecasting": pytorch_forecasting.__version__,
        "pandas": pd.__version__,
        "cutoff": cutoff,
        "reals": train.reals,
        "encoder_cont_columns": args.known + args.unknown,
        "categoricals": train.flat_categoricals,
        "target_normalizer": repr(train.target_normalizer),
        "category_codes": {
            n: [str(c) for c in encoders[n].classes_vector_] for n in args.static
        },
        "windows": {"train": len(train), "val": len(val) if val else 0},
        "warnings": sorted({str(w.message) for w in caught}),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
