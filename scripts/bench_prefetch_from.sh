#!/usr/bin/env bash
# Lookahead prefetch off / from attn / from output, cold decode at a 3 GB
# budget inside a 3 GB memory cgroup, alternating rounds; DISK_MBS set
# throttles the disk's reads (scripts/in_cgroup.sh). One line of
# `bench decode` key=value fields per run under OUT/.
#
#   scripts/bench_prefetch_from.sh BIN MODEL ROUNDS OUT [TOKENS]
#   DISK_MBS=1500 scripts/bench_prefetch_from.sh target/release/moestream /work/q30r 7 /tmp/pf-t1500
set -euo pipefail
BIN=${1:?moestream binary} MODEL=${2:?model} ROUNDS=${3:?rounds} OUT=${4:?output dir} TOKENS=${5:-64}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
for r in $(seq 1 "$ROUNDS"); do
  for cfg in off attn output; do
    case $cfg in
      off) flags=(--prefetch off) ;;
      *) flags=(--prefetch on --prefetch-from "$cfg") ;;
    esac
    sync && echo 3 > /proc/sys/vm/drop_caches
    RAM_GB=3 DISK_DIR="$MODEL" scripts/in_cgroup.sh "$BIN" bench decode --model "$MODEL" \
      --ram-gb 3 --cold --tokens "$TOKENS" "${flags[@]}" > "$OUT/pf-$cfg-$r.json" 2> "$OUT/pf-$cfg-$r.err"
    echo "round $r $cfg: $(grep -o 'decode_tok_s=[0-9.]*' "$OUT/pf-$cfg-$r.json")"
  done
done
python3 - "$OUT" <<'PY'
import glob, statistics as st, sys
rows = {}
for f in sorted(glob.glob(sys.argv[1] + "/pf-*-*.json")):
    cfg = f.rsplit("/", 1)[1].split("-")[1]
    rows.setdefault(cfg, []).append(dict(kv.split("=", 1) for kv in open(f).read().split()))
off = st.median(float(x["decode_tok_s"]) for x in rows["off"])
print("| prefetch | decode tok/s (median) | ÷ off | runs | decode MB/token | wasted MB (run) | used / issued | overlap |")
print("|---|---|---|---|---|---|---|---|")
for cfg in ["off", "attn", "output"]:
    r = rows[cfg]
    med = lambda k: st.median(float(x[k]) for x in r)
    tok = [float(x["decode_tok_s"]) for x in r]
    print(f"| {cfg} | {st.median(tok):.2f} | {st.median(tok) / off:.3f} | {' '.join('%.2f' % t for t in tok)} "
          f"| {med('decode_mb_per_tok'):.1f} | {med('prefetch_wasted_mb'):.0f} "
          f"| {med('prefetch_used'):.0f} / {med('prefetch_issued'):.0f} | {med('overlap'):.3f} |")
PY
