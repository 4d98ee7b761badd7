"""Filters of the bench role: the decode roofline, the depths that fit, the sweep's winner."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


def decode_roofline(active_bytes, bandwidth_gbs):
    """Decode tok/s the memory bandwidth allows: every token reads its active bytes once.

    ``active_bytes``: bytes read per token (bench_model's ``active_bytes_per_token``);
    ``bandwidth_gbs``: the nodes' memory bandwidth in GB/s (10^9 bytes). The layers of a split model
    run one node after the other, so the nodes' shares add up to one pass at that bandwidth.
    """
    try:
        active, bandwidth = float(active_bytes), float(bandwidth_gbs)
    except (TypeError, ValueError):
        raise AnsibleFilterError("decode_roofline needs numbers, got %r and %r"
                                 % (active_bytes, bandwidth_gbs)) from None
    if active <= 0 or bandwidth <= 0:
        raise AnsibleFilterError(
            "decode_roofline needs positive active bytes and bandwidth (bench_memory_bandwidth_gbs), got %r and %r"
            % (active_bytes, bandwidth_gbs))
    return round(bandwidth * 1e9 / active, 1)


def roofline_fraction(measured, roofline):
    """The share of the roofline a measured decode reaches (0.0-1.0, 3 decimals); None when unknown."""
    try:
        measured, roofline = float(measured), float(roofline)
    except (TypeError, ValueError):
        return None
    if roofline <= 0:
        return None
    return round(measured / roofline, 3)


def bench_depths(depths, n_ctx, prompt_tokens, generate_tokens):
    """Split the depths into those that fit the served context and those that do not.

    A run at depth d sends d + prompt_tokens tokens and generates generate_tokens: it fits when the
    sum is at most n_ctx. Returns ``{"keep": [...], "dropped": [...], "message": str}``.
    """
    need = int(prompt_tokens) + int(generate_tokens)
    n_ctx = int(n_ctx)
    keep = sorted({int(d) for d in depths if int(d) + need <= n_ctx})
    dropped = sorted({int(d) for d in depths if int(d) + need > n_ctx})
    message = ""
    if dropped:
        message = ("depths %s do not fit the served context (n_ctx %d, each run needs depth + %d prompt + %d generated "
                   "tokens): measured %s only; raise head_server_ctx_size to measure them"
                   % (dropped, n_ctx, int(prompt_tokens), int(generate_tokens), keep))
    return {"keep": keep, "dropped": dropped, "message": message}


def bench_winner(setups, metric="decode"):
    """The setup with the best mean ``tg`` (metric decode) or ``pp`` (prefill) over its depths.

    ``setups``: ``[{"name", "settings", "rows": [{depth, pp, tg}]}]``. Returns the winning setup, or
    {} when none measured anything.
    """
    key = {"decode": "tg", "prefill": "pp"}.get(metric)
    if key is None:
        raise AnsibleFilterError("bench_winner_metric must be decode or prefill, got %r" % metric)
    best, best_score = {}, None
    for setup in setups or []:
        values = [r[key] for r in setup.get("rows", []) if r.get(key)]
        if not values:
            continue
        score = sum(values) / len(values)
        if best_score is None or score > best_score:
            best, best_score = setup, score
    return best


class FilterModule:
    def filters(self):
        return {
            "decode_roofline": decode_roofline,
            "roofline_fraction": roofline_fraction,
            "bench_depths": bench_depths,
            "bench_winner": bench_winner,
        }
