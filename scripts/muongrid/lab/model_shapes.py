"""The Muon and AdamW parameter shapes of real models, as ``muongrid.plan.ParamSpec`` groups (no weights).

GPT-2 124M, Llama-3-70B, Llama-3-8B, Llama-3.2-1B, and two mixtures of experts with one matrix per routed expert
(Moonlight-16B-A3B, Kimi K2, a 1T-class model); each builder's docstring gives the published configuration
it follows. ``MODELS`` maps a name to (builder, layers). ``muongrid.lab.scale`` prices their ZeRO-1 plans on
large grids (``scripts/plan_at_scale.py``, ``scripts/plan_ep.py``); the time model and chapters 13, 15 and 16
read their shapes.

    from muongrid.lab.model_shapes import MODELS, llama3_8b
    groups, muon = llama3_8b(layers=2)      # [Muon matrices, AdamW tensors], [True, False]
"""
from __future__ import annotations

from muongrid.plan import ParamSpec


def gpt2(layers: int = 12, hidden: int = 768, vocab: int = 50257, positions: int = 1024):
    """GPT-2 124M: hidden 768, 12 layers, fused QKV (2304 x 768), MLP 3072, vocabulary 50,257, 1,024 learned
    positions, the head tied to the embedding. Per layer four Muon matrices (QKV and MLP up colwise: TP split dim
    0; attention out and MLP down rowwise: 1); the embeddings and the layer norms' gains go to AdamW (biases are
    left out: vectors like the gains, they change no Muon shape)."""
    muon = []
    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.qkv", (3 * hidden, hidden), 0), ParamSpec(f"layers.{i}.o", (hidden, hidden), 1),
                 ParamSpec(f"layers.{i}.up", (4 * hidden, hidden), 0), ParamSpec(f"layers.{i}.down", (hidden, 4 * hidden), 1)]
    adamw = [ParamSpec("embed", (vocab, hidden), 0), ParamSpec("embed_positions", (positions, hidden), 0)]
    adamw += [ParamSpec(f"norm.{i}", (hidden,), -1) for i in range(2 * layers + 1)]
    return [muon, adamw], [True, False]


def llama3(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int = 128,
           vocab: int = 128256, tied: bool = False) -> tuple[list[list[ParamSpec]], list[bool]]:
    """(groups, muon flags) of a dense Llama-3: one Muon group with every layer's 7 matrices (q, k, v, gate,
    up colwise: TP split dim 0; o, down rowwise: 1), one AdamW group (embedding, head unless ``tied`` to the
    embedding, norms)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    muon = []
    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.q", (q, hidden), 0), ParamSpec(f"layers.{i}.k", (kv, hidden), 0),
                 ParamSpec(f"layers.{i}.v", (kv, hidden), 0), ParamSpec(f"layers.{i}.o", (hidden, q), 1),
                 ParamSpec(f"layers.{i}.gate", (intermediate, hidden), 0),
                 ParamSpec(f"layers.{i}.up", (intermediate, hidden), 0),
                 ParamSpec(f"layers.{i}.down", (hidden, intermediate), 1)]
    adamw = [ParamSpec("embed", (vocab, hidden), 0)] + ([] if tied else [ParamSpec("head", (vocab, hidden), 0)])
    adamw += [ParamSpec(f"norm.{i}", (hidden,), -1) for i in range(2 * layers + 1)]
    return [muon, adamw], [True, False]


def llama3_70b(layers: int = 80):
    """Llama-3-70B: hidden 8192, intermediate 28672, 80 layers, 64 query / 8 KV heads of 128, vocab 128256."""
    return llama3(8192, 28672, layers, 64, 8)


def llama3_8b(layers: int = 32):
    """Llama-3-8B: hidden 4096, intermediate 14336, 32 layers, 32 query / 8 KV heads of 128, vocab 128256."""
    return llama3(4096, 14336, layers, 32, 8)


def llama3_2_1b(layers: int = 16):
    """Llama-3.2-1B: hidden 2048, intermediate 8192, 16 layers, 32 query / 8 KV heads of 64, vocab 128256, the
    head tied to the embedding (1,235,814,400 parameters: the model of the GPU record's forward + backward)."""
    return llama3(2048, 8192, layers, 32, 8, head_dim=64, tied=True)


def mlp(prefix: str, inter: int, hidden: int) -> list[ParamSpec]:
    """A SwiGLU MLP's three matrices (gate and up colwise: TP split dim 0; down rowwise: 1), for the MoE builders'
    dense layers, shared experts and routed experts."""
    return [ParamSpec(f"{prefix}.gate", (inter, hidden), 0), ParamSpec(f"{prefix}.up", (inter, hidden), 0),
            ParamSpec(f"{prefix}.down", (hidden, inter), 1)]


def moonlight_16b_a3b(layers: int = 27, experts: int = 64):
    """Moonlight-16B-A3B (DeepSeek-V3 architecture), per-expert matrices.

    Config of huggingface.co/moonshotai/Moonlight-16B-A3B (config.json), as restated by the Megatron
    arguments in slime's scripts/models/moonlight.sh: hidden 2048, 27 layers of which the first is dense
    (intermediate 11264) and the other 26 MoE with 64 routed experts (intermediate 1408 each) and 2 shared
    experts (modelled as one MLP of 2 x 1408), 16 heads, vocab 163840. (Some NVIDIA pages say "8 shared
    experts, intermediate 10944": that is not this config.) Attention is MLA without a query LoRA
    (q_lora_rank null): q (16 x (128 + 64), 2048), kv_a (512 + 64, 2048), kv_b (16 x (128 + 128), 512),
    o (2048, 16 x 128).

    Simplified: every 2-D weight of attention and MLPs goes to Muon (the router (64 x 2048), norms, the
    embedding and head to AdamW); each expert's gate/up/down is its own matrix, TP-split like a dense MLP
    (expert tensor parallelism); expert parallelism is not modelled; kv_a is replicated over TP.
    """
    hidden, heads = 2048, 16
    muon, adamw = [], [ParamSpec("embed", (163840, hidden), 0), ParamSpec("head", (163840, hidden), 0)]

    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.q", (heads * 192, hidden), 0), ParamSpec(f"layers.{i}.kv_a", (576, hidden), -1),
                 ParamSpec(f"layers.{i}.kv_b", (heads * 256, 512), 0), ParamSpec(f"layers.{i}.o", (hidden, heads * 128), 1)]
        if i == 0:
            muon += mlp(f"layers.{i}.mlp", 11264, hidden)
        else:
            muon += mlp(f"layers.{i}.shared", 2 * 1408, hidden)
            for e in range(experts):
                muon += mlp(f"layers.{i}.expert.{e}", 1408, hidden)
            adamw.append(ParamSpec(f"layers.{i}.router", (experts, hidden), -1))
        adamw += [ParamSpec(f"layers.{i}.norm.{j}", (n,), -1) for j, n in enumerate((hidden, hidden, 512))]
    return [muon, adamw], [True, False]


def kimi_k2(layers: int = 61, experts: int = 384):
    """Kimi K2, the 1T-class MoE (about 1.03 x 10^12 parameters here), per-expert matrices.

    Config of huggingface.co/moonshotai/Kimi-K2-Instruct (config.json) and the Kimi K2 technical report
    (arXiv:2507.20534, its architecture table): DeepSeek-V3's architecture with hidden 7168, 61 layers of which
    the first is dense (intermediate 18432) and the other 60 MoE with 384 routed experts (intermediate 2048
    each) and 1 shared expert (2048), 64 heads, vocab 163840. Attention is MLA with a query LoRA of rank 1536:
    q_a (1536, 7168), q_b (64 x (128 + 64), 1536), kv_a (512 + 64, 7168), kv_b (64 x (128 + 128), 512),
    o (7168, 64 x 128). The same simplifications as ``moonlight_16b_a3b``; q_a and kv_a are replicated over TP.
    """
    hidden, heads = 7168, 64
    muon, adamw = [], [ParamSpec("embed", (163840, hidden), 0), ParamSpec("head", (163840, hidden), 0)]

    for i in range(layers):
        muon += [ParamSpec(f"layers.{i}.q_a", (1536, hidden), -1), ParamSpec(f"layers.{i}.q_b", (heads * 192, 1536), 0),
                 ParamSpec(f"layers.{i}.kv_a", (576, hidden), -1), ParamSpec(f"layers.{i}.kv_b", (heads * 256, 512), 0),
                 ParamSpec(f"layers.{i}.o", (hidden, heads * 128), 1)]
        if i == 0:
            muon += mlp(f"layers.{i}.mlp", 18432, hidden)
        else:
            muon += mlp(f"layers.{i}.shared", 2048, hidden)
            for e in range(experts):
                muon += mlp(f"layers.{i}.expert.{e}", 2048, hidden)
            adamw.append(ParamSpec(f"layers.{i}.router", (experts, hidden), -1))
        adamw += [ParamSpec(f"layers.{i}.norm.{j}", (n,), -1) for j, n in enumerate((hidden, hidden, 1536, 512))]
    return [muon, adamw], [True, False]


MODELS = {"gpt2-124m": (gpt2, 12), "llama3-70b": (llama3_70b, 80), "llama3-8b": (llama3_8b, 32), "llama3.2-1b": (llama3_2_1b, 16),
          "moonlight-16b-a3b": (moonlight_16b_a3b, 27), "kimi-k2": (kimi_k2, 61)}
