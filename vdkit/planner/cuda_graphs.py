"""What per-layer CUDA graphs (``train.cuda_graphs=layer``) keep beside the eager activations: the plan's bytes and line.

The engine renders megatron-core 0.16.1's ``cuda_graph_impl=transformer_engine`` (vdkit.recipes.bridge.cuda_graphs):
``TECudaGraphHelper`` hands Transformer Engine 2.12's ``make_graphed_callables`` (pytorch/graph.py) one set of
static inputs per graphed layer and captured micro batch (megatron/core/transformer/cuda_graphs.py:1853-2031), all
graphs sharing one memory pool. What that keeps, per layer and micro batch in flight:

- the layer's static ``hidden_states`` input, bf16 ``seq/CP (/TP with SP) x b x h`` (transformer/module.py:225-251):
  a replay copies the real input into it (graph.py ``static_input_surface[i].copy_``), and the graph's backward
  reads it, so it sits beside the previous layer's output that eager training would have kept alone: one more
  layer input per layer in flight (STATIC_HIDDEN_BYTES);
- its static ``attention_mask``, a bool ``b x 1 x seq/CP x seq`` causal mask (transformer/transformer_layer.py
  :920-940): ``b s^2 / CP`` bytes (8192 tokens at CP 2: 33.5 MB a layer);
- how many sets: with PP = 1 one micro batch is captured and every layer's forward runs before any backward, so no
  set is reused: one per layer (cuda_graphs.py:2046-2053, :1960-2008); with PP > 1 a set per layer and micro batch,
  reused once that micro batch's backward is done - the layers in flight of the 1F1B schedule
  (vdkit.planner.memory.layers_in_flight);
- one shared ``hidden_states``-sized gradient-output buffer (TE >= 2.7's ``_reuse_graph_input_output_buffers``,
  graph.py:615-628), and a RoPE table of ``seq/CP x head_dim`` fp32 shared by every layer (cuda_graphs.py:1861-1873):
  under 0.01 GB, counted with the buffer.

The pool itself holds what the graphed layers allocate while captured - their saved activations and each layer's
working set, which the activation model counts already - but a pool's blocks serve graph replays only, so its
fragmentation beside the eager allocator is workload dependent: not counted, and the plan line says so (NOTE).
"""
from __future__ import annotations

MASK_BYTES = 1.0  # torch.bool, the static attention mask's element
STATIC_HIDDEN_BYTES = 2.0  # torch.bfloat16, the static hidden_states' element (module.py:245-250, whatever the precision)
ROPE_BYTES = 4.0  # fp32 RoPE table (rotary_pos_emb)
NOTE = ("per-layer CUDA graphs (train.cuda_graphs=layer: megatron-core's transformer_engine capture): the memory "
        "counts each graphed layer's static input and causal mask per micro batch in flight ({gb:.2f} GB); the graph "
        "pool's fragmentation is workload dependent and not counted - measure the first steps' peak")


def layer_set_bytes(s: float, seq: int, b: int, h: int, tp: int, sequence_parallel: bool) -> float:
    """Bytes of one graphed layer's static inputs for one captured micro batch: ``s`` the tokens this GPU holds
    (seq / CP), ``seq`` the whole sequence (the mask's keys)."""
    tokens = s / tp if sequence_parallel else s
    return STATIC_HIDDEN_BYTES * tokens * b * h + MASK_BYTES * b * s * seq


def graph_bytes(recipe, s: float, tp: int, sequence_parallel: bool, sets: float) -> float:
    """Bytes per GPU the per-layer graphs keep beyond the eager activations (module docstring): ``sets`` layer x
    micro-batch sets in flight (vdkit.planner.memory.layers_in_flight), ``s`` the tokens of a sequence this GPU
    holds; 0 for eager (train.cuda_graphs=none)."""
    if recipe.train.cuda_graphs != "layer":
        return 0.0
    m, t = recipe.model, recipe.train
    b, h = t.micro_batch_size, m.hidden_size
    shared = STATIC_HIDDEN_BYTES * (s / tp if sequence_parallel else s) * b * h
    rope = ROPE_BYTES * s * (h // m.num_attention_heads)
    return sets * layer_set_bytes(s, t.seq_length, b, h, tp, sequence_parallel) + shared + rope



def plan_note(recipe, tp: int, sequence_parallel: bool, sets: float) -> list:
    """The plan's line for per-layer CUDA graphs at the chosen layout (NOTE, with the first stage's bytes: ``sets``
    its layers in flight); [] eager."""
    if recipe.train.cuda_graphs != "layer":
        return []
    from vdkit.composition.schema import GB

    s = (recipe.train.seq_length + (recipe.method.ptuning_virtual_tokens if recipe.method.name == "ptuning" else 0)
         ) / recipe.parallelism.cp
    return [NOTE.format(gb=graph_bytes(recipe, s, tp, sequence_parallel, sets) / GB)]
