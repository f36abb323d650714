"""The data suite's windows row, PyTorch side: pytorch-forecasting's TimeSeriesDataSet and its
DataLoader over kiln's long-format CSV, set up as kiln's dataset (fixed lengths, `y` normalised per
series, every window trains); epochs timed with each batch's tensors touched once; one JSON line.
"""
import time
import warnings

from common import emit, parser
import pandas as pd  # noqa: E402
import torch  # noqa: E402


def dataset(a):
    from pytorch_forecasting import TimeSeriesDataSet
    from pytorch_forecasting.data import GroupNormalizer

    df = pd.read_csv(a.csv, dtype={"series": str, "region": str})
    return TimeSeriesDataSet(
        df, time_idx="t", target="y", group_ids=["series"],
        min_encoder_length=a.encoder_length, max_encoder_length=a.encoder_length,
        min_prediction_length=a.horizon, max_prediction_length=a.horizon,
        static_categoricals=["region"],
        time_varying_known_reals=["price", "holiday"],
        time_varying_unknown_reals=["temp", "footfall", "y"],
        target_normalizer=GroupNormalizer(groups=["series"]),
        scalers=dict.fromkeys(["price", "holiday", "temp", "footfall"]),
    )


def main():
    p = parser(__doc__, csv=str, encoder_length=int, horizon=int, batch_size=int, workers=int,
               epochs=int, threads=int)
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
        samples = 0
        for x, (y, _) in loader:
            for v in x.values():
                v.sum()
            target_sum += float(y.sum(dtype=torch.float64))
            samples += y.shape[0]
        epochs.append(time.perf_counter() - t0)
    emit({"impl": "pytorch-forecasting", "build_seconds": built, "epoch_seconds": epochs,
          "samples_per_epoch": samples, "target_sum": target_sum})


if __name__ == "__main__":
    main()
