"""Agreement of moestream with the transformers oracle, one row per model dir.

For each DIR/oracle.json: greedy tokens matched (run --json), teacher-forced
argmax positions matched and max |Δlogit| / max |logit| of the last position
(eval --json), for each --mla mode where the family has MLA.
Needs only the built binary and the standard library.

Usage: python3 scripts/agreement.py [--bin target/release/moestream] DIR...
"""
import json, subprocess, sys

def main(argv):
    binary = "target/release/moestream"
    if argv[:1] == ["--bin"]:
        binary, argv = argv[1], argv[2:]
    print("| model | mla | greedy | argmax | last-logits rel diff | mtp one-step |")
    print("| --- | --- | --- | --- | --- | --- |")
    for d in argv:
        o = json.load(open(f"{d}/oracle.json"))
        cfg = json.load(open(f"{d}/config.json"))
        modes = ["absorb", "explicit"] if cfg["model_type"] in ("deepseek_v3", "glm_moe_dsa") else ["-"]
        ids = lambda v: ",".join(map(str, v))
        for mode in modes:
            extra = [] if mode == "-" else ["--mla", mode]
            run = subprocess.run([binary, "run", "--model", d, "--prompt-ids", ids(o["prompt_ids"]),
                                  "--max-tokens", str(len(o["greedy_ids"])), "--ignore-eos", "--json"] + extra,
                                 capture_output=True, text=True, check=True)
            got = json.loads(run.stdout)["token_ids"]
            same = sum(a == b for a, b in zip(got, o["greedy_ids"]))
            mtp = ["--mtp"] if "mtp" in o else []
            ev = json.loads(subprocess.run([binary, "eval", "--model", d, "--prompt-ids", ids(o["eval_ids"]), "--json"]
                                           + extra + mtp, capture_output=True, text=True, check=True).stdout)
            am = sum(a == b for a, b in zip(ev["argmax"], o["argmax"]))
            want = o["last_logits"]
            rel = max(abs(a - b) for a, b in zip(ev["last_logits"], want)) / max(abs(b) for b in want)
            mtp_col = "-"
            if mtp:
                m = sum(a == b for a, b in zip(ev["mtp_argmax"], o["mtp"]["one_step"]))
                mtp_col = f"{m}/{len(o['mtp']['one_step'])}"
            name = d.rstrip("/").split("/")[-1]
            print(f"| {name} | {mode} | {same}/{len(o['greedy_ids'])} | {am}/{len(o['argmax'])} | {rel:.1e} | {mtp_col} |")

if __name__ == "__main__":
    main(sys.argv[1:])
