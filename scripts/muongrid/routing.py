"""Which optimizer each parameter gets in the hybrid (Muon for hidden matrices, AdamW for the rest), decided
by what the parameter is, with the reason written down.

    >>> table = routing_table(model)                  # a torch.nn.Module (or model.named_parameters())
    >>> print(table)                                  # one line per tensor: name, shape, optimizer, why
    >>> groups, table = hybrid_param_groups(model, muon={"lr": 0.02}, adamw={"lr": 3e-3}, return_table=True)

Given a model, the rules run in this order; the first that applies decides:

1. **Embeddings -> AdamW.** Every parameter of an ``nn.Embedding`` (subclasses too: OPT's learned positions,
   Gemma's scaled embedding, T5's ``relative_attention_bias``), whatever its name. An embedding is a lookup:
   each row moves only when its token appears, and orthogonalising the table mixes rows that were never used.
2. **The output head -> AdamW.** ``model.get_output_embeddings()`` where the model has it (Hugging Face
   models), and whatever ``head=`` names (a module, a parameter or a name). A head tied to its embedding
   (GPT-2, Gemma, T5) is the embedding's parameter and appears once, with both names.
3. **Not a matrix -> AdamW**: vectors (biases, norm gains), scalars, 4-D convolutions, and 3-D tensors that
   are not expert banks.
4. **Expert banks -> Muon.** A 3-D parameter of a mixture-of-experts module (transformers 5 stores a MoE
   layer's experts as one experts x out x in tensor: Mixtral's and Qwen2-MoE's ``experts.gate_up_proj`` and
   ``experts.down_proj``) is a bank of matrices: Muon orthogonalises each expert's matrix on its own (the
   Newton-Schulz batch). A 2-D parameter of the same module is one bias vector per expert -> AdamW.
5. **Routers -> AdamW.** A module whose class name says ``Router`` (Mixtral's ``MixtralTopKRouter``), or a
   2-D parameter beside an expert bank with one row per expert: its rows are per-expert logits, like a head's.
6. **Names, last**: a matrix whose name says embedding or head (``NAMES_ANYWHERE`` as any dotted component,
   ``NAMES_OF_OWNER`` as the name of the module that holds it) -> AdamW. This catches the heads structure
   cannot see (a classifier's ``score``, Meta's Llama ``output``).
7. Every other 2-D parameter is a hidden matrix -> Muon.

Given bare ``(name, tensor)`` pairs (``model.named_parameters()``), rules 1, 2 and 5 cannot run and names
stand in: an expert bank is a 3-D tensor with ``expert`` in a component of its name, a router a
matrix held by a module named ``gate`` or ``router``. Pass the model where you can.

Every matrix routed to Muon with a vocabulary-sized side is reported with a ``warnings.warn`` naming it: it is
probably an embedding or head these rules missed (pass ``head=``, or build the groups yourself). A side is
vocabulary-sized when it equals the model's ``config.vocab_size`` (unless another width of the config, such as
``intermediate_size``, is the same number: no warning then), or, where no config says it, when it is
``VOCAB_SIZED`` or more (not used where the config is known: Llama 3.1 405B's MLP matrices have 53,248 rows).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Iterable

import torch

MUON, ADAMW = "Muon", "AdamW"
VOCAB_SIZED = 32000   # the smallest vocabulary of the common LLM tokenizers (Llama 2, Mistral 7B v0.1)

# Dotted name components that mark an embedding or a head wherever they appear in the name.
NAMES_ANYWHERE = {"embed", "embedding", "embeddings", "embed_tokens", "embed_in", "embed_out", "embed_positions",
                  "tok_embeddings", "word_embeddings", "position_embeddings", "token_type_embeddings",
                  "wte", "wpe", "relative_attention_bias", "lm_head", "head", "classifier"}
# Names that mark an embedding, a head or a router only as the module that holds the parameter itself:
# as a container they are common for hidden matrices (BERT's attention.output.dense, output.dense).
NAMES_OF_OWNER = {"output", "shared", "score", "gate", "router", "shared_expert_gate"}


@dataclass(frozen=True)
class RoutingRow:
    """One tensor's routing: its name (the first, if tied), shape, optimizer (MUON or ADAMW), the rule that
    decided, the other names the same tensor has (a tied head), and the tensor itself."""
    name: str
    shape: tuple[int, ...]
    optimizer: str
    why: str
    tied: tuple[str, ...] = ()
    param: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def use_muon(self) -> bool:
        return self.optimizer == MUON


class RoutingTable(list):
    """A list of ``RoutingRow``, in the order of the model's parameters; ``print(table)`` shows it as a table."""

    def names(self, optimizer: str) -> list[str]:
        """The names routed to ``optimizer`` ("Muon" or "AdamW")."""
        return [r.name for r in self if r.optimizer == optimizer]

    def __str__(self) -> str:
        rows = [(r.name + "".join(f" = {t}" for t in r.tied), "x".join(map(str, r.shape)) or "scalar",
                 r.optimizer, r.why) for r in self]
        head = ("parameter", "shape", "optimizer", "why")
        widths = [max(len(row[i]) for row in [head, *rows]) for i in range(3)]
        return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip()
                         for a, b, c, d in [head, *rows])


def name_route(name: str) -> str | None:
    """The name rule alone: why ``name`` marks an embedding, head or router, or None where it does not."""
    parts = name.lower().split(".")
    owner = parts[-2] if len(parts) > 1 else ""
    hit = sorted(set(parts) & NAMES_ANYWHERE) or ([owner] if owner in NAMES_OF_OWNER else [])
    if hit:
        return f"named as an embedding, head or router ({hit[0]!r})"
    return None


def routes_to_muon(name: str, param: torch.Tensor) -> bool:
    """The rule for one bare ``(name, tensor)`` pair: no model, so names stand in for modules."""
    return _route_by_name(name, param)[0] == MUON


def routing_table(model_or_named, head=None, _stacklevel: int = 2) -> RoutingTable:
    """Route every parameter of ``model_or_named`` (an ``nn.Module``, or ``(name, tensor)`` pairs) to Muon or
    AdamW by the rules in this module's docstring; a tensor that appears under several names (tied) appears
    once. ``head``: the output head where the model does not say it (a module, parameter or name, or a list).
    Warns, naming it, about each matrix with a vocabulary-sized side routed to Muon."""
    if isinstance(model_or_named, torch.nn.Module):
        table, vocab = _route_module(model_or_named, head), _vocab_size(model_or_named)
        explained = vocab is None and isinstance(getattr(getattr(model_or_named, "config", None), "vocab_size",
                                                         None), int)   # a width equal to the vocabulary
    else:
        if head is not None:
            raise TypeError("head= needs the model: pass hybrid_param_groups(model, head=...) or "
                            "routing_table(model, head=...), not named parameters")
        table, vocab, explained = _route_named(model_or_named), None, False
    for r in table:
        _warn_if_vocab_sized(r, vocab, _stacklevel + 1, explained)
    return table


def _entries(named: Iterable) -> list[tuple[torch.Tensor, list[str]]]:
    """``(tensor, names)`` in first-seen order, one entry per distinct tensor."""
    seen: dict[int, tuple[torch.Tensor, list[str]]] = {}
    for item in named:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], torch.Tensor)):
            raise TypeError(f"expected (name, tensor) pairs or an nn.Module, got {type(item).__name__}: pass the "
                            "model itself or model.named_parameters() (names are what the routing reads)")
        name, p = item
        seen.setdefault(id(p), (p, []))[1].append(name)
    return list(seen.values())


def _route_named(named: Iterable) -> RoutingTable:
    return RoutingTable(RoutingRow(names[0], tuple(p.shape), *_route_by_name(names[0], p), tuple(names[1:]), p)
                        for p, names in _entries(named))


def _route_by_name(name: str, p: torch.Tensor) -> tuple[str, str]:
    """(optimizer, why) from the name and dimensionality alone."""
    parts = name.lower().split(".")
    if p.ndim == 3 and any("expert" in part for part in parts[:-1]):
        return MUON, f"expert bank ({p.shape[0]} matrices, each orthogonalised), by its name"
    if p.ndim != 2:
        return ADAMW, f"not a matrix ({p.ndim}-D)"
    why = name_route(name)
    return (ADAMW, why) if why else (MUON, "hidden matrix")


def _route_module(model: torch.nn.Module, head) -> RoutingTable:
    modules = dict(model.named_modules(remove_duplicate=False))
    embeddings = {id(p): "nn.Embedding" if type(m) is torch.nn.Embedding else f"{type(m).__name__}, an nn.Embedding"
                  for m in modules.values() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    heads = _head_params(model, modules, head)
    banks = {name for name, m in modules.items() if _is_expert_bank(name, m)}
    table = RoutingTable()
    for p, names in _entries(model.named_parameters(remove_duplicate=False)):
        optimizer, why = _route_one(p, names[0], modules, embeddings, heads, banks)
        table.append(RoutingRow(names[0], tuple(p.shape), optimizer, why, tuple(names[1:]), p))
    return table


def _route_one(p, name, modules, embeddings, heads, banks) -> tuple[str, str]:
    owner_name = name.rpartition(".")[0]
    owner = modules[owner_name]
    if id(p) in embeddings:
        tied = " tied to the output head" if id(p) in heads else ""
        return ADAMW, f"embedding ({embeddings[id(p)]}){tied}"
    if id(p) in heads:
        return ADAMW, f"output head ({heads[id(p)]})"
    if p.ndim == 3 and owner_name in banks:
        return MUON, f"expert bank ({p.shape[0]} matrices {p.shape[1]}x{p.shape[2]}, each orthogonalised)"
    if p.ndim != 2:
        return ADAMW, f"not a matrix ({p.ndim}-D)"
    if owner_name in banks:
        return ADAMW, f"per-expert vectors ({p.shape[0]} experts) in {type(owner).__name__}"
    parent = modules.get(owner_name.rpartition(".")[0]) if owner_name else None
    if any("router" in type(m).__name__.lower() for m in (owner, parent) if m is not None):
        return ADAMW, f"MoE router ({type(owner).__name__})"
    if _beside_experts(p, owner_name, modules, banks):
        return ADAMW, f"MoE router ({type(owner).__name__}: one row per expert of the bank beside it)"
    why = name_route(name)
    return (ADAMW, why) if why else (MUON, "hidden matrix")


def _is_expert_bank(name: str, module: torch.nn.Module) -> bool:
    """A module that holds a mixture of experts' stacked matrices itself (a 3-D parameter), and whose class
    or own name says ``expert`` (``MixtralExperts``, ``experts``)."""
    own = name.rpartition(".")[2]
    return (any(q.ndim == 3 for q in module.parameters(recurse=False))
            and ("expert" in type(module).__name__.lower() or "expert" in own.lower()))


def _beside_experts(p: torch.Tensor, owner_name: str, modules: dict, banks: set) -> bool:
    """Whether the module holding ``p`` has a sibling expert bank with ``p.shape[0]`` experts."""
    parent = owner_name.rpartition(".")[0]
    for bank in banks:
        if bank != owner_name and bank.rpartition(".")[0] == parent:
            if any(q.ndim == 3 and q.shape[0] == p.shape[0] for q in modules[bank].parameters(recurse=False)):
                return True
    return False


def _head_params(model: torch.nn.Module, modules: dict, head) -> dict[int, str]:
    """id -> how it was found, for each parameter of the output head(s)."""
    found: dict[int, str] = {}
    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            out = get()
        except (NotImplementedError, AttributeError):
            out = None
        if isinstance(out, torch.nn.Module):
            found.update((id(p), "get_output_embeddings()") for p in out.parameters())
    params = dict(model.named_parameters(remove_duplicate=False))
    for h in head if isinstance(head, (list, tuple)) else ([] if head is None else [head]):
        if isinstance(h, str):
            if h not in params and h not in modules:
                raise ValueError(f"head={h!r} is neither a parameter nor a module of the model")
            h = params.get(h, modules.get(h))
        tensors = list(h.parameters()) if isinstance(h, torch.nn.Module) else [h]
        if not all(any(t is q for q in params.values()) for t in tensors):
            raise ValueError("head= names a tensor that is not a parameter of the model")
        found.update((id(t), "head= argument") for t in tensors)
    return found


def _vocab_size(model: torch.nn.Module) -> int | None:
    """The config's ``vocab_size``, or None where it has none, or where another of its widths (an
    ``intermediate_size`` equal to the vocabulary, say) is the same number: the shape then cannot tell a missed
    head from that layer's matrices, and the rules above routed the model's embeddings and head by module."""
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int):
        return None
    widths = {v for k, v in getattr(config, "__dict__", {}).items() if k != "vocab_size" and isinstance(v, int)
              and not isinstance(v, bool) and k.endswith(("_size", "_dim", "_embd"))}
    return None if vocab in widths else vocab


def _warn_if_vocab_sized(r: RoutingRow, vocab: int | None, stacklevel: int, explained: bool = False) -> None:
    if not (r.use_muon and len(r.shape) == 2):
        return
    sized = vocab in r.shape if vocab is not None else max(r.shape) >= VOCAB_SIZED and not explained
    if sized:
        size = f"the config's vocab_size {vocab}" if vocab is not None else f">= {VOCAB_SIZED}"
        warnings.warn(f"{r.name!r} (shape {r.shape}) goes to Muon but has a vocabulary-sized side ({size}): if it "
                      "is an embedding or output head, pass the model, and head= if the model does not say it "
                      "(hybrid_param_groups(model, head=...)), so it goes to AdamW", stacklevel=stacklevel)
