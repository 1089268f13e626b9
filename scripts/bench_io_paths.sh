#!/bin/bash
# Side-by-side: a layer's expert misses read one by one (--submit sync) or as one
# io_uring batch while hits compute (--submit reactor), O_DIRECT, 4 experts cached
# per layer, on a 2.7 GB synthetic model made with:
#   moestream synth --out /work/bigsynth --hidden 1024 --layers 8 --experts 64 --moe-inter 1024 --seed 3
for round in 1 2 3 4 5; do
  for io in sync reactor; do
    ./target/release/moestream run --model ${MODEL:-/work/bigsynth} --prompt "The engine reads" --max-tokens 24 --ignore-eos --read-mode direct --expert-cache 4 --submit $io --json | python3 -c "
import json,sys; s=json.load(sys.stdin)['stats']; print('$io', '%.2f tok/s'%s['tok_per_s'], 'disk %.2fs'%s['expert_disk_s'], 'matmul %.2fs'%s['expert_matmul_s'], 'hit %.2f'%s['expert_hit_rate'], 'GB %.2f'%(s['expert_bytes_read']/1e9), 'secs %.2f'%s['seconds'])"
  done
done
