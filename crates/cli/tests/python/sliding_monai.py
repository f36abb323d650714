"""Small fully convolutional segmenters (2-D and 3-D) scripted with TorchScript, inputs larger
than their windows, and MONAI's `sliding_window_inference` over them, for the test that kiln's
sliding window gives MONAI's outputs (crates/cli/tests/sliding.rs).

    sliding_monai.py OUT    writes OUT/model3d.pt, OUT/model2d.pt (and down3d.pt, up2d.pt:
                            outputs half and twice the window's size), OUT/volume3d.npy,
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
    # Outputs of another size than the window: half (a strided convolution) and double (an
    # upsampling), with and without padding (whose crop rounds half to even: round(1.5) = 2).
    "down-3d": dict(dims=3, model="down3d", roi=(12, 10, 8), overlap=0.5, mode="gaussian",
                    batch=3),
    "down-padded-3d": dict(dims=3, model="down3d", roi=(30, 10, 8), overlap=0.25,
                           mode="gaussian", batch=2),
    "up-2d": dict(dims=2, model="up2d", roi=(16, 16), overlap=0.25, mode="gaussian", batch=4,
                  sigma=0.2),
}


def segmenter(dims, zoom=None):
    conv = nn.Conv3d if dims == 3 else nn.Conv2d
    last = [conv(8, 3, 3, padding=1)]
    if zoom == "down":
        last = [conv(8, 3, 3, stride=2, padding=1)]
    elif zoom == "up":
        last.append(nn.Upsample(scale_factor=2, mode="nearest"))
    return nn.Sequential(conv(2, 8, 3, padding=1), nn.ReLU(), *last).eval()


def main(out):
    from monai.inferers import sliding_window_inference

    torch.manual_seed(0)
    models, volumes = {}, {}
    for dims, shape in ((3, (2, 23, 19, 17)), (2, (2, 37, 29))):
        models[f"model{dims}d"] = torch.jit.script(segmenter(dims))
        volumes[dims] = torch.randn(shape)
        np.save(f"{out}/volume{dims}d.npy", volumes[dims].numpy())
    models["down3d"] = torch.jit.script(segmenter(3, "down"))
    models["up2d"] = torch.jit.script(segmenter(2, "up"))
    for name, model in models.items():
        model.save(f"{out}/{name}.pt")
    settings = {}
    for name, c in CASES.items():
        padding = c.get("padding", "constant")
        sigma = c.get("sigma", 0.125)
        model = c.get("model", f"model{c['dims']}d")
        with torch.no_grad():
            y = sliding_window_inference(
                volumes[c["dims"]].unsqueeze(0), c["roi"], c["batch"], models[model],
                overlap=c["overlap"], mode=c["mode"], sigma_scale=sigma, padding_mode=padding)
        np.save(f"{out}/monai-{name}.npy", y[0].numpy().astype(np.float32))
        settings[name] = {
            "dims": c["dims"],
            "model": model,
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
