"""Records torch's nn.TransformerEncoder, built by ProtoMotions' own
`Transformer` (agents/common/transformer.py), for the unit tests of
crates/policy/src/transformer.rs (tests/transformer.rs).

    python testdata/policy/record_transformer.py --root PATH/TO/ProtoMotions

Writes testdata/policy/transformer_encoder/{weights,cases}.safetensors:
weights: `<act>.layers.{i}.*` (the seqTransEncoder's state dict, perturbed
deterministically so that no bias is zero and no LayerNorm is the identity);
cases: `x` [4, 7, 16], `key_padding` [4, 7] u8 (row 0 none, row 1 the last 3,
row 2 all but the first, row 3 every key), `additive` [7, 7] (a causal mask
with a 2-token context prefix: -inf above, 0 elsewhere), `additive_soft`
(the same -inf, small finite values elsewhere), and for each activation
and mask case (none, pad, add, both; soft: slow and f64 only) the output
of torch's slow path (grad enabled: `<act>.<case>.slow`), of its eval fast
path (no_grad, the path ProtoMotions' inference takes: `<act>.<case>.fast`)
and of the slow path in float64 (`<act>.<case>.f64`).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from pm_reference import reexec_deterministic, write_safetensors  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", default=os.path.join(HERE, "transformer_encoder"))
    args = ap.parse_args()
    reexec_deterministic()
    sys.path.insert(0, args.root)
    import warnings
    import torch
    from protomotions.agents.common.transformer import Transformer
    from protomotions.agents.common.config import TransformerConfig
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)

    d, heads, ff, layers, B, S = 16, 4, 24, 2, 4, 7
    g = torch.Generator().manual_seed(2201)
    x = torch.randn(B, S, d, generator=g) * 1.5
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, 4:] = True
    pad[2, 1:] = True
    pad[3, :] = True
    prefix = 2
    soft = torch.randn(S, S, generator=g) * 0.5
    add = torch.zeros(S, S)
    for i in range(S):
        for j in range(S):
            if j > i and j >= prefix:
                add[i, j] = soft[i, j] = float("-inf")
    weights = {}
    cases = {"x": x, "key_padding": pad.to(torch.uint8), "additive": add, "additive_soft": soft}
    for act in ["relu", "gelu"]:
        cfg = TransformerConfig(in_keys=["tok"], out_keys=["out"], transformer_token_size=d, latent_dim=d,
                                num_heads=heads, ff_size=ff, num_layers=layers, dropout=0.0, activation=act,
                                output_activation=None)
        torch.manual_seed(7)
        model = Transformer(cfg).eval()
        enc = model.seqTransEncoder
        with torch.no_grad():
            for name, p in enc.named_parameters():
                noise = torch.randn(p.shape, generator=g)
                if name.endswith("norm1.weight") or name.endswith("norm2.weight"):
                    p.copy_(1.0 + 0.3 * noise)
                elif name.endswith("bias"):
                    p.copy_(0.2 * noise)
                else:
                    p.add_(0.1 * noise * p.abs().mean())
        for name, p in enc.state_dict().items():
            weights[f"{act}.{name}"] = p.clone()
        enc64 = __import__("copy").deepcopy(enc).double()
        for case, kw in {"none": {}, "pad": {"src_key_padding_mask": pad}, "add": {"mask": add},
                         "both": {"mask": add, "src_key_padding_mask": pad}, "soft": {"mask": soft}}.items():
            kw64 = {k: (v.double() if v.dtype == torch.float32 else v) for k, v in kw.items()}
            with torch.enable_grad():
                cases[f"{act}.{case}.slow"] = enc(x, **kw).detach()
                cases[f"{act}.{case}.f64"] = enc64(x.double(), **kw64).detach()
            if case != "soft":
                # (the fast path reads a float mask as a boolean one: finite
                # nonzero entries would mask their key, so "soft" has none)
                with torch.no_grad():
                    cases[f"{act}.{case}.fast"] = enc(x, **kw)
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(torch, os.path.join(args.out, "weights.safetensors"), weights)
    write_safetensors(torch, os.path.join(args.out, "cases.safetensors"), cases)
    print("torch", torch.__version__, "->", args.out)


if __name__ == "__main__":
    main()
