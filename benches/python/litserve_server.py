"""The serving peer of kiln's serve benchmark (`cargo xtask bench --suite serve`): LitServe serving
the suite's MLP with the very weights kiln serves (--weights, kiln's safetensors: fc0, fc1, ...,
head), one CPU worker with --threads threads, dynamic batching (--max-batch, --batch-timeout-ms)
at POST /v1/predict, which takes and answers kiln's JSON bodies (`{"inputs": [784 floats]}`,
`{"outputs": [10 floats], "shape": [10]}`); GET /health says when it is ready.
"""
from common import open_safetensors, parser  # numpy's warning filtered there
import litserve as ls  # noqa: E402
import torch  # noqa: E402


def load_mlp(path):
    """The MLP of kiln's safetensors file: Linear layers fc0, fc1, ..., head, ReLU between."""
    tensors = open_safetensors(path)

    def linear(prefix):
        [w] = [v for k, v in tensors.items() if k.endswith(prefix + ".weight")]
        [b] = [v for k, v in tensors.items() if k.endswith(prefix + ".bias")]
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        lin.load_state_dict({"weight": w, "bias": b})  # copies out of the mapped file
        return lin

    hidden = sorted({k.rsplit(".", 2)[-2] for k in tensors if ".fc" in "." + k},
                    key=lambda name: int(name[2:]))
    layers = [m for h in hidden for m in (linear(h), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers, linear("head"))


class MlpAPI(ls.LitAPI):
    def __init__(self, weights, threads, **kwargs):
        super().__init__(**kwargs)
        self.weights, self.threads = weights, threads

    def setup(self, device):
        torch.set_num_threads(self.threads)
        self.model = load_mlp(self.weights).eval()

    def decode_request(self, request):
        return torch.tensor(request["inputs"], dtype=torch.float32)

    def batch(self, inputs):
        return torch.stack(inputs)

    def predict(self, x):
        with torch.inference_mode():
            return self.model(x)

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return {"outputs": output.tolist(), "shape": list(output.shape)}


def main():
    p = parser(__doc__, port=int, max_batch=64, batch_timeout_ms=2.0, threads=1)
    p.add_argument("--weights", required=True, help="kiln's MLP as safetensors")
    a = p.parse_args()
    api = MlpAPI(a.weights, a.threads, max_batch_size=a.max_batch,
                 batch_timeout=a.batch_timeout_ms / 1000.0, api_path="/v1/predict")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=a.port, num_api_servers=1, generate_client_file=False,
               log_level="warning")


if __name__ == "__main__":
    main()
