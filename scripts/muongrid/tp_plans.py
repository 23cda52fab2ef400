"""Tensor-parallel plans for models people bring, ready for ``parallelize_module``.

    from muongrid.tp_plans import parallelize_llama
    model = transformers.LlamaForCausalLM(config).to(device)  # same weights everywhere
    parallelize_llama(model, grid.mesh["tp"])                 # before the optimizer
    opt = DistributedMuon(hybrid_param_groups(model), grid)   # reads the DTensors

A Hugging Face Llama (Mistral and Qwen2 name their decoder layers the same) splits as
Megatron-LM splits a transformer: q, k, v and the MLP's gate and up projections by rows
(``ColwiseParallel``: each TP rank computes its own attention heads and hidden units),
the attention output and the MLP's down projection by columns (``RowwiseParallel``:
partial products summed over TP); the embedding, the norms and the head stay whole on
every TP rank. ``transformers``' attention reshapes with ``-1`` heads, so it runs on the
local heads as it is. ``tests/test_hf_models.py`` trains a Llama split this way on 2 x 2
against one process (``tests/hf_run.py``).
"""
from __future__ import annotations


def llama_layer_plan() -> dict:
    """The plan for one Llama decoder layer: module path -> ParallelStyle."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"self_attn.q_proj": ColwiseParallel(),    # heads: rows of q, k, v
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(),    # summed over TP
            "mlp.gate_proj": ColwiseParallel(),       # hidden units: rows
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}       # summed over TP


def parallelize_llama(model, tp_mesh) -> None:
    """Split each decoder layer of a ``LlamaForCausalLM`` over ``tp_mesh``, in place."""
    from torch.distributed.tensor.parallel import parallelize_module

    config, tp = model.config, tp_mesh.size()
    for name in ("num_attention_heads", "num_key_value_heads"):
        if getattr(config, name) % tp:
            raise ValueError(f"{name}={getattr(config, name)} must divide by the TP "
                             f"size {tp}: each TP rank runs whole attention heads")
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, llama_layer_plan())
