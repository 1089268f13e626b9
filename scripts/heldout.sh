#!/usr/bin/env bash
# Held-out checks: models of every family that are NOT in the repository
# (other seeds and shapes: odd sizes, top-k 1 and 3, norm_topk_prob both
# ways, q_lora_rank null, half-split MLA rope, attention biases, other
# index_topk), generated with transformers, then checked through
# `run --json`, `eval --json` (and `eval --mtp`, `Model::draft`).
#
# Usage: PY=/path/to/venv/bin/python scripts/heldout.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT=${1:-/tmp/moestream-heldout}
mkdir -p "$OUT"
M="$PY scripts/make_oracle.py"
V="$PY scripts/oracle_variant.py"
$M --family qwen3_moe --seed 11 --out "$OUT/qwen3_a" --hidden 40 --top-k 1 --norm-topk-prob 0 --experts 6 --heads 5 --kv-heads 1 --head-dim 12
$M --family qwen3_moe --seed 12 --out "$OUT/qwen3_b" --top-k 3 --norm-topk-prob 1 --layers 3
$M --family qwen2_moe --seed 13 --out "$OUT/qwen2_a" --top-k 3 --norm-topk-prob 1 --hidden 56
$M --family qwen2_moe --seed 14 --out "$OUT/qwen2_b" --top-k 1 --experts 5
$M --family mixtral --seed 16 --out "$OUT/mixtral_b" --top-k 3 --experts 7
$M --family olmoe --seed 17 --out "$OUT/olmoe_a" --top-k 3 --norm-topk-prob 1
$M --family olmoe --seed 18 --out "$OUT/olmoe_b" --top-k 1 --norm-topk-prob 0 --heads 6 --head-dim 10 --hidden 60
$M --family deepseek_v3 --seed 21 --out "$OUT/dsv3_a" --top-k 2 --n-group 2 --topk-group 1 --hidden 48
$M --family deepseek_v3 --seed 22 --out "$OUT/dsv3_b" --layers 4 --top-k 1
$M --family glm_moe_dsa --seed 23 --out "$OUT/dsa_a" --index-topk 3
$M --family glm_moe_dsa --seed 24 --out "$OUT/dsa_b" --index-topk 6 --hidden 56 --top-k 3
$M --family glm4_moe --seed 25 --out "$OUT/glm4_a" --top-k 3 --norm-topk-prob 0
$V deepseek_v3 "$OUT/dsv3_noqlora" '{"norm_topk_prob": false, "rope_interleave": false}' '{"q_lora": null}' 41
$V glm4_moe "$OUT/glm4_noqk" '{"use_qk_norm": false, "norm_topk_prob": false}' '{}' 42
$V deepseek_v3 "$OUT/dsv3_bias" '{"attention_bias": true}' '{}' 43
$V mixtral "$OUT/mixtral_sw" '{"sliding_window": 5}' '{}' 51
$V qwen2_moe "$OUT/qwen2_sw" '{"use_sliding_window": true, "sliding_window": 6, "max_window_layers": 2, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}' '{}' 52
$V qwen3_moe "$OUT/qwen3_sw" '{"use_sliding_window": true, "sliding_window": 7}' '{}' 53
MOESTREAM_ORACLE_DIRS=$(ls -d "$OUT"/*/ | tr '\n' ':') cargo test --test oracle -- --ignored --nocapture
