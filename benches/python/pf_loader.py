"""The data suite's windows row, PyTorch side: pytorch-forecasting's TimeSeriesDataSet and its
DataLoader (`to_dataloader`) over kiln's long-format CSV (series, t, y, price, holiday, temp,
footfall, region), set up as kiln's dataset (fixed lengths, `y` normalised per series, every window
trains), epochs timed with each batch's tensors touched once; one JSON line on stdout.
"""
import argparse
import json
import time
import warnings

import pandas as pd
import torch


def dataset(a):
    from pytorch_forecasting import TimeSeriesDataSet
    from pytorch_forecasting.data import GroupNormalizer

    df = pd.read_csv(a.csv, dtype={"series": str, "region": str})
    reals = ["price", "holiday", "temp", "footfall"]
    return TimeSeriesDataSet(
        df, time_idx="t", target="y", group_ids=["series"],
        min_encoder_length=a.encoder_length, max_encoder_length=a.encoder_length,
        min_prediction_length=a.horizon, max_prediction_length=a.horizon,
        static_categoricals=["region"],
        time_varying_known_reals=["price", "holiday"],
        time_varying_unknown_reals=["temp", "footfall", "y"],
        target_normalizer=GroupNormalizer(groups=["series"]),
        scalers={name: None for name in reals},
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", required=True)
    for flag in ("--encoder-length", "--horizon", "--batch-size", "--workers", "--epochs",
                 "--threads"):
        p.add_argument(flag, type=int, required=True)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    ds = dataset(a)
    built = time.perf_counter() - started
    loader = ds.to_dataloader(train=True, batch_size=a.batch_size, num_workers=a.workers,
                              persistent_workers=a.workers > 0, drop_last=False)
    epochs, samples, target_sum = [], 0, 0.0
    for _ in range(a.epochs):
        t0 = time.perf_counter()
        n = 0
        for x, (y, _) in loader:
            for v in x.values():
                v.sum()
            target_sum += float(y.sum(dtype=torch.float64))
            n += y.shape[0]
        epochs.append(time.perf_counter() - t0)
        samples = n
    print(json.dumps({"impl": "pytorch-forecasting", "build_seconds": built,
                      "epoch_seconds": epochs, "samples_per_epoch": samples,
                      "target_sum": target_sum}))


if __name__ == "__main__":
    main()
