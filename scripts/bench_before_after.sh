#!/bin/bash
# Three alternating rounds of warm and cold bench decode, before (main) and after (h32).
M=/work/h32-q30s
warm() { "$1" bench decode --model $M --ram-gb 4 --io buffered --tokens 32 --warmup --no-history 2>&1 | grep -o 'decode_tok_s=[0-9.]*\|hit_rate=[0-9.]*' | tr '\n' ' '; }
cold() { "$1" bench decode --model $M --ram-gb 0.75 --io direct --cold --tokens 32 --no-history 2>&1 | grep -o 'decode_tok_s=[0-9.]*\|hit_rate=[0-9.]*\|read_mb_per_tok=[0-9.]*' | tr '\n' ' '; }
B=/work/h32-moestream-base; A=/work/h32-moestream-mine
for r in 1 2 3; do
  if [ $((r % 2)) -eq 1 ]; then first=$B; second=$A; else first=$A; second=$B; fi
  for kind in warm cold; do
    for bin in $first $second; do
      name=before; [ "$bin" = "$A" ] && name=after
      echo "round $r $kind $name $($kind $bin)"
    done
  done
done
