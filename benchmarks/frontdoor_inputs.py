"""Malformed and edge-case requests against a served front door: the status and error each gets, and how long.

    python benchmarks/frontdoor_inputs.py

Starts ``tetriserve serve`` with its defaults (the benchmark ports of ``vllm_bench_serve.py``), sends every case of
``CASES`` to its OpenAI HTTP front door one after the other (raw JSON bodies: NaN, lone surrogates, integers past
64 bits, 10 MB), then three concurrent greedy completions that
share one ``x-request-id`` (two prompts, one of them twice) against each prompt's answer under an id of its own,
and last a plain completion to show the service still serves. Writes ``benchmarks/results/<out>.{md,json}``: per
case the HTTP status, the seconds to the answer, and the start of the body (an error's ``message``, ``param``,
``code``); a line per case as it is answered.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_results import provenance, run_facts
from vllm_bench_report import RESULTS, ROOT
from vllm_bench_serve import prepare, stop, tetriserve_cmd, wait_ready

URL = "http://127.0.0.1:8100"
MODEL = "tiny-llama"
COMPLETIONS, CHAT, TOKENIZE = "/v1/completions", "/v1/chat/completions", "/tokenize"


def body(**fields: Any) -> str:
    return json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields})


def chat(content: Any, **fields: Any) -> str:
    return json.dumps({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **fields})


CASES: dict[str, tuple[str, str]] = {  # name -> (route, raw JSON body)
    "token id outside the vocabulary": (COMPLETIONS, body(prompt=[99999, 5])),
    "max_tokens 0": (COMPLETIONS, body(max_tokens=0)),
    "max_tokens past the context": (COMPLETIONS, body(max_tokens=10**9)),
    "prompt of 3000 token ids": (COMPLETIONS, body(prompt=[5] * 3000)),
    "empty prompt": (COMPLETIONS, body(prompt="")),
    "temperature a string": (COMPLETIONS, body(temperature="abc")),
    "frequency_penalty NaN": (COMPLETIONS, body()[:-1] + ', "frequency_penalty": NaN}'),
    "logit_bias infinite": (COMPLETIONS, body()[:-1] + ', "logit_bias": {"5": 1e999}}'),
    "seed 2**70": (COMPLETIONS, body(seed=2**70)),
    "seed -3": (COMPLETIONS, body(seed=-3)),
    "priority 2**70": (COMPLETIONS, body(priority=2**70)),
    "top_k 2**70": (COMPLETIONS, body(top_k=2**70)),
    "top_k past the vocabulary": (COMPLETIONS, body(top_k=5000)),
    "n 2**70": (COMPLETIONS, body(n=2**70)),
    "stop_token_ids [2**70]": (COMPLETIONS, body(stop_token_ids=[2**70])),
    "prompt with a lone surrogate": (COMPLETIONS, body().replace('"hi"', '"a\\ud800b"')),
    "stop string with a lone surrogate": (COMPLETIONS, body()[:-1] + ', "stop": ["\\udfff"]}'),
    "chat content with a lone surrogate": (CHAT, chat("x").replace('"x"', '"\\ud800"')),
    "tokenize a lone surrogate": (TOKENIZE, json.dumps({"model": MODEL, "prompt": "x"}).replace('"x"', '"\\ud800"')),
    "malformed JSON": (COMPLETIONS, '{"model":'),
    "a JSON array": (COMPLETIONS, "[1, 2]"),
    "unknown model": (COMPLETIONS, json.dumps({"model": "nope", "prompt": "hi"})),
    "chat with no messages": (CHAT, json.dumps({"model": MODEL, "messages": []})),
    "chat image part": (CHAT, chat([{"type": "image_url", "image_url": {"url": "http://x"}}])),
    "prompt of 10 MB": (COMPLETIONS, body(prompt="a " * 5_000_000)),
}


def post(route: str, raw: str, headers: dict[str, str] | None = None) -> tuple[int | str, float, str]:
    request = urllib.request.Request(
        URL + route, data=raw.encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            status, text = r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode(errors="replace")
    except OSError as err:
        status, text = "no answer", repr(err)
    return status, round(time.monotonic() - started, 3), text


def shared_ids() -> dict[str, Any]:
    """Three concurrent greedy completions under one ``x-request-id`` against each prompt alone."""
    prompts = {"a": "The quick brown fox", "b": "Once upon a time in a land", "c": "The quick brown fox"}

    def ask(prompt: str, rid: str) -> dict[str, Any]:
        raw = body(prompt=prompt, max_tokens=40, temperature=0, ignore_eos=True)
        status, seconds, text = post(COMPLETIONS, raw, {"x-request-id": rid})
        answer = json.loads(text)["choices"][0]["text"] if status == 200 else None
        return {"status": status, "seconds": seconds, "text": answer, "body": text[:200]}

    alone = {k: ask(p, f"alone-{k}") for k, p in prompts.items()}
    shared: dict[str, Any] = {}
    threads = [
        threading.Thread(target=lambda k=k, p=p: shared.update({k: ask(p, "shared")})) for k, p in prompts.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {
        k: {"status": shared[k]["status"], "seconds": shared[k]["seconds"], "same_text_as_alone":
            shared[k]["text"] is not None and shared[k]["text"] == alone[k]["text"], "body": shared[k]["body"]}
        for k in prompts
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="frontdoor_inputs", help="report name under benchmarks/results (.md, .json)")
    ap.add_argument("--note", default="", help="a line for the report's header (e.g. which code ran)")
    args = ap.parse_args()
    facts = run_facts()
    _, _, env = prepare()
    results: dict[str, Any] = {}
    with open(RESULTS.parent / "_work" / "server_frontdoor_inputs.log", "w") as log:
        proc = subprocess.Popen(tetriserve_cmd(), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            wait_ready(URL, proc)
            for name, (route, raw) in CASES.items():
                status, seconds, text = post(route, raw)
                results[name] = {"route": route, "status": status, "seconds": seconds, "body": text[:240]}
                print(f"{name}: {status} in {seconds} s", flush=True)
            shared = shared_ids()
            after = post(COMPLETIONS, body())
            results["served after all of these"] = {"route": COMPLETIONS, "status": after[0], "seconds": after[1],
                                                     "body": after[2][:240]}  # fmt: skip
        finally:
            stop(proc)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({**facts, "cases": results,
                                                          "shared_request_id": shared}, indent=1))  # fmt: skip
    lines = [
        "# Malformed and edge-case requests against the HTTP front door",
        "",
        *provenance(facts),
        *([args.note + "  "] if args.note else []),
        "`tetriserve serve` with its defaults (tiny model), one request at a time; seconds to the whole answer.",
        "",
        "| case | route | status | s | answer (start) |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for name, r in results.items():
        text = r["body"][:150].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {name} | `{r['route']}` | {r['status']} | {r['seconds']} | `{text}` |")
    lines += [
        "",
        "Three concurrent greedy completions with one `x-request-id` (prompts a and c the same), each answer "
        "against the same prompt's under an id of its own:",
        "",
        "| request | status | s | same text as alone |",
        "| --- | ---: | ---: | --- |",
    ]
    lines += [f"| {k} | {v['status']} | {v['seconds']} | {v['same_text_as_alone']} |" for k, v in shared.items()]
    (RESULTS / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print((RESULTS / f"{args.out}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
