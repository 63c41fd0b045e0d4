"""Drive guidellm (0.8.1) as a subprocess and read back its per-request timings.

    run_guidellm(url, concurrency=4 | rate=8.0, requests=..., max_tokens=..., out_dir=...)
        -> [{"ttft_ms", "itl_ms", "tpot_ms", "output_tokens", raw timestamps...}, ...]

runs `guidellm run` against an OpenAI-compatible server at `url` (POST /v1/completions,
streaming; not chat) and returns one dict per *successful* request, read from guidellm's
own JSON report. Nothing here computes a latency: every number is guidellm's.

The command line (kind=...,key=value form; a value with odd characters is passed as a
JSON object instead, which guidellm's option parser also accepts):

    guidellm run
      --backend kind=openai_http,target=URL,request_format=/v1/completions,
                validate_backend=false[,model=M]
      --profile kind=concurrent,streams=C,warmup=0,cooldown=0        (closed loop)
            or  kind=poisson,rate=R,warmup=0,cooldown=0              (open loop, default)
            or  kind=constant,rate=R,warmup=0,cooldown=0             (rate_profile="constant")
      --constraint kind=max_requests,count=N
      --data kind=json_file,path=OUT/<stem>-data.jsonl
      --output kind=json,path=OUT/<stem>.json
      --disable-console
    (env: HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1, no inherited
     GUIDELLM__* variables, GUIDELLM__MAX_WORKER_PROCESSES=1 for poisson; cwd=out_dir so
     no stray .env file is read: guidellm's Settings read ./.env)

What each piece does (from guidellm's source, site-packages/guidellm/...):

* Data, no tokenizer. The data file has N rows {"prompt": "...", "output_tokens_count":
  max_tokens}. guidellm's generative column mapper maps `prompt` to its text column and
  `output_tokens_count` to its output-token-count column; the generative finalizer turns
  that into request.output_metrics.text_tokens, and the /v1/completions handler
  (backends/openai/request_handlers.py, TextCompletionsRequestHandler.format) then sends
      {"model", "prompt", "stream": true, "max_tokens": max_tokens, "ignore_eos": true,
       "stream_options": {"include_usage": true, "continuous_usage_stats": true}}
  ("stop": null is set too, and dropped before sending). A tokenizer (huggingface_auto,
  defaulting to the model name) is configured but created lazily and only called by the
  synthetic and trace data sources, so with a file of text prompts nothing is tokenized
  and nothing touches the Hugging Face hub.
* validate_backend=false: otherwise guidellm first GETs /health and aborts on a non-2xx
  (tests/served_stub.py has no /health). Without `model`, guidellm GETs /v1/models once
  and uses the first id.
* Warm-up/cool-down: profile warmup=0, cooldown=0 (also guidellm's default: no transient
  phase, nothing excluded); every request is in requests.successful / errored /
  incomplete. The report's warmup_duration is 0; its cooldown_duration comes out a few
  ms to ~0.1 s, but that is bookkeeping (the scheduler's stop time minus the last
  request's end), not a phase: no request is dropped. max_requests,count=N stops after
  N requests; the data file has exactly N rows.
* Profiles. concurrent,streams=C: C requests in flight, each stream sends its next request
  as soon as the previous ends (guidellm spreads the streams over min(C, 10) worker
  processes). poisson,rate=R: exponential inter-arrival times, random.Random(seed 42)
  drawn in the worker process. guidellm 0.8.1 seeds that generator identically in *every*
  worker process while accumulating the draws into one shared offset, so with W > 1
  workers each inter-arrival gap is repeated W times (with the default W = 10 the first
  ten gaps of a rate-8 run are all 0.1275 s) and the arrivals are not Poisson; this
  driver therefore runs poisson with one worker process (GUIDELLM__MAX_WORKER_PROCESSES=1),
  which gives exactly the Random(42).expovariate(R) sequence. constant,rate=R: request i
  (i = 1, 2, ...) targeted at start + i/R, a shared counter, correct with any number of
  workers. Both open-loop profiles run with unbounded concurrency.

The clock (backends/openai/http.py, OpenAIHTTPBackend._resolve_streaming; all times are
time.time(), wall clock, seconds, taken in the worker process):

* request_start: set by an httpx trace hook at "...send_request_headers.started", i.e.
  when the request's headers start going onto an already-open connection: after the
  scheduler's wait for the target time and after any TCP connect, before the body is
  sent. (It is first set just before client.stream(); the hook overwrites it.)
* every non-blank line of the SSE body from httpx's aiter_lines() is an "iteration"
  (request_iterations += 1); a line whose choices[0].text is non-empty is a *token
  iteration*: first_token_iteration is the time of the first one, last_token_iteration
  of the last one, token_iterations counts them. The usage-only chunk and [DONE] are
  iterations but not token iterations.
* request_end: after the stream's loop ends ([DONE] breaks it).

and the per-request metrics (schemas/base/request_stats.py, GenerativeRequestStats, all
serialized as computed fields in the JSON):

    time_to_first_token_ms   = 1000 * (first_token_iteration - request_start)
    inter_token_latency_ms   = 1000 * (last_token_iteration - first_token_iteration)
                                    / (output_tokens - 1)        (None if output_tokens <= 1)
    time_per_output_token_ms = 1000 * (last_token_iteration - request_start) / output_tokens
                               (TPOT *includes* the first token's wait: it is
                                (TTFT + (n-1)*ITL) / n, not the vLLM-style decode-only
                                TPOT; for 40 ms + 15 x 25 ms over 16 tokens it is ~25.9 ms)
    output_tokens            = output_metrics.total_tokens, where output_metrics is the
                               server's usage.completion_tokens (prefer_response_metrics,
                               default true) overriding the requested count; if the server
                               sends no usage it silently stays the *requested*
                               output_tokens_count, and only if neither exists does it fall
                               back to token_iterations (one token per chunk assumed).
                               So `token_iterations` is returned too, as a cross-check.

Fields read from the JSON (out_dir/<stem>.json): benchmarks[0].requests.successful[*]
    .time_to_first_token_ms -> ttft_ms      .inter_token_latency_ms  -> itl_ms
    .time_per_output_token_ms -> tpot_ms    .output_tokens           -> output_tokens
    .prompt_tokens, .request_latency, .request_dispatch_delay, .request_id,
    .request_args (the JSON body sent: max_tokens / ignore_eos are copied out),
    .info.timings.{targeted_start, request_start, first_token_iteration,
                   last_token_iteration, request_end, token_iterations,
                   request_iterations}
and, for checks only, benchmarks[0].requests.errored / .incomplete (counts) and
benchmarks[0].config.warmup / .cooldown (must be percent 0 / value null).

Caveats: each call pays guidellm's start-up (importing it, then spawning its worker
processes with multiprocessing "spawn", plus a fixed 1 s scheduler start delay): about
10 s of wall time per call on a 2-core machine before/after the requests themselves.
The timestamps are wall-clock time.time() in guidellm's workers, not comparable with a
server's perf_counter. In the open loop, request_start lags targeted_start by the
scheduler's own lateness (request_dispatch_delay, a few ms here); TTFT is counted from
request_start, so that lag is not in TTFT but does shift the offered arrival times.
"continuous_usage_stats" in stream_options is a vLLM extension that a strict server may
reject.

    python benchmarks/guidellm_driver.py [--out-dir DIR]   # demo against tests/served_stub.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

DEFAULT_GUIDELLM = str(Path.home() / ".cache/gate/guidellm-venv/bin/guidellm")

_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:@+-]*$")


def _opt(d: dict[str, Any]) -> str:
    """One guidellm option value: kind=...,key=value when every value is plain, else JSON."""
    if all(_SAFE_VALUE.match(str(v)) for v in d.values() if not isinstance(v, bool)):
        return ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in d.items())
    return json.dumps(d)


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def run_guidellm(
    url: str,
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    requests: int,
    max_tokens: int,
    out_dir: Path,
    guidellm: str = DEFAULT_GUIDELLM,
    rate_profile: str = "poisson",
    model: str | None = None,
    prompt: str = "Request {i}: tell me a story.",
    timeout_s: float = 900.0,
) -> list[dict[str, Any]]:
    """Run guidellm against `url` and return one dict per successful request.

    Exactly one of `concurrency` (closed loop, guidellm's "concurrent" profile) or `rate`
    (open loop, requests/s: `rate_profile` "poisson" (default) or "constant").
    `requests` requests, each asking for `max_tokens` tokens (ignore_eos) on
    /v1/completions, streaming. guidellm's JSON report, its log, the command line and the
    data file are written to `out_dir` as <stem>.json / .log / .cmd / -data.jsonl, with
    <stem> = guidellm-concurrent<C> or guidellm-<profile><R>.

    Each dict: ttft_ms, itl_ms, tpot_ms (floats, guidellm's definitions, see the module
    docstring; itl_ms is None when output_tokens <= 1), output_tokens (int, from the
    server's usage), token_iterations (chunks that carried text), max_tokens_sent,
    ignore_eos_sent, prompt_tokens, request_latency_s, dispatch_delay_s, request_id, and
    the raw wall-clock timestamps targeted_start_s, request_start_s, first_token_s,
    last_token_s, request_end_s. Raises RuntimeError if guidellm fails; warns if any
    request errored or was left incomplete.
    """
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency= or rate=")
    if requests < 1 or max_tokens < 1:
        raise ValueError("requests and max_tokens must be >= 1")
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)

    env = {k: v for k, v in os.environ.items() if not k.startswith("GUIDELLM__")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    profile: dict[str, Any]
    if concurrency is not None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        profile = {"kind": "concurrent", "streams": int(concurrency)}
        stem = f"guidellm-concurrent{int(concurrency)}"
    else:
        if rate_profile not in ("poisson", "constant"):
            raise ValueError("rate_profile must be 'poisson' or 'constant'")
        if not rate > 0:
            raise ValueError("rate must be > 0")
        profile = {"kind": rate_profile, "rate": float(rate)}
        stem = f"guidellm-{rate_profile}{float(rate):g}"
        if rate_profile == "poisson":
            # guidellm 0.8.1 seeds the poisson generator identically in every worker
            # process: one worker keeps the arrival sequence a real Poisson process.
            env["GUIDELLM__MAX_WORKER_PROCESSES"] = "1"
    profile.update(warmup=0, cooldown=0)

    data_path = out_dir / f"{stem}-data.jsonl"
    with data_path.open("w") as f:
        for i in range(requests):
            f.write(json.dumps({"prompt": prompt.format(i=i), "output_tokens_count": int(max_tokens)}) + "\n")
    json_path = out_dir / f"{stem}.json"
    log_path = out_dir / f"{stem}.log"
    if json_path.exists():
        json_path.unlink()

    backend: dict[str, Any] = {"kind": "openai_http", "target": url.rstrip("/"),
                               "request_format": "/v1/completions", "validate_backend": False}
    if model:
        backend["model"] = model
    cmd = [guidellm, "run",
           "--backend", _opt(backend),
           "--profile", _opt(profile),
           "--constraint", _opt({"kind": "max_requests", "count": int(requests)}),
           "--data", _opt({"kind": "json_file", "path": str(data_path)}),
           "--output", _opt({"kind": "json", "path": str(json_path)}),
           "--disable-console"]
    env_shown = " ".join(f"{k}={env[k]}" for k in sorted(env)
                         if k.startswith(("GUIDELLM__", "HF_", "TRANSFORMERS_OFFLINE")))
    (out_dir / f"{stem}.cmd").write_text(f"cd {shlex.quote(str(out_dir))} && {env_shown} {shlex.join(cmd)}\n")

    with tempfile.TemporaryDirectory(prefix="guidellm-hfds-") as hf_cache, log_path.open("w") as log:
        env["HF_DATASETS_CACHE"] = hf_cache  # the json_file loader (datasets.load_dataset) caches here
        try:
            proc = subprocess.run(cmd, cwd=out_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"guidellm ran past {timeout_s} s; log: {log_path}") from e
    if proc.returncode != 0 or not json_path.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"guidellm exited {proc.returncode} (log {log_path}):\n{tail}")

    report = json.loads(json_path.read_text())
    benches = report.get("benchmarks") or []
    if len(benches) != 1:
        raise RuntimeError(f"expected one benchmark in {json_path}, found {len(benches)}")
    bench = benches[0]
    reqs = bench.get("requests") or {}
    n_err, n_inc = len(reqs.get("errored") or []), len(reqs.get("incomplete") or [])
    if n_err or n_inc:
        warnings.warn(f"guidellm: {n_err} errored, {n_inc} incomplete requests ({json_path})", stacklevel=2)
    n_ok = len(reqs.get("successful") or [])
    if n_ok + n_err + n_inc != requests:
        warnings.warn(f"guidellm: {n_ok + n_err + n_inc} requests in the report, asked for {requests}",
                      stacklevel=2)
    for phase in ("warmup", "cooldown"):
        cfg = (bench.get("config") or {}).get(phase) or {}
        if cfg.get("percent") or cfg.get("value"):
            warnings.warn(f"guidellm ran with a {phase} phase: {cfg}", stacklevel=2)

    rows: list[dict[str, Any]] = []
    for r in reqs.get("successful") or []:
        t = (r.get("info") or {}).get("timings") or {}
        try:
            body = json.loads(r.get("request_args") or "{}").get("body") or {}
        except (TypeError, ValueError):
            body = {}
        rows.append({
            "ttft_ms": _num(r.get("time_to_first_token_ms")),
            "itl_ms": _num(r.get("inter_token_latency_ms")),
            "tpot_ms": _num(r.get("time_per_output_token_ms")),
            "output_tokens": int(r["output_tokens"]) if r.get("output_tokens") is not None else None,
            "token_iterations": t.get("token_iterations"),
            "request_iterations": t.get("request_iterations"),
            "max_tokens_sent": body.get("max_tokens"),
            "ignore_eos_sent": body.get("ignore_eos"),
            "prompt_tokens": r.get("prompt_tokens"),
            "request_latency_s": _num(r.get("request_latency")),
            "dispatch_delay_s": _num(r.get("request_dispatch_delay")),
            "request_id": r.get("request_id"),
            "targeted_start_s": _num(t.get("targeted_start")),
            "request_start_s": _num(t.get("request_start")),
            "first_token_s": _num(t.get("first_token_iteration")),
            "last_token_s": _num(t.get("last_token_iteration")),
            "request_end_s": _num(t.get("request_end")),
        })
    rows.sort(key=lambda d: d["request_start_s"] or 0.0)
    return rows


def _demo(argv: list[str] | None = None) -> int:
    import argparse
    import statistics
    import time

    ap = argparse.ArgumentParser(description="guidellm against tests/served_stub.py (40 ms TTFT, 25 ms ITL)")
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--guidellm", default=DEFAULT_GUIDELLM)
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="guidellm-demo-"))
    stub = subprocess.Popen([sys.executable, str(root / "tests/served_stub.py"), "--port", "0",
                             "--ttft-ms", "40", "--itl-ms", "25"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = stub.stdout.readline() if stub.stdout else ""
        if not line.startswith("PORT "):
            raise RuntimeError(f"stub did not start: {line!r}")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        print(f"stub at {url}; guidellm output in {out_dir}")
        ok = True
        for label, kw in (("concurrency 4", {"concurrency": 4}), ("poisson 8/s", {"rate": 8.0})):
            t0 = time.monotonic()
            rows = run_guidellm(url, requests=16, max_tokens=16, out_dir=out_dir, guidellm=args.guidellm, **kw)
            wall = time.monotonic() - t0
            good = (len(rows) == 16 and all(r["output_tokens"] == 16 == r["token_iterations"]
                                            and r["max_tokens_sent"] == 16 and r["ignore_eos_sent"] for r in rows))
            ok &= good
            med = {k: statistics.median(r[k] for r in rows) for k in ("ttft_ms", "itl_ms", "tpot_ms")}
            in_flight = max(sum(o["request_start_s"] <= r["request_start_s"] < o["request_end_s"] for o in rows)
                            for r in rows)
            print(f"{label:14s} n={len(rows):2d}  median ttft {med['ttft_ms']:6.2f} ms  itl {med['itl_ms']:6.2f} ms"
                  f"  tpot {med['tpot_ms']:6.2f} ms  output_tokens==16: {good}  max in flight {in_flight}"
                  f"  (guidellm wall {wall:.1f} s)")
        print("expected: ttft ~40 ms, itl ~25 ms, tpot ~(40 + 15*25)/16 = 25.9 ms")
        return 0 if ok else 1
    finally:
        stub.terminate()
        try:
            stub.wait(5)
        except subprocess.TimeoutExpired:
            stub.kill()


if __name__ == "__main__":
    sys.exit(_demo())
