"""MONAI's side of the infer suite's sliding-window rows, and the inputs both sides use.

`make DIR --size N --channels C` writes DIR/model.pt (a small 3-D segmenter, TorchScript) and
DIR/volume.npy ([1, N, N, N] float32, seeded). `run DIR --roi R --overlap O --mode M --batch B
--threads T --out FILE [--channels-last]` runs one trial window of zeros, then times MONAI's
sliding_window_inference over the volume once (the forward's time summed apart), writes the output
to FILE and prints one JSON line: {"total_s", "forward_s", "windows", "monai"}.
"""
import time

from common import emit, parser
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


def make(a):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(1, a.channels, 3, padding=1), nn.ReLU(),
                          nn.Conv3d(a.channels, 2, 3, padding=1)).eval()
    torch.jit.script(model).save(f"{a.dir}/model.pt")
    volume = torch.randn(1, a.size, a.size, a.size)
    np.save(f"{a.dir}/volume.npy", volume.numpy())


def run(a):
    import monai
    from monai.inferers import sliding_window_inference

    torch.set_num_threads(a.threads)
    model = torch.jit.load(f"{a.dir}/model.pt").eval()
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last_3d)
    volume = torch.from_numpy(np.load(f"{a.dir}/volume.npy")).unsqueeze(0)
    inside = {"s": 0.0, "windows": 0}

    def predict(x):
        start = time.perf_counter()
        y = model(x)
        inside["s"] += time.perf_counter() - start
        inside["windows"] += x.shape[0]
        return y

    with torch.no_grad():
        model(torch.zeros(1, 1, a.roi, a.roi, a.roi))
        start = time.perf_counter()
        out = sliding_window_inference(volume, a.roi, a.batch, predict, overlap=a.overlap,
                                       mode=a.mode)
        total = time.perf_counter() - start
    np.save(a.out, out[0].numpy())
    emit({"total_s": total, "forward_s": inside["s"], "windows": inside["windows"],
          "monai": monai.__version__})


def main():
    p = parser(__doc__, size=96, channels=8, roi=64, overlap=0.25, mode="gaussian", batch=4,
               threads=2)
    p.add_argument("what", choices=("make", "run"))
    p.add_argument("dir")
    p.add_argument("--out")
    p.add_argument("--channels-last", action="store_true", help="weights channels-last-3d")
    a = p.parse_args()
    make(a) if a.what == "make" else run(a)


if __name__ == "__main__":
    main()
