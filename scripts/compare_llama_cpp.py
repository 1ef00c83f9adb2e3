#!/usr/bin/env python3
"""Runs kvcache and llama.cpp side by side on the same GGUF files and prints the ratios.

llama.cpp is a yardstick only: build it out of tree (see the README) and point --llama-cpp at
its bin directory. Speed: `kvcache bench --json` against `llama-bench -o json`, same -p, -n,
-t, -r and KV type, one file after the other in one run. Accuracy (--text FILE): `kvcache
perplexity` against `llama-perplexity`, same -c and --chunks.
"""

import argparse
import json
import os
import re
import subprocess
import sys


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return result


def bench_rows(rows):
    """(test name, tokens per second) for each test of a llama-bench style JSON array."""
    out = {}
    for row in rows:
        name = f"pp{row['n_prompt']}" if row["n_gen"] == 0 else f"tg{row['n_gen']}"
        out[name] = row["avg_ts"]
    return out


def perplexity(output):
    match = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", output)
    return float(match.group(1)) if match else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="GGUF files")
    parser.add_argument("--llama-cpp", required=True, help="llama.cpp's bin directory")
    parser.add_argument("--kvcache", default="build/release/src/cli/kvcache")
    parser.add_argument("-p", default="512")
    parser.add_argument("-n", default="128")
    parser.add_argument("-t", default="2")
    parser.add_argument("-r", default="3")
    parser.add_argument("--kv-dtype", default="f16")
    parser.add_argument("--text", help="also compare perplexity on this text file")
    parser.add_argument("-c", default="128", help="perplexity context per chunk")
    parser.add_argument("--chunks", default="8")
    args = parser.parse_args()

    llama_bench = os.path.join(args.llama_cpp, "llama-bench")
    llama_ppl = os.path.join(args.llama_cpp, "llama-perplexity")
    common = ["-p", args.p, "-n", args.n, "-t", args.t, "-r", args.r]
    print(f"| model | test | kvcache t/s | llama.cpp t/s | ratio |")
    print(f"|---|---|---|---|---|")
    for model in args.models:
        ours = bench_rows(json.loads(run([args.kvcache, "bench", "-m", model, *common,
                                          "--kv-dtype", args.kv_dtype, "--json"]).stdout))
        theirs = bench_rows(json.loads(run([llama_bench, "-m", model, *common, "-ctk",
                                            args.kv_dtype, "-ctv", args.kv_dtype, "-o",
                                            "json"]).stdout))
        for test, ts in ours.items():
            other = theirs.get(test)
            ratio = f"{ts / other:.2f}x" if other else "-"
            print(f"| {os.path.basename(model)} | {test} | {ts:.1f} | "
                  f"{other if other is None else round(other, 1)} | {ratio} |")
    if not args.text:
        return
    print()
    print("| model | kvcache PPL | llama.cpp PPL | difference |")
    print("|---|---|---|---|")
    for model in args.models:
        ppl = ["-f", args.text, "-c", args.c, "--chunks", args.chunks]
        ours = perplexity(run([args.kvcache, "perplexity", "-m", model, *ppl, "--kv-dtype",
                               args.kv_dtype]).stdout)
        theirs_run = run([llama_ppl, "-m", model, *ppl, "-b", args.c, "-t", args.t, "-ctk",
                          args.kv_dtype, "-ctv", args.kv_dtype])
        theirs = perplexity(theirs_run.stdout + theirs_run.stderr)
        diff = f"{(ours / theirs - 1) * 100:+.4f}%" if ours and theirs else "-"
        print(f"| {os.path.basename(model)} | {ours} | {theirs} | {diff} |")


if __name__ == "__main__":
    main()
