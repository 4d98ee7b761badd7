#!/usr/bin/python
"""Run llama-benchy offline against an OpenAI-compatible endpoint (the bench role, on the controller)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_run
short_description: Prefill and decode tok/s at several context depths with llama-benchy, offline
description:
  - Runs llama-benchy (PyPI) against O(url) for one setup and returns its rows (prefill and decode tok/s per
    depth); its own JSON report is kept in O(dest).
  - Offline by construction, no Hub; the tokenizer is O(tokenizer) or a C(tokenizer.json) built from
    O(vocab) (bench_model's vocabulary of the GGUF), and the text comes from a deterministic corpus written
    where llama-benchy caches its book.
  - The API key travels on the runner's standard input, never on a command line.
version_added: "1.0.0"
author: minimax-spark
options:
  url: {description: "Base URL of the API, ending in C(/v1).", type: str, required: true}
  model: {description: The served model name (llama-server's alias)., type: str, required: true}
  name: {description: The setup's name in the report., type: str, required: true}
  dest: {description: "llama-benchy's JSON report (C(<name>.json)) goes here.", type: path, required: true}
  workdir: {description: "Scratch folder (the tokenizer, the corpus).", type: path, required: true}
  tokenizer:
    description: "An HF tokenizer folder or C(tokenizer.json); empty: built from O(vocab)."
    type: str
    default: ''
  vocab: {description: The vocabulary JSON written by bench_model., type: path, default: ""}
  depths: {description: Context depths in tokens., type: list, elements: int, default: [0]}
  prompt_tokens: {description: Prompt tokens per request (prefill)., type: int, default: 2048}
  generate_tokens: {description: Tokens generated per request (decode)., type: int, default: 128}
  runs: {description: Runs per depth (the report gives the mean)., type: int, default: 3}
  latency_mode:
    description: "llama-benchy's --latency-mode."
    type: str
    choices: [api, generation, none]
    default: api
  api_key: {description: "The API key, if the endpoint needs one.", type: str, default: '', no_log: true}
  python: {description: Interpreter that has llama-benchy; default the one running this module., type: path}
  timeout: {description: Seconds for the whole run., type: int, default: 7200}
  settings: {description: "The setup's settings, returned as they are (for the report).", type: dict, default: {}}
notes:
  - Always changes (it writes a new report). Check mode runs nothing.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Runs nothing and reports C(changed=true) with no rows (a run always writes a new report).
"""

EXAMPLES = r"""
- name: Bench the deployed head
  bench_run:
    url: http://10.0.0.1:8891/v1
    model: minimax-m3
    name: deployed
    dest: bench-results/2026-12-03T08-00-00
    workdir: /tmp/minimax-bench
    vocab: /tmp/minimax-bench/vocab.json
    depths: [0, 4096, 16384, 65536]
  delegate_to: localhost
"""

RETURN = r"""
rows: {description: "C([{depth, prompt, generated, pp, tg, ttfr_ms}]) by depth (tok/s).", type: list, returned: success}
report: {description: llama-benchy's JSON report path., type: str, returned: success}
tokenizer: {description: The tokenizer used., type: str, returned: success}
"""

import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_bench import benchy_argv, build_tokenizer, load_json, parse_benchy, run_benchy


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            name=dict(type="str", required=True),
            dest=dict(type="path", required=True),
            workdir=dict(type="path", required=True),
            tokenizer=dict(type="str", default=""),
            vocab=dict(type="path", default=""),
            depths=dict(type="list", elements="int", default=[0]),
            prompt_tokens=dict(type="int", default=2048),
            generate_tokens=dict(type="int", default=128),
            runs=dict(type="int", default=3),
            latency_mode=dict(type="str", choices=["api", "generation", "none"], default="api"),
            api_key=dict(type="str", default="", no_log=True),
            python=dict(type="path"),
            timeout=dict(type="int", default=7200),
            settings=dict(type="dict", default={}),
        ),
        required_one_of=[("tokenizer", "vocab")],
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=True, rows=[], report="", tokenizer=p["tokenizer"])
    os.makedirs(p["workdir"], exist_ok=True)
    os.makedirs(p["dest"], exist_ok=True)
    tokenizer = p["tokenizer"]
    if not tokenizer:
        tokenizer = os.path.join(p["workdir"], "tokenizer.json")
        try:
            build_tokenizer(load_json(p["vocab"]), tokenizer)
        except ImportError as exc:
            module.fail_json(msg="The tokenizers library is missing on the controller "
                                 "(pip install -r requirements.txt): %s" % exc)
        except Exception as exc:  # tokenizers raises its own exception types
            module.fail_json(msg="Could not build a tokenizer from %s: %s; set bench_tokenizer" % (p["vocab"], exc))
    report = os.path.join(p["dest"], "%s.json" % p["name"])
    argv = benchy_argv(p["url"], p["model"], tokenizer, p["depths"], p["prompt_tokens"], p["generate_tokens"],
                       p["runs"], report, latency_mode=p["latency_mode"])
    try:
        rc, output = run_benchy(p["python"] or sys.executable, p["workdir"], argv, p["api_key"], p["timeout"])
    except Exception as exc:  # subprocess.TimeoutExpired among others
        module.fail_json(msg="llama-benchy did not finish against %s: %s" % (p["url"], exc))
    tail = output[-3000:]
    if rc != 0 or not os.path.isfile(report):
        module.fail_json(msg="llama-benchy failed against %s (rc %s); its output ends:\n%s" % (p["url"], rc, tail))
    rows = parse_benchy(load_json(report))
    if not rows:
        module.fail_json(msg="llama-benchy measured nothing against %s; its output ends:\n%s" % (p["url"], tail),
                         report=report)
    if not any(r["tg"] for r in rows):
        # llama-benchy divides the tokens after the first by the time between the first and the last: a reply whose
        # tokens all reached it in one read has no such time, and that run is left out.
        module.fail_json(msg="llama-benchy measured no decode speed against %s at depths %s: each of its %d runs "
                             "read the %d generated tokens in one piece, leaving no time to divide by; raise "
                             "bench_generate_tokens or bench_runs; its output ends:\n%s"
                             % (p["url"], [r["depth"] for r in rows], p["runs"], p["generate_tokens"], tail),
                         report=report)
    module.exit_json(changed=True, rows=rows, report=report, tokenizer=tokenizer, name=p["name"],
                     settings=p["settings"], output_tail=tail[-1500:])


def main():
    run_module()


if __name__ == "__main__":
    main()
