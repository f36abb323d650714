"""Small fully convolutional segmenters (2-D and 3-D) scripted with TorchScript, inputs larger
than their windows, and MONAI's `sliding_window_inference` over them, for the test that kiln's
sliding window gives MONAI's outputs (crates/cli/tests/sliding.rs).

    sliding_monai.py OUT    writes OUT/model3d.pt, OUT/model2d.pt, OUT/volume3d.npy,
                            OUT/volume2d.npy and, for each case of CASES, OUT/monai-<case>.npy
                            (the blended scores [K, *spatial], float32); OUT/cases.json lists
                            the cases' settings as kiln keys

The models' receptive fields (5 voxels) are wider than one voxel, so a window's edge differs
from the whole input's forward and the blending shows. Needs MONAI (pinned with the bench
peers) on PYTHONPATH.
"""

import json
import sys

import numpy as np
import torch
from torch import nn

CASES = {
    "constant-3d": dict(dims=3, roi=(12, 10, 8), overlap=0.25, mode="constant", batch=4),
    "gaussian-3d": dict(dims=3, roi=(12, 10, 8), overlap=0.5, mode="gaussian", batch=3),
    "padded-3d": dict(dims=3, roi=(30, 10, 8), overlap=0.25, mode="gaussian", batch=2),
    "replicate-3d": dict(dims=3, roi=(30, 10, 8), overlap=0.6, mode="constant", batch=5,
                         padding="replicate"),
    "gaussian-2d": dict(dims=2, roi=(16, 16), overlap=0.25, mode="gaussian", batch=4,
                        sigma=0.2),
}


def segmenter(dims):
    conv = nn.Conv3d if dims == 3 else nn.Conv2d
    return nn.Sequential(conv(2, 8, 3, padding=1), nn.ReLU(), conv(8, 3, 3, padding=1)).eval()


def main(out):
    from monai.inferers import sliding_window_inference

    torch.manual_seed(0)
    models, volumes = {}, {}
    for dims, shape in ((3, (2, 23, 19, 17)), (2, (2, 37, 29))):
        models[dims] = torch.jit.script(segmenter(dims))
        models[dims].save(f"{out}/model{dims}d.pt")
        volumes[dims] = torch.randn(shape)
        np.save(f"{out}/volume{dims}d.npy", volumes[dims].numpy())
    settings = {}
    for name, c in CASES.items():
        padding = c.get("padding", "constant")
        sigma = c.get("sigma", 0.125)
        with torch.no_grad():
            y = sliding_window_inference(
                volumes[c["dims"]].unsqueeze(0), c["roi"], c["batch"], models[c["dims"]],
                overlap=c["overlap"], mode=c["mode"], sigma_scale=sigma, padding_mode=padding)
        np.save(f"{out}/monai-{name}.npy", y[0].numpy().astype(np.float32))
        settings[name] = {
            "dims": c["dims"],
            "infer.sliding_window.roi": ",".join(map(str, c["roi"])),
            "infer.sliding_window.overlap": str(c["overlap"]),
            "infer.sliding_window.mode": c["mode"],
            "infer.sliding_window.batch_size": str(c["batch"]),
            "infer.sliding_window.padding_mode": padding,
            "infer.sliding_window.sigma_scale": str(sigma),
        }
    import monai
    settings["_monai"] = monai.__version__
    with open(f"{out}/cases.json", "w") as f:
        json.dump(settings, f)


if __name__ == "__main__":
    main(sys.argv[1])
