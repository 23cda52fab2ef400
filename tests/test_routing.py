"""Routing by what a parameter is (muongrid/routing.py): the tables of small `transformers` models built from
configs (random weights, no download), the name fallback, the vocabulary-sized warning, and 3-D expert
banks in single-device MuonW (each expert orthogonalised on its own: bit for bit with one 2-D parameter
per expert).
"""
from __future__ import annotations

import os
import re
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # models come from configs: nothing may try the network

import pytest
import torch
import transformers

from muongrid import DistributedMuon, Grid, MuonW, hybrid_param_groups, routing_table
from muongrid.optim import routes_to_muon

transformers.logging.set_verbosity_error()
SMALL = dict(vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=32)


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    T = transformers
    return {
        "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**SMALL)),
        "mixtral": lambda: T.MixtralForCausalLM(T.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **SMALL)),
        "qwen2_moe": lambda: T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
            **SMALL)),
        "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                                                       n_positions=32)),
        "bert": lambda: T.BertForMaskedLM(T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, intermediate_size=48)),
        "t5": lambda: T.T5ForConditionalGeneration(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=48,
                                                              num_layers=1, num_heads=4)),
        "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(vocab_size=100, hidden_size=32,
                                                                 intermediate_size=48, num_hidden_layers=1,
                                                                 num_attention_heads=4)),
        "opt": lambda: T.OPTForCausalLM(T.OPTConfig(vocab_size=100, hidden_size=32, ffn_dim=48, num_hidden_layers=1,
                                                    num_attention_heads=4, word_embed_proj_dim=32)),
    }[name]()


# Per model: the parameters that must go to Muon (a regular expression on the name); everything else AdamW.
HIDDEN = {
    "llama": r"model\.layers\.\d\.(self_attn|mlp)\.\w+_proj\.weight",
    "mixtral": r"model\.layers\.\d\.(self_attn\.[qkvo]_proj\.weight|mlp\.experts\.(gate_up|down)_proj)",
    "qwen2_moe": r"model\.layers\.\d\.(self_attn\.[qkvo]_proj\.weight|mlp\.experts\.(gate_up|down)_proj"
                 r"|mlp\.shared_expert\.\w+_proj\.weight)",
    "gpt2": r"transformer\.h\.\d\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight",
    "bert": r"bert\.encoder\.layer\.\d\.(attention\.self\.(query|key|value)|attention\.output\.dense"
            r"|intermediate\.dense|output\.dense)\.weight|cls\.predictions\.transform\.dense\.weight",
    "t5": r"(en|de)coder\.block\.0\.layer\.\d\.(SelfAttention|EncDecAttention)\.[qkvo]\.weight"
          r"|(en|de)coder\.block\.0\.layer\.\d\.DenseReluDense\.w[io]\.weight",
    "gpt_neox": r"gpt_neox\.layers\.0\.(attention\.(query_key_value|dense)|mlp\.dense_\w+)\.weight",
    "opt": r"model\.decoder\.layers\.0\.(self_attn\.\w+_proj|fc1|fc2)\.weight",
}


@pytest.mark.parametrize("name", list(HIDDEN))
def test_every_hidden_matrix_to_muon_and_the_rest_to_adamw(name):
    model = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no vocabulary-sized matrix went to Muon
        table = routing_table(model)
    muon = {r.name for r in table if r.use_muon}
    assert muon == {n for n, _ in model.named_parameters() if re.fullmatch(HIDDEN[name], n)}, str(table)
    assert [r.name for r in table] == [n for n, _ in model.named_parameters()]   # each tensor once, in order
    # The name fallback (bare named_parameters) routes these models the same way.
    assert [r.optimizer for r in routing_table(model.named_parameters())] == [r.optimizer for r in table]


def why(table, name: str) -> str:
    return next(r for r in table if r.name == name).why


def test_embeddings_and_heads_by_module_whatever_their_names():
    llama, gpt2, t5, opt = build("llama"), build("gpt2"), build("t5"), build("opt")
    t = routing_table(llama)
    assert why(t, "model.embed_tokens.weight") == "embedding (nn.Embedding)"
    assert why(t, "lm_head.weight") == "output head (get_output_embeddings())"
    t = routing_table(gpt2)                                # the head is the embedding: one entry, both names
    entry = next(r for r in t if r.name == "transformer.wte.weight")
    assert entry.tied == ("lm_head.weight",) and not entry.use_muon and "tied to the output head" in entry.why
    assert "lm_head.weight" not in [r.name for r in t]
    t = routing_table(t5)
    assert why(t, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight") == "embedding (nn.Embedding)"
    assert set(next(r for r in t if r.name == "shared.weight").tied) == {
        "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"}
    t = routing_table(opt)
    assert why(t, "model.decoder.embed_positions.weight") == \
        "embedding (OPTLearnedPositionalEmbedding, an nn.Embedding)"


def test_mixture_of_experts_banks_to_muon_routers_to_adamw():
    t = routing_table(build("mixtral"))
    assert why(t, "model.layers.0.mlp.experts.gate_up_proj") == \
        "expert bank (4 matrices 96x32, each orthogonalised)"
    assert why(t, "model.layers.1.mlp.experts.down_proj") == "expert bank (4 matrices 32x48, each orthogonalised)"
    assert why(t, "model.layers.0.mlp.gate.weight") == "MoE router (MixtralTopKRouter)"
    t = routing_table(build("qwen2_moe"))
    assert why(t, "model.layers.0.mlp.gate.weight") == "MoE router (Qwen2MoeTopKRouter)"
    assert not next(r for r in t if r.name == "model.layers.0.mlp.shared_expert_gate.weight").use_muon


class Custom(torch.nn.Module):
    """Names no list knows: the structure decides (a router found beside its expert bank, not by class)."""

    def __init__(self):
        super().__init__()
        self.lookup = torch.nn.Embedding(50, 8)
        self.mixer = torch.nn.Linear(8, 8)
        self.pick = torch.nn.Linear(8, 3, bias=False)                  # one row per expert of `bank`
        self.bank = torch.nn.Module()
        self.bank.w = torch.nn.Parameter(torch.randn(3, 8, 8))        # no "expert" in any name: not a bank
        self.moe = torch.nn.Module()
        self.moe.experts = torch.nn.Module()
        self.moe.experts.w = torch.nn.Parameter(torch.randn(3, 8, 8))
        self.moe.experts.b = torch.nn.Parameter(torch.zeros(3, 8))    # per-expert biases
        self.moe.select = torch.nn.Linear(8, 3, bias=False)           # beside the bank: a router by structure
        self.router = torch.nn.Linear(8, 3, bias=False)                # beside no bank: a router by its name
        self.to_logits = torch.nn.Linear(8, 50, bias=False)


def test_structure_first_then_names():
    model = Custom()
    t = routing_table(model, head=model.to_logits)
    assert t.names("Muon") == ["mixer.weight", "pick.weight", "moe.experts.w"]
    assert why(t, "lookup.weight") == "embedding (nn.Embedding)"               # names would send it to Muon
    assert routes_to_muon("lookup.weight", model.lookup.weight)
    assert why(t, "to_logits.weight") == "output head (head= argument)"
    assert why(t, "bank.w") == "not a matrix (3-D)"
    assert why(t, "moe.experts.b") == "per-expert vectors (3 experts) in Module"
    assert why(t, "moe.select.weight").startswith("MoE router (Linear: one row per expert")
    assert why(t, "router.weight") == "named as an embedding, head or router ('router')"
    for head in ("to_logits", "to_logits.weight", model.to_logits.weight, [model.to_logits]):
        assert why(routing_table(model, head=head), "to_logits.weight") == "output head (head= argument)"


def test_head_argument_errors_name_the_problem():
    model = Custom()
    with pytest.raises(ValueError, match="head='nope' is neither a parameter nor a module"):
        routing_table(model, head="nope")
    with pytest.raises(ValueError, match="not a parameter of the model"):
        routing_table(model, head=torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="head= needs the model"):
        routing_table(model.named_parameters(), head="to_logits")
    with pytest.raises(TypeError, match="pass the model itself or model.named_parameters()"):
        hybrid_param_groups(model.parameters())


@pytest.mark.parametrize("name,muon", [
    # Hugging Face and Meta names for embeddings and heads: AdamW
    ("model.embed_tokens.weight", False), ("gpt_neox.embed_in.weight", False), ("embed_out.weight", False),
    ("shared.weight", False), ("model.decoder.embed_positions.weight", False), ("output.weight", False),
    ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", False), ("tok_embeddings.weight", False),
    ("score.weight", False), ("classifier.out_proj.weight", False), ("lm_head.weight", False),
    # routers
    ("model.layers.0.mlp.gate.weight", False), ("model.layers.0.block_sparse_moe.gate.weight", False),
    # BERT's hidden matrices under containers named "output", Llama's gate_proj, a shared expert: Muon
    ("encoder.layer.0.attention.output.dense.weight", True), ("encoder.layer.0.output.dense.weight", True),
    ("model.layers.0.mlp.gate_proj.weight", True), ("model.layers.0.mlp.shared_expert.up_proj.weight", True),
    ("heads_mixer.weight", True), ("layers.0.shared_mlp.weight", True),
])
def test_name_fallback(name, muon):
    assert routes_to_muon(name, torch.zeros(4, 4)) is muon


def test_name_fallback_on_3d_tensors():
    assert routes_to_muon("model.layers.0.mlp.experts.gate_up_proj", torch.zeros(4, 6, 8))
    assert not routes_to_muon("conv.weight", torch.zeros(4, 6, 8))


def test_vocabulary_sized_matrix_to_muon_warns_naming_it():
    with pytest.warns(UserWarning, match="'0.weight' \\(shape \\(32000, 8\\)\\) goes to Muon.*>= 32000") as seen:
        routing_table(torch.nn.Sequential(torch.nn.Linear(8, 32000, bias=False)))
    assert seen[0].filename == __file__                   # the warning points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        routing_table(torch.nn.Sequential(torch.nn.Linear(8, 31999, bias=False)))
    model = torch.nn.Module()
    model.config = transformers.PretrainedConfig(vocab_size=50)
    model.proj = torch.nn.Linear(8, 50, bias=False)   # the config's vocabulary, an unknown head's name
    with pytest.warns(UserWarning, match="'proj.weight'.*the config's vocab_size 50") as seen:
        groups = hybrid_param_groups(model)
    assert seen[0].filename == __file__
    assert groups[0]["use_muon"] and groups[0]["names"] == ["proj.weight"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not hybrid_param_groups(model, head="proj")[0]["use_muon"]


def test_no_vocabulary_warning_when_the_mlp_width_is_the_vocabulary_size():
    """Issue 50: a Llama whose intermediate_size equals its vocab_size: its MLP matrices are not a missed head."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**dict(SMALL, intermediate_size=100)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        groups = hybrid_param_groups(model)
    assert "model.layers.0.mlp.up_proj.weight" in groups[0]["names"] and groups[0]["use_muon"]
    assert "lm_head.weight" in groups[1]["names"]


def test_hybrid_param_groups_takes_the_model_and_returns_the_table():
    model = build("gpt2")
    groups, table = hybrid_param_groups(model, muon=dict(lr=0.02), adamw=dict(lr=3e-3), return_table=True)
    assert [(g["use_muon"], g["lr"]) for g in groups] == [(True, 0.02), (False, 3e-3)]
    params = dict(model.named_parameters())
    for g in groups:
        assert g["names"] == table.names("Muon" if g["use_muon"] else "AdamW")
        assert all(p is params[n] for n, p in zip(g["names"], g["params"]))
    everything = [p for g in groups for p in g["params"]]
    assert len(everything) == len({id(p) for p in everything}) == len(list(model.parameters()))  # tied: once
    # named_parameters (a generator, read once) gives the same groups here
    by_name = hybrid_param_groups(model.named_parameters(), muon=dict(lr=0.02), adamw=dict(lr=3e-3))
    assert [g["names"] for g in by_name] == [g["names"] for g in groups]
    text = str(table).splitlines()
    assert text[0].split() == ["parameter", "shape", "optimizer", "why"] and len(text) == len(table) + 1
    assert re.match(r"transformer\.wte\.weight = lm_head\.weight\s+100x32\s+AdamW\s+embedding \(nn\.Embedding\) "
                     r"tied to the output head$", text[1])


@pytest.mark.parametrize("adjust_lr", ["match_rms_adamw", "original"])
def test_muonw_orthogonalises_each_expert_of_a_bank_on_its_own(adjust_lr):
    """A (3, 24, 16) bank against three 24 x 16 parameters with the same gradients: bit for bit, 3 steps
    ("original" scales the lr by the matrix's own sqrt(24/16): a bank's shape (3, 24) would give 1)."""
    gen = torch.Generator().manual_seed(0)
    bank = torch.nn.Parameter(torch.randn(3, 24, 16, generator=gen))
    alone = [torch.nn.Parameter(m.detach().clone()) for m in bank]
    hyper = dict(lr=0.02, weight_decay=0.1, adjust_lr=adjust_lr)
    opt_bank, opt_alone = MuonW([bank], **hyper), MuonW(alone, **hyper)
    for _ in range(3):
        grad = torch.randn(3, 24, 16, generator=gen)
        bank.grad = grad.clone()
        for p, g in zip(alone, grad):
            p.grad = g.clone()
        opt_bank.step()
        opt_alone.step()
    assert torch.equal(bank.detach(), torch.stack([p.detach() for p in alone]))
    assert not torch.equal(opt_bank.state[bank]["momentum_buffer"], torch.zeros_like(bank))


def test_mixtral_trains_under_muonw_and_distributed_muon_alike():
    """Every expert of every bank moves under MuonW, and DistributedMuon (one rank here; 2x1 in
    tests/test_hf_models.py) takes the same steps bit for bit: each expert orthogonalised on its own."""
    model, twin = build("mixtral"), build("mixtral")
    opt = MuonW(hybrid_param_groups(model, muon=dict(lr=0.02), adamw=dict(lr=3e-3)))
    dist_opt = DistributedMuon(hybrid_param_groups(twin, muon=dict(lr=0.02), adamw=dict(lr=3e-3)), Grid.single(),
                               layout="owner", ns_batch=True)
    x = torch.randint(100, (2, 16), generator=torch.Generator().manual_seed(0))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for _ in range(3):
        for m, o in ((model, opt), (twin, dist_opt)):
            loss = m(input_ids=x, labels=x).loss
            loss.backward()
            o.step()
            o.zero_grad()
        losses.append(loss.item())
    assert losses[2] < losses[0], losses
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(p, q), n
        if "experts" in n:   # every expert of every bank moved
            assert all(not torch.equal(a, b) for a, b in zip(p.detach(), before[n])), n


def test_the_books_models_route_as_before():
    """The book's recorded runs used the name rule; its models must route the same way now, by model or names."""
    from muongrid.lab.charlm import TinyGPT
    from muongrid.lab.synthetic import build_problem

    model = TinyGPT(65)
    hidden = [n for n, _ in model.named_parameters() if re.fullmatch(r"blocks\.\d\.(qkv|proj|fc|out)\.weight", n)]
    assert len(hidden) == 8
    assert routing_table(model).names("Muon") == routing_table(model.named_parameters()).names("Muon") == hidden
    problem = build_problem("hybrid", [(12, 20), (17, 10)], [0, 1])
    assert [g["names"] for g in problem.param_groups()] == [
        ["layers.0.weight", "layers.1.weight"], ["embed.weight", "layers.0.bias", "layers.1.bias"]]
