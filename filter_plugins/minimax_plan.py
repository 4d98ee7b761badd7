"""The placement plan: which layers each node holds, the ``--tensor-split``, the memory each needs.

Pure functions of the model's sizes (``gguf_info`` with ``sizes: true``), each node's memory and
the server settings. They follow llama.cpp's own placement (src/llama-model.cpp, src/llama.cpp):

* devices are the RPC workers in ``--rpc`` order, then the head's GPU; ``--split-mode layer``
  gives each device a contiguous run of the ``block_count + 1`` "layers" (the output layer is the
  last one) in proportion to ``--tensor-split``: whole layer counts reproduce exactly;
* a CPU head is not a device: with ``-ngl N`` it keeps the first ``block_count + 1 - N`` layers on
  its CPU and the workers share the rest;
* ``token_embd`` always stays in the head's host memory;
* each layer's KV cache (and M3's MSA indexer cache) lives on the device holding the layer: KV
  cells = ``ctx_size`` (``--parallel`` slots share it, each padded to 256);
* every device needs compute buffers that grow with ``--ubatch-size`` (see ``compute_bytes``).
"""

from __future__ import annotations

import posixpath
import re
import struct

GIB = float(2 ** 30)

#: Known quants of MiniMax-M3 (unsloth/MiniMax-M3-GGUF) and their size in GB, largest first:
#: the way out a refusal proposes.
DEFAULT_ALTERNATIVES = [
    {"name": "UD-Q4_K_XL", "gb": 265},
    {"name": "UD-IQ4_XS", "gb": 208},
    {"name": "UD-IQ3_XXS", "gb": 159},
]


class PlanError(ValueError):
    """Bad input to the plan (message says what to fix)."""


def _f32(x):
    return struct.unpack("f", struct.pack("f", float(x)))[0]


def gib(nbytes, digits=1):
    return round(nbytes / GIB, digits)


def meminfo_gib(text):
    """``/proc/meminfo`` text -> ``{'total_gib': .., 'available_gib': ..}`` (GiB, 2 decimals).

    {{ (meminfo.content | b64decode) | meminfo_gib }}
    """
    values = {}
    for line in str(text).splitlines():
        match = re.match(r"^(\w+):\s+(\d+)\s*kB", line)
        if match:
            values[match.group(1)] = int(match.group(2)) * 1024
    if "MemTotal" not in values:
        raise PlanError("no MemTotal in /proc/meminfo")
    available = values.get("MemAvailable", values.get("MemFree", 0))
    return {"total_gib": round(values["MemTotal"] / GIB, 2), "available_gib": round(available / GIB, 2)}


def kv_cells(ctx_size, parallel=1):
    """KV cells llama.cpp allocates: ``ctx_size`` shared by ``parallel`` slots, each padded to 256."""
    parallel = max(1, int(parallel))
    per_seq = -(-int(ctx_size) // parallel)
    per_seq = -(-per_seq // 256) * 256
    return per_seq * parallel


def compute_bytes(model, cells, ubatch, has_msa, has_output, indexer_heads=4):
    """Estimated compute buffer of one device (bytes), for ``ubatch`` tokens per step.

    ggml's allocator reuses memory across the graph, so the buffer is the largest intermediate
    set plus the activations that stay alive:

    * M3's sparse attention, on a device holding MSA layers: the indexer scores, the block mask
      gathered back to cells and the attention mask over all ``cells``:
      ``cells * ubatch * indexer_heads * 9.5`` bytes (~4.75 GiB at 64k context and ubatch 2048,
      a quarter at ubatch 512);
    * the output device needs no more: llama-server asks logits of the last token only, and the
      measured buffers show no logits term;
    * activations: ``ubatch * 6 * n_embd * 4`` bytes.

    Measured with llama-server (CPU backend, this tree) on an M3-width proxy (n_embd 6144, 4 KV
    heads, indexer 4 x 128, vocab 200064): 5122 MiB at 64k/2048, 1281 MiB at 64k/512, 9987 MiB at
    128k/2048, 1474 MiB at 16k/2048, 369 MiB at 16k/512; this formula gives 5152, 1288, 10016,
    1504 and 376.
    """
    n_embd = int(model.get("n_embd") or 6144)
    peak = 0
    if has_msa:
        peak = int(cells * int(ubatch) * int(indexer_heads) * 9.5)
    return peak + int(ubatch) * 6 * n_embd * 4


def llamacpp_layer_devices(split, n_items, ngl=None):
    """The device index of each of ``n_items`` layers (output last), as llama.cpp assigns them for
    ``--tensor-split split`` (device order) and ``-ngl ngl``; ``None`` marks a layer on the CPU."""
    if not split or not any(float(x) > 0 for x in split):
        raise PlanError("tensor split %s has no positive share" % (split,))
    cum, total = [], _f32(0.0)
    for x in split:
        total = _f32(total + _f32(x))
        cum.append(total)
    cum = [_f32(c / total) for c in cum]
    ngl = n_items if ngl is None else min(int(ngl), n_items)
    start = max(n_items - ngl, 0)
    act = ngl
    devices = []
    for il in range(n_items):
        if il < start or il - start >= act:
            devices.append(None)
            continue
        value = _f32(_f32(il - start) / _f32(act))
        d = next((i for i, c in enumerate(cum) if c > value), len(cum))
        devices.append(min(d, len(cum) - 1))
    return devices


def _greedy(costs, budgets):
    """Contiguous placement of ``costs`` over ``budgets`` (in order) at the smallest common fill
    fraction; returns the layer counts or None when even full budgets are not enough."""

    def place(fraction):
        counts, i = [], 0
        for budget in budgets:
            cap = budget * fraction
            used, n = 0.0, 0
            while i < len(costs) and used + costs[i] <= cap:
                used += costs[i]
                n += 1
                i += 1
            counts.append(n)
        return counts if i == len(costs) else None

    if place(1.0) is None:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if place(mid) is None:
            lo = mid
        else:
            hi = mid
    return place(hi)


def _cpu_head_ngl(n_items, n_workers, n_gpu_layers):
    """-ngl of a CPU head: pinned, or the workers' share (filter offload_layers' rule)."""
    if n_gpu_layers in (None, "", "auto"):
        return max(1, min(n_items - 1, -(-n_items * n_workers // (n_workers + 1))))
    return min(int(n_gpu_layers), n_items)


def plan_nodes(hosts, hostvars, reserve_gib=4, head_gpu=True):
    """The plan's node list from the play's hosts (the head first, then the workers in --rpc order):
    memory from each host's ``_plan_memory`` (set by the plan role), ``plan_reserve_gib`` and
    ``plan_compute_gib`` per host when the inventory sets them."""
    nodes = []
    for i, name in enumerate(hosts):
        hv = hostvars[name]
        memory = hv.get("_plan_memory") or {}
        if not memory.get("total_gib"):
            raise PlanError("no memory known for %s: the plan runs on the head and every worker (no --limit), "
                            "or set plan_memory_gib for it" % name)
        nodes.append({
            "name": name,
            "memory_gib": float(memory["total_gib"]),
            "available_gib": memory.get("available_gib"),
            "reserve_gib": float(hv.get("plan_reserve_gib", reserve_gib)),
            "compute_gib": hv.get("plan_compute_gib", ""),
            "gpu": bool(head_gpu) if i == 0 else True,
        })
    return nodes


def _layers_text(first, last, output, block_count):
    if first is None:
        return "-"
    hi = block_count - 1 if output else last
    text = "%d-%d" % (first, hi) if hi > first else ("%d" % first if hi == first else "")
    if output:
        text = (text + " + output") if text else "output"
    return text


#: ``head_server_ctx_size: max`` chooses each slot's context in steps of this many tokens: llama.cpp's own
#: padding of a slot's KV cells, so the context planned is the context allocated, with no hidden padding.
CTX_STEP = 256
#: The largest context per slot ``max`` tries when the model states no training context and nothing caps it.
CTX_SEARCH_LIMIT = 1 << 24


def ctx_request(value):
    """``head_server_ctx_size`` as the plan reads it: ``'max'`` or a whole number (PlanError otherwise)."""
    text = str(value).strip().lower()
    if text == "max":
        return "max"
    if isinstance(value, bool):
        raise PlanError("head_server_ctx_size=%r is not a whole number or max" % (value,))
    try:
        return int(text)
    except ValueError:
        raise PlanError("head_server_ctx_size=%r is not a whole number or max" % (value,)) from None


def _truthy(value):
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y", "t")


def _tokens(n):
    return f"{int(n):,}"


def minimax_plan(model, nodes, ctx_size=65536, parallel=1, ubatch_size=2048, tensor_split=None,
                 n_gpu_layers="auto", model_name="the model", alternatives=None, min_headroom_gib=0.0,
                 ctx_size_max=0, ctx_beyond_training=False):
    """The placement plan (see the module docstring), for a context in tokens or ``'max'``.

    ``ctx_size``: the context all slots share (``--ctx-size``; 0: the model's training context), or ``'max'``:
    the largest context that fits every node with its reserve, compute buffers and ``min_headroom_gib``,
    a multiple of ``CTX_STEP`` per slot, capped by the model's training context (``context_length``, per
    slot, as llama-server caps a slot) unless ``ctx_beyond_training`` and by ``ctx_size_max`` (0: no cap).
    A context whose slots exceed the training context is refused (``ctx_problem``) unless
    ``ctx_beyond_training``, which then names the ``--override-kv`` that lifts llama-server's cap
    (``override_kv``). The rest of the arguments and the result: see ``_placement``; the result adds
    ``ctx_request``, ``ctx_per_slot``, ``ctx_train``, ``ctx_limit``, ``ctx_problem``, ``override_kv``.
    """
    request = ctx_request(ctx_size)
    parallel = max(1, int(parallel))
    cap = int(ctx_size_max or 0)
    if cap < 0:
        raise PlanError("head_server_ctx_size_max=%d is negative: give 0 (no cap) or a context in tokens" % cap)
    beyond = _truthy(ctx_beyond_training)
    train = int(model.get("context_length") or 0)
    arch = model.get("architecture") or "general"
    args = dict(parallel=parallel, ubatch_size=ubatch_size, tensor_split=tensor_split, n_gpu_layers=n_gpu_layers,
                model_name=model_name, alternatives=alternatives, min_headroom_gib=min_headroom_gib)
    problem, limit = "", ""
    if request == "max":
        limits = [(CTX_SEARCH_LIMIT, "the largest context the plan tries (%d per slot)" % CTX_SEARCH_LIMIT)]
        if train and not beyond:
            limits.append((train, "the model's training context"))
        if cap:
            limits.append((cap // parallel, "head_server_ctx_size_max"))
        top, top_why = min(limits, key=lambda x: x[0])
        steps = top // CTX_STEP
        if steps < 1:
            problem = ("head_server_ctx_size_max=%d leaves each of %d slots less than %d tokens: raise it or lower "
                       "head_server_parallel" % (cap, parallel, CTX_STEP))
            steps = 1

        def at(k):
            return _placement(model, nodes, k * CTX_STEP * parallel, **args)

        lo = 1
        best = at(lo)
        if best["fits"]:
            if at(steps)["fits"]:
                lo = steps
            else:
                hi = steps  # lo fits, hi does not
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if at(mid)["fits"]:
                        lo = mid
                    else:
                        hi = mid
            best = at(lo)
            limit = top_why if lo == steps else "memory"
        plan = best
    else:
        plan = _placement(model, nodes, request, **args)
    ctx = plan["ctx_size"]
    # each slot's cells as llama.cpp pads them; a slot serves at most the training context unless lifted
    cells_per_slot = kv_cells(ctx or train, parallel) // parallel
    asked = -(-ctx // parallel)
    lift = beyond and train and cells_per_slot > train
    per_slot = cells_per_slot if lift or not train else min(cells_per_slot, train)
    if request != "max" and train and asked > train and not beyond:
        slots = (" with head_server_parallel=%d gives each slot %d tokens, which is" % (parallel, asked)
                 if parallel > 1 else " is")
        problem = ("head_server_ctx_size=%d%s above the training context of %s (%d tokens, %s.context_length): "
                   "llama-server would cap each slot at %d and serve less than planned. Set head_server_ctx_size "
                   "to %d or less (max: the most that fits), or lift the model's limit on purpose with "
                   "head_server_ctx_beyond_training: true (--override-kv %s.context_length=int:%d)"
                   % (request, slots, model_name, train, arch, train, train * parallel, arch, cells_per_slot))
    plan.update({
        "ctx_request": request,
        "ctx_size_max": cap,
        "ctx_beyond_training": beyond,
        "ctx_per_slot": per_slot,
        "ctx_train": train,
        "ctx_limit": limit,
        "ctx_problem": problem,
        "override_kv": "%s.context_length=int:%d" % (arch, cells_per_slot) if lift else "",
    })
    plan["ctx_line"] = _ctx_line(plan)
    plan["table"] = plan_table(plan)
    plan["fact"].update({k: plan[k] for k in ("ctx_request", "ctx_size_max", "ctx_beyond_training", "ctx_per_slot",
                                              "ctx_train", "override_kv")})
    return plan


def _ctx_line(plan):
    """The context the plan gives the head, one line beside the table."""
    ctx, per_slot, parallel = plan["ctx_size"], plan["ctx_per_slot"], plan["parallel"]
    if parallel > 1:
        text = "context: %d slots of %s tokens each (--ctx-size %d in all)" % (parallel, _tokens(per_slot), ctx)
    else:
        text = "context: %s tokens (--ctx-size %d)" % (_tokens(per_slot), ctx)
    if plan["ctx_request"] == "max":
        if not plan["fits"]:
            text += ", head_server_ctx_size: max, but not even %d tokens per slot fit" % CTX_STEP
        elif plan["ctx_limit"] == "memory":
            text += ", the most that fits (head_server_ctx_size: max; %d tokens more per slot would not)" % CTX_STEP
        else:
            text += ", head_server_ctx_size: max, capped by %s" % plan["ctx_limit"]
    elif plan["ctx_request"] == 0:
        text += ", head_server_ctx_size: 0 (the model's training context)"
    if plan["ctx_train"]:
        text += "; the model's training context %s" % _tokens(plan["ctx_train"])
        if plan["override_kv"]:
            text += ", lifted on purpose (head_server_ctx_beyond_training: --override-kv %s)" % plan["override_kv"]
    return text


def _placement(model, nodes, ctx_size=65536, parallel=1, ubatch_size=2048, tensor_split=None,
               n_gpu_layers="auto", model_name="the model", alternatives=None, min_headroom_gib=0.0):
    """The placement plan for ``ctx_size`` tokens (see the module docstring).

    ``model``: gguf_info's result with ``sizes`` (``block_count``, ``layer_bytes``,
    ``non_layer_bytes``, ``kv_bytes_per_token``, ``n_vocab``; optional ``n_embd``, ``n_ff_exp``,
    ``n_expert_used``, ``leading_dense_block_count``).
    ``nodes``: the head first, then the workers in ``--rpc`` order; each a dict with ``name``,
    ``memory_gib`` (total memory), ``reserve_gib`` (OS and everything else on the node),
    optional ``gpu`` (the head: has a GPU; default true), ``available_gib`` (shown),
    ``compute_gib`` (overrides the estimate).
    ``tensor_split``: a pinned ``--tensor-split`` (device order: workers, then the head's GPU);
    empty: the plan chooses. Returns a dict; ``fits`` false comes with ``message`` saying why and
    the way out.
    """
    if not nodes:
        raise PlanError("no nodes to plan for: the inventory needs a head")
    block_count = int(model["block_count"])
    layer_bytes = [int(b) for b in model["layer_bytes"]]
    if len(layer_bytes) != block_count:
        raise PlanError("layer_bytes has %d entries for %d layers" % (len(layer_bytes), block_count))
    non_layer = dict(model.get("non_layer_bytes") or {})
    kv = model.get("kv_bytes_per_token") or {}
    kv_layer = [int(b) for b in (kv.get("per_layer") or [0] * block_count)]
    # --ctx-size 0: llama.cpp takes the model's training context
    cells = kv_cells(int(ctx_size) or int(model.get("context_length") or 0), parallel)
    lead = int(model.get("leading_dense_block_count", 0) or 0)
    msa = [bool(kv.get("indexer")) and il >= lead for il in range(block_count)]
    if kv.get("indexer") and not lead:
        msa = ([kv_layer[il] > min(kv_layer) for il in range(block_count)] if len(set(kv_layer)) > 1
               else [True] * block_count)

    embd = sum(b for n, b in non_layer.items() if n.startswith("token_embd"))
    output = sum(b for n, b in non_layer.items() if not n.startswith("token_embd"))
    # items: the repeating layers, then the output layer (weights + KV per item)
    weights = layer_bytes + [output]
    kvb = [b * cells for b in kv_layer] + [0]
    costs = [w + k for w, k in zip(weights, kvb)]
    n_items = block_count + 1

    head, workers = nodes[0], list(nodes[1:])
    head_gpu = bool(head.get("gpu", True))
    if not head_gpu and not workers:
        raise PlanError("a CPU head without workers holds the whole model on its CPU: nothing to plan")
    # devices in placement order; index into nodes
    order = [0] + list(range(1, len(nodes))) if not head_gpu else list(range(1, len(nodes))) + [0]

    def compute_for(idx, has_msa, has_output):
        node = nodes[idx]
        if node.get("compute_gib") not in (None, ""):
            return float(node["compute_gib"]) * GIB
        return compute_bytes(model, cells, ubatch_size, has_msa, has_output)

    def budget(idx, has_output):
        node = nodes[idx]
        b = (float(node["memory_gib"]) - float(node.get("reserve_gib", 0)) - float(min_headroom_gib)) * GIB
        b -= compute_for(idx, True, has_output)
        if idx == 0:
            b -= embd
        return max(0.0, b)

    pinned = bool(tensor_split)
    if pinned:
        split = [float(x) for x in tensor_split]
        expected = len(workers) + (1 if head_gpu else 0)
        if len(split) != expected:
            raise PlanError(
                "the pinned tensor split %s has %d entries; this cluster has %d devices (%s): one share each"
                % (tensor_split, len(split), expected,
                   ", ".join(nodes[i]["name"] for i in order if head_gpu or i != 0))
            )
        if head_gpu:
            ngl = 999
            devs = llamacpp_layer_devices(split, n_items)
            counts = [devs.count(d) for d in range(len(order))]
        else:
            ngl = _cpu_head_ngl(n_items, len(workers), n_gpu_layers)
            devs = llamacpp_layer_devices(split, n_items, ngl)
            counts = [devs.count(None)] + [devs.count(d) for d in range(len(workers))]
    elif head_gpu:
        budgets = [budget(idx, pos == len(order) - 1) for pos, idx in enumerate(order)]
        counts = _greedy(costs, budgets) or _greedy(costs, [b * 1000 for b in budgets])  # (shortfall shown)
        split, ngl = list(counts), 999
    else:
        # A CPU head keeps the first n_items - ngl layers (ngl as head_server computes it); the
        # workers share the rest, the last one with the output layer.
        ngl = _cpu_head_ngl(n_items, len(workers), n_gpu_layers)
        rest = costs[n_items - ngl:]
        budgets = [budget(idx, pos == len(workers) - 1) for pos, idx in enumerate(order[1:])]
        counts = _greedy(rest, budgets) or _greedy(rest, [b * 1000 for b in budgets])
        split = list(counts)
        counts = [n_items - ngl] + list(counts)

    # per node figures
    rows, first = {}, 0
    for pos, idx in enumerate(order):
        n = counts[pos]
        items = list(range(first, first + n))
        first += n
        has_output = block_count in items
        layers = [il for il in items if il < block_count]
        w = sum(weights[il] for il in items) + (embd if idx == 0 else 0)
        k = sum(kvb[il] for il in items)
        c = compute_for(idx, any(msa[il] for il in layers), has_output) if (items or idx == 0) else 0
        node = nodes[idx]
        reserve = float(node.get("reserve_gib", 0))
        need = w + k + c
        headroom = float(node["memory_gib"]) - reserve - need / GIB
        rows[idx] = {
            "name": node["name"],
            "role": "head" if idx == 0 else "worker",
            "device": ("CPU" if not head_gpu else "GPU") if idx == 0 else "RPC%d" % (idx - 1),
            "layers": len(layers),
            "layer_range": _layers_text(items[0] if items else None, layers[-1] if layers else None,
                                        has_output, block_count),
            "output": has_output,
            # first and last block (layer index) on this node; [] when it holds none
            "blocks": [layers[0], layers[-1]] if layers else [],
            "weights_gib": gib(w, 2),
            "kv_gib": gib(k, 2),
            "compute_gib": gib(c, 2),
            "need_gib": gib(need, 2),
            "reserve_gib": reserve,
            "memory_gib": float(node["memory_gib"]),
            "available_gib": node.get("available_gib"),
            "headroom_gib": round(headroom, 2),
        }
    node_rows = [rows[i] for i in range(len(nodes))]
    totals = {
        "weights_gib": gib(sum(weights) + embd, 1),
        "kv_gib": gib(sum(kvb), 1),
        "compute_gib": round(sum(r["compute_gib"] for r in node_rows), 1),
        "offer_gib": round(sum(float(n["memory_gib"]) - float(n.get("reserve_gib", 0)) for n in nodes), 1),
    }
    short = [r for r in node_rows if r["headroom_gib"] < float(min_headroom_gib)]
    fits = not short
    message = _verdict(fits, pinned, model_name, totals, nodes, node_rows, short, cells, kv, ubatch_size,
                       alternatives if alternatives is not None else DEFAULT_ALTERNATIVES, min_headroom_gib)
    plan = {
        "fits": fits,
        "message": message,
        "model": model_name,
        "pinned": pinned,
        "tensor_split": [int(x) if float(x).is_integer() else x for x in split],
        "n_gpu_layers": ngl,
        "ctx_size": int(ctx_size),
        "parallel": int(parallel),
        "ubatch_size": int(ubatch_size),
        "kv_cells": cells,
        "kv_bytes_per_token": int(kv.get("total", sum(kv_layer))),
        "nodes": node_rows,
        "totals": totals,
    }
    # What services.yml records (ansible_local.minimax_plan): nothing that changes between runs
    # (the memory available now does), so a second run changes nothing.
    plan["fact"] = {k: plan[k] for k in ("model", "fits", "tensor_split", "n_gpu_layers", "ctx_size", "parallel",
                                         "ubatch_size", "kv_cells", "kv_bytes_per_token")}
    plan["fact"]["nodes"] = [{k: v for k, v in r.items() if k != "available_gib"} for r in node_rows]
    return plan


def _verdict(fits, pinned, model_name, totals, nodes, rows, short, cells, kv, ubatch, alternatives, min_headroom):
    need_total = totals["weights_gib"] + totals["kv_gib"] + totals["compute_gib"]
    what = "%s needs %.1f GiB + %.1f GiB KV (%d tokens, %s/%s) + %.1f GiB compute buffers (ubatch %d)" % (
        model_name, totals["weights_gib"], totals["kv_gib"], cells, kv.get("cache_type_k", "?"),
        kv.get("cache_type_v", "?"), totals["compute_gib"], ubatch)
    if fits:
        return "%s; %d nodes offer %.1f GiB: fits, least headroom %.1f GiB on %s" % (
            what, len(nodes), totals["offer_gib"], min(r["headroom_gib"] for r in rows),
            min(rows, key=lambda r: r["headroom_gib"])["name"])
    offer = "%d nodes offer %.1f GiB" % (len(nodes), totals["offer_gib"])
    lacking = ", ".join("%s lacks %.1f GiB" % (r["name"], float(min_headroom) - r["headroom_gib"]) for r in short)
    if pinned:
        return ("%s; %s, but the pinned tensor split leaves %s: change head_server_tensor_split or leave it empty "
                "for the plan's split" % (what, offer, lacking))
    if need_total <= totals["offer_gib"]:
        return "%s; %s, but whole layers do not fit (%s): add a node or lower the context" % (what, offer, lacking)
    ways = []
    per_node = min(float(n["memory_gib"]) - float(n.get("reserve_gib", 0)) for n in nodes)
    extra = 0
    while need_total + extra * 2.0 > totals["offer_gib"] + extra * per_node and extra < 16:
        extra += 1  # each node added also needs its own compute buffers (~2 GiB)
    ways.append("add a node" if extra == 1 else "add %d nodes" % extra)
    weights = totals["weights_gib"]
    for alt in alternatives or []:
        alt_gib = float(alt["gb"]) * 1e9 / GIB
        if alt_gib < weights - 0.5 and alt_gib + need_total - weights <= totals["offer_gib"]:
            ways.append("choose %s" % alt["name"])
            break
    return "%s; %s: %s" % (what, offer, " or ".join(ways))


def plan_table(plan):
    """The plan as text lines (one per node, a header and the verdict)."""
    head = "%-14s %-6s %-6s %6s  %-16s %8s %7s %8s %8s %8s %8s %9s %6s" % (
        "node", "role", "device", "layers", "range", "weights", "KV", "compute", "need", "reserve", "memory",
        "headroom", "avail")
    lines = [head]
    for r in plan["nodes"]:
        avail = "-" if r.get("available_gib") in (None, "") else "%.1f" % float(r["available_gib"])
        lines.append("%-14s %-6s %-6s %6d  %-16s %8.1f %7.1f %8.1f %8.1f %8.1f %8.1f %9.1f %6s" % (
            r["name"][:14], r["role"], r["device"], r["layers"], r["layer_range"], r["weights_gib"], r["kv_gib"],
            r["compute_gib"], r["need_gib"], r["reserve_gib"], r["memory_gib"], r["headroom_gib"], avail))
    lines.append("--tensor-split %s  -ngl %s  ctx %d, parallel %d, ubatch %d, KV %d bytes/token (all figures GiB)" % (
        ",".join(str(x) for x in plan["tensor_split"]), plan["n_gpu_layers"], plan["ctx_size"], plan["parallel"],
        plan["ubatch_size"], plan["kv_bytes_per_token"]))
    if plan.get("ctx_line"):
        lines.append(plan["ctx_line"])
    lines.append(plan["message"])
    return lines


def plan_memory_check(plan, host, available_gib, running=False):
    """The verdict right before ``host``'s service starts: ``''`` when its planned need fits in the
    memory available now (``/proc/meminfo`` read fresh), else a message with the numbers."""
    row = next((r for r in (plan or {}).get("nodes", []) if r["name"] == host), None)
    if row is None:
        return ""
    if running:
        return ""
    if float(available_gib) + 1e-9 >= row["need_gib"]:
        return ""
    return ("%s has %.1f GiB available now; the plan needs %.1f GiB there (%s: %.1f GiB weights, %.1f GiB KV, "
            "%.1f GiB compute): stop what uses the memory (another model, a stale server) and run again"
            % (host, float(available_gib), row["need_gib"], row["layer_range"], row["weights_gib"], row["kv_gib"],
               row["compute_gib"]))


def plan_seed_include(plan_fact, hostname):
    """Tensor-name patterns for what the plan places on worker ``hostname`` (rpc_cache_seed's ``include``).

    Seeding a worker's RPC cache with only its own layers halves the disk it costs on two nodes. Empty when
    there is no plan (or no plan row for the host as a worker): the seeder then takes every tensor.

    {{ ansible_local.minimax_plan | default({}) | plan_seed_include(inventory_hostname) }}
      ->  ['^blk\\.(0|1|...|30)\\.']
    """
    patterns = []
    for row in (plan_fact or {}).get("nodes") or []:
        if row.get("role") != "worker" or row.get("name") != hostname:
            continue
        blocks = row.get("blocks") or []
        if len(blocks) == 2:
            patterns.append(r"^blk\.(%s)\." % "|".join(str(i) for i in range(int(blocks[0]), int(blocks[1]) + 1)))
        if row.get("output"):
            patterns.append(r"^output\.")
    return patterns


# The settings a plan is made for, as the plan fact records them, and the head_server variable naming each.
PLAN_SETTINGS = (
    # the context asked for (a number or max: the head compares it; a plan of an older release recorded ctx_size
    # only) and the context planned (compared between two plans: a worker's and the head's)
    ("ctx_request", "head_server_ctx_size"),
    ("ctx_size", "head_server_ctx_size"),
    ("ctx_size_max", "head_server_ctx_size_max"),
    ("ctx_beyond_training", "head_server_ctx_beyond_training"),
    ("parallel", "head_server_parallel"),
    ("ubatch_size", "head_server_ubatch_size"),
    ("cache_type_k", "head_server_cache_type_k"),
    ("cache_type_v", "head_server_cache_type_v"),
    ("tensor_split", "head_server_tensor_split"),
    ("model_path", "head_server_model_path"),
)


def _same(key, planned, value):
    if key == "tensor_split":
        try:
            return [float(x) for x in planned or []] == [float(x) for x in value or []]
        except (TypeError, ValueError):
            return False
    if key == "model_path":
        return posixpath.normpath(str(planned)) == posixpath.normpath(str(value))
    if key in ("cache_type_k", "cache_type_v", "ctx_request"):
        return str(planned).strip().lower() == str(value).strip().lower()
    if key == "ctx_beyond_training":
        return _truthy(planned) == _truthy(value)
    return str(planned).strip() == str(value).strip()


def plan_settings_mismatch(plan_fact, settings):
    """The settings (``{ctx_size, parallel, ...}`` as the head is about to start with them) the recorded plan
    (``ansible_local.minimax_plan``) was not made for, each as ``head_server_x=value (the plan: planned)``.

    Empty when they match, when no plan is recorded, or for a setting the plan does not record (a plan of an
    older release).

    {{ ansible_local.minimax_plan | plan_settings_mismatch({'ctx_size': 8192, ...}) }}
      ->  ['head_server_ctx_size=8192 (the plan: 4096)']
    """
    if not plan_fact:
        return []
    out = []
    for key, variable in PLAN_SETTINGS:
        planned = plan_fact.get(key, plan_fact.get("ctx_size") if key == "ctx_request" else None)
        if planned is None or key not in settings:
            continue
        value = settings[key]
        if not _same(key, planned, value):
            def show(v):
                return ",".join(str(x) for x in v) if isinstance(v, (list, tuple)) else str(v)
            out.append("%s=%s (the plan: %s)" % (variable, show(value) or "[]", show(planned) or "[]"))
    return out


def plan_head_ctx(plan_fact, ctx_size):
    """The context the head starts with, from the recorded plan (``ansible_local.minimax_plan``) and
    ``head_server_ctx_size``: ``{'ctx_size': --ctx-size, 'args': ['--override-kv', ...] or [], 'problem': ''}``.

    With ``max`` the ``--ctx-size`` is the plan's number (``problem`` says so when no plan is recorded); a number
    is itself (the head refuses a plan made for another). ``args`` lift the model's training context when the
    plan was made to go beyond it (``head_server_ctx_beyond_training``).

    {{ ansible_local.minimax_plan | default({}) | plan_head_ctx('max') }}  ->  {'ctx_size': 160256, 'args': [], ...}
    """
    fact = plan_fact or {}
    request = ctx_request(ctx_size)
    out = {"ctx_size": request, "args": [], "problem": ""}
    if request == "max":
        if str(fact.get("ctx_request", "")).strip().lower() != "max" or not fact.get("ctx_size"):
            out.update(ctx_size=None, problem=(
                "head_server_ctx_size=max takes the context the plan chose, and the recorded plan "
                "(ansible_local.minimax_plan) was not made for max: run site.yml or playbooks/services.yml "
                "without skipping the plan play"))
        else:
            out["ctx_size"] = int(fact["ctx_size"])
    if fact.get("override_kv"):
        out["args"] = ["--override-kv", str(fact["override_kv"])]
    return out


class FilterModule:
    def filters(self):
        return {
            "minimax_plan": minimax_plan,
            "meminfo_gib": meminfo_gib,
            "plan_nodes": plan_nodes,
            "kv_cells": kv_cells,
            "plan_memory_check": plan_memory_check,
            "plan_seed_include": plan_seed_include,
            "plan_settings_mismatch": plan_settings_mismatch,
            "plan_head_ctx": plan_head_ctx,
        }
