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


METRICS = {"decode": "tg", "prefill": "pp"}
OTHER = {"decode": "prefill", "prefill": "decode"}


def _figures(setup, key):
    """``{depth: (mean, spread)}`` of one metric: the spread is llama-benchy's std over the repeated runs."""
    out = {}
    for row in setup.get("rows") or []:
        if row.get(key):
            out[int(row["depth"])] = (float(row[key]), float(row.get(key + "_std") or 0.0))
    return out


def _score(setup, key):
    values = [mean for mean, _ in _figures(setup, key).values()]
    return sum(values) / len(values) if values else None


def _leads(a, b, key, margin):
    """Does ``a`` lead ``b`` at every depth both measured, each lead above both spreads and margin % of b?"""
    fa, fb = _figures(a, key), _figures(b, key)
    depths = sorted(set(fa) & set(fb))
    if not depths:
        return False
    for d in depths:
        (ma, sa), (mb, sb) = fa[d], fb[d]
        if ma - mb <= max(sa + sb, mb * margin / 100.0):
            return False
    return True


def _clear_best(setups, metric, margin):
    """The setup that leads every other on ``metric`` (see _leads), and those it does not lead (its ties)."""
    key = METRICS[metric]
    ranked = sorted(setups, key=lambda s: -_score(s, key))
    best = ranked[0]
    tied = [s for s in ranked[1:] if not _leads(best, s, key, margin)]
    return best, tied


def _names(setups):
    return ", ".join(s["name"] for s in setups)


def bench_winner(setups, metric="decode", margin=0):
    """The sweep's winner, picked on signal; ``{}``-like with only ``rule`` when nothing leads.

    ``setups``: ``[{"name", "settings", "rows": [{depth, pp, tg, pp_std, tg_std}]}]``; ``metric``: decode or
    prefill; ``margin``: a lead must also exceed this percentage (bench_winner_margin).

    A setting wins on ``metric`` when it leads every other at every depth both measured, by more than the two
    figures' spreads (llama-benchy's std over the repeated runs) added and by more than ``margin`` %. Otherwise
    the settings it does not lead are tied with it on ``metric``, and the other metric decides among them by
    the same rule. When neither decides, nothing wins. The result is the winning setup with ``rule`` (the
    sentence saying what decided) and ``decided_by`` (the metric, or "" when nothing won).
    """
    if metric not in METRICS:
        raise AnsibleFilterError("bench_winner_metric must be decode or prefill, got %r" % metric)
    try:
        margin = float(margin or 0)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError("bench_winner_margin must be a number (percent), got %r" % margin) from exc
    if margin < 0:
        raise AnsibleFilterError("bench_winner_margin must be 0 or more (percent), got %r" % margin)
    key, other = METRICS[metric], OTHER[metric]
    measured = [s for s in setups or [] if _score(s, key) is not None]
    if not measured:
        return {}
    spread = "the spread of the repeated runs" + (" and the %g%% margin" % margin if margin else "")
    if len(measured) == 1:
        return dict(measured[0], decided_by=metric, rule="%s: the only setting measured" % measured[0]["name"])
    best, tied = _clear_best(measured, metric, margin)
    if not tied:
        return dict(best, decided_by=metric, rule="%s leads every other setting on %s at every depth by more than %s"
                    % (best["name"], metric, spread))
    group = [best] + tied
    rule = "%s tied within %s (%s)" % (metric, spread, _names(group))
    candidates = [s for s in group if _score(s, METRICS[other]) is not None]
    if candidates:
        best2, tied2 = _clear_best(candidates, other, margin)
        if not tied2:
            return dict(best2, decided_by=other, rule="%s; %s decides: %s leads them at every depth by more than %s"
                        % (rule, other, best2["name"], spread))
        rule += "; %s tied too (%s)" % (other, _names([best2] + tied2))
    return {"rule": rule + ": no setting wins, nothing is applied", "decided_by": ""}


class FilterModule:
    def filters(self):
        return {
            "decode_roofline": decode_roofline,
            "roofline_fraction": roofline_fraction,
            "bench_depths": bench_depths,
            "bench_winner": bench_winner,
        }
