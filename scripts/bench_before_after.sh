#!/bin/bash
# Three alternating rounds of warm and cold bench decode of MODEL with two
# moestream binaries, BEFORE and AFTER (results/renovation-bench.md):
#   MODEL=DIR BEFORE=BIN AFTER=BIN scripts/bench_before_after.sh
M=${MODEL:?set MODEL to a model directory}
warm() { "$1" bench decode --model $M --ram-gb 4 --io buffered --tokens 32 --warmup --no-history 2>&1 | grep -o 'decode_tok_s=[0-9.]*\|hit_rate=[0-9.]*' | tr '\n' ' '; }
cold() { "$1" bench decode --model $M --ram-gb 0.75 --io direct --cold --tokens 32 --no-history 2>&1 | grep -o 'decode_tok_s=[0-9.]*\|hit_rate=[0-9.]*\|read_mb_per_tok=[0-9.]*' | tr '\n' ' '; }
B=${BEFORE:?set BEFORE to a moestream binary}; A=${AFTER:?set AFTER to a moestream binary}
for r in 1 2 3; do
  if [ $((r % 2)) -eq 1 ]; then first=$B; second=$A; else first=$A; second=$B; fi
  for kind in warm cold; do
    for bin in $first $second; do
      name=before; [ "$bin" = "$A" ] && name=after
      echo "round $r $kind $name $($kind $bin)"
    done
  done
done
