"""The trained models of Liu et al. 2026's MLRA release (github.com/SongtaoLiu0823/MLRA; on the Hub: Soughing/MLRA) as
gla.GPT: the release's GQA, MLA and GLA-2 loaded under our names, sampled, and scored on llm.c's shards.

    pip install huggingface_hub tiktoken
    hf download Soughing/MLRA --include "main/gla_2/*" --local-dir mlra    # 11.5 GB of float32 weights
    python bench/release.py mlra/main/gla_2 --prompt "The capital of France is" --dtype bfloat16
    python bench/release.py mlra/main/gla_2 --data /path/to/llm.c/dev/data/edu_fineweb10B   # and its loss there

The release's math is gla.py's to float32 rounding: bench/test_bench.py writes the release's forward again from its
names and compares. Its checkpoints are transformers' save_pretrained output: config.json and float32
pytorch_model*.bin files. A folder that is not one, or tiktoken missing: one line, exit status 1.
"""
import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import gla  # noqa: E402
import train  # noqa: E402

# The release's names and ours.
RELEASE_MODEL = {"transformer.wte": "tok_emb", "layernorm": "norm"}
RELEASE_BLOCK = {  # under transformer.h.{i}. and blocks.{i}.
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "mlp_norm",
    "mlp.c_fc1": "mlp.w1",  # silu(x c_fc1) * (x c_fc2)
    "mlp.c_fc2": "mlp.w2",
    "mlp.c_proj": "mlp.w3",
}
# The attention's names tell the designs apart. kv_b_proj[_j], latent head j's up-projection, is (H/g * (nope + v), r)
# head by head [k_nope | v], where our wkv_b[j] is the same matrix as (H/g, nope + v, r).
LATENT_QUERY = {"attn.q_a_proj": "attn.wq_a", "attn.q_a_layernorm": "attn.q_norm", "attn.q_b_proj": "attn.wq_b",
                "attn.kv_a_proj_with_mqa": "attn.wkv_a", "attn.c_proj": "attn.wo"}
RELEASE_ATTENTION = {
    "gqa": {"attn.c_q": "attn.wq", "attn.c_k": "attn.wk", "attn.c_v": "attn.wv", "attn.c_proj": "attn.wo"},
    "mla": {**LATENT_QUERY, "attn.kv_a_layernorm": "attn.kv_norm.0", "attn.kv_b_proj": "attn.wkv_b.0"},
    "gla": {**LATENT_QUERY, "attn.kv_a_layernorm_1": "attn.kv_norm.0", "attn.kv_b_proj_1": "attn.wkv_b.0",
            "attn.kv_a_layernorm_2": "attn.kv_norm.1", "attn.kv_b_proj_2": "attn.wkv_b.1"},
}


def from_pretrained(path, dtype=None):
    """The gla.GPT of a model folder of the release (GQA, MLA or GLA-2), in dtype (None: float32, as saved,
    memory-mapped)."""
    path = pathlib.Path(path)
    saved = json.loads((path / "config.json").read_text())
    files = sorted(path.glob("pytorch_model*.bin"))  # one file, or shards -00001-of-0000n, ...: in order
    assert files, f"{path} holds no pytorch_model*.bin"
    weights = {}
    lm_head = None  # tied to wte: one matrix, saved under one name or both, converted once
    for file in files:  # shard by shard: a shard's float32 pages are let go once it is converted
        for name, tensor in torch.load(file, map_location="cpu", mmap=True, weights_only=True).items():
            if name == "lm_head.weight":
                lm_head = tensor
            else:
                weights[name] = tensor if dtype is None else tensor.to(dtype)
    if "transformer.wte.weight" not in weights:
        weights["transformer.wte.weight"] = lm_head if dtype is None else lm_head.to(dtype)
    prefix = "transformer.h.0."
    layer0 = sorted(n[len(prefix):-len(".weight")] for n in weights if n.startswith(prefix + "attn."))
    designs = [attn for attn, names in RELEASE_ATTENTION.items() if sorted(names) == layer0]
    assert designs, f"{path}: layer 0's attention holds {layer0}: not the release's GQA, MLA or GLA-2"
    attn = designs[0]
    fields = dict(attn=attn, vocab_size=saved["vocab_size"], block_size=saved["block_size"],
                  n_layer=saved["n_layer"], n_embd=saved["n_embd"], n_head=saved["n_head"],
                  ffn_hidden=saved["intermediate_size"])  # the MLP width as trained, not the width rule's
    if attn == "gqa":  # group_size: query heads per KV head
        fields.update(head_dim=saved["head_dim"], n_kv_head=saved["n_head"] // saved.get("group_size", 1))
    else:  # v as wide as nope, and GLA's 2 latent heads: fixed in the release's code, not in config.json
        fields.update(head_dim=None, n_kv_head=None, q_lora_rank=saved["q_lora_rank"],
                      kv_lora_rank=saved["kv_lora_rank"], qk_nope_head_dim=saved["qk_nope_head_dim"],
                      qk_rope_head_dim=saved["qk_rope_head_dim"], v_head_dim=saved["qk_nope_head_dim"],
                      n_latent_heads=2 if attn == "gla" else 1)
    with torch.device("meta"):  # no memory: the loaded tensors become the parameters
        model = gla.GPT(gla.GPTConfig(**fields))

    names = {f"{theirs}.weight": f"{ours}.weight" for theirs, ours in RELEASE_MODEL.items()}
    for i in range(model.config.n_layer):
        for theirs, ours in {**RELEASE_BLOCK, **RELEASE_ATTENTION[attn]}.items():
            names[f"transformer.h.{i}.{theirs}.weight"] = f"blocks.{i}.{ours}.weight"
    state = {}
    for theirs, tensor in weights.items():
        assert theirs in names, f"{path}: {theirs} is no weight of the release's {attn} (a bias? another design?)"
        state[names[theirs]] = tensor
    for i in range(model.config.n_layer if attn != "gqa" else 0):  # latent head j's kv_b_proj: our wkv_b[j]
        heads = [state.pop(f"blocks.{i}.attn.wkv_b.{j}.weight") for j in range(model.config.n_latent_heads)]
        state[f"blocks.{i}.attn.wkv_b"] = torch.stack(heads).unflatten(1, (model.config.n_head // len(heads), -1))
    state["lm_head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state, assign=True)  # names and shapes checked there
    model.lm_head.weight = model.tok_emb.weight  # assign gave each name a Parameter of its own: tie them again
    return model


def load_shards(spec, config):
    """train.py's data of --data: llm.c's GPT-2 token shards only (the release's tokens), its errors as release.py's."""
    try:
        data = train.load_data(spec, config.block_size, config.vocab_size)
    except SystemExit as e:
        raise SystemExit(str(e.code).replace("train.py: ", "release.py: --data: ", 1)) from None
    if data.tokenizer != "gpt2":
        raise SystemExit(f"release.py: --data {spec}: the release reads GPT-2 tokens: a folder of llm.c's token shards")
    return data


def sample_and_score(args, model, encoding, device):
    """Print the model's text from --prompt and the time it took; with --data, its mean validation loss."""
    data = load_shards(args.data, model.config) if args.data else None  # before the sample: a bad --data fails fast
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    prompt = torch.tensor([encoding.encode(args.prompt)], device=device)
    tokens = model.generate(prompt, args.max_new_tokens, args.temperature, args.top_k)
    seconds = time.perf_counter() - started
    print(f"{encoding.decode(tokens[0].tolist())}\n-- {args.max_new_tokens} new tokens in {seconds:.3f} s")
    if data is not None:  # validation windows 0 .. eval_iters - 1 in --seed's order, as train.py reads them
        total = 0.0
        for k in range(args.eval_iters):
            x, y = train.get_batch(data, "val", k, 1, model.config.block_size, args.seed)
            with torch.no_grad():
                total += model(x.to(device), y.to(device))[1].item()
        print(f"-- validation loss {total / args.eval_iters:.4f} nats a token over {args.eval_iters} windows")


def main(argv=None):
    """Load a release folder, then sample_and_score it. Bad input and Ctrl-C end in one line on stderr."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="a model folder of the release: config.json and pytorch_model*.bin")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max_new_tokens", type=train.positive, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top_k", type=int, default=200, help="0: all")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--data", help="a folder of llm.c's GPT-2 token shards: the loss on its validation windows too")
    p.add_argument("--eval_iters", type=train.positive, default=20, help="validation windows, one a forward")
    p.add_argument("--seed", type=int, default=1337, help="the sample's draws and the validation windows' order")
    args = p.parse_args(argv)
    if not args.temperature >= 0 or args.top_k < 0:  # NaN fails the first
        p.error("--temperature and --top_k must be 0 or more")
    try:
        import tiktoken
    except ImportError:
        raise SystemExit("release.py: the release's GPT-2 tokens need tiktoken: pip install tiktoken") from None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        model = from_pretrained(args.folder, getattr(torch, args.dtype))
    except (OSError, ValueError, KeyError, AssertionError, RuntimeError) as e:  # missing, cut, or another model
        reason = " ".join(str(e).split())  # torch's messages span lines
        raise SystemExit(f"release.py: cannot load {args.folder} ({type(e).__name__}: {reason})") from None
    try:
        sample_and_score(args, model.to(device).eval(), tiktoken.get_encoding("gpt2"), device)
    except AssertionError as e:  # gla.py's: an empty prompt, or one that with --max_new_tokens passes block_size
        raise SystemExit(f"release.py: {e}") from None
    except KeyboardInterrupt:
        print("release.py: stopped", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
