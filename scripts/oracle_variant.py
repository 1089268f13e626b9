"""Held-out oracle variants that make_oracle.py flags cannot express: build the family's config,
then set extra config attributes (JSON), e.g. q_lora_rank null or rope_interleave false.

Usage: python scripts/oracle_variant.py FAMILY OUT_DIR '{"rope_interleave": false}' '{"q_lora": null}' SEED
"""
import sys, json
sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(__file__)))
import make_oracle as mo
from dataclasses import replace
import torch, transformers
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
orig = mo.build_config
TWEAKS = json.loads(sys.argv[3])
def patched(family, s, eos_id):
    cfg = orig(family, s, eos_id)
    for k, v in TWEAKS.items():
        setattr(cfg, k, v)
    return cfg
mo.build_config = patched
fam, out = sys.argv[1], sys.argv[2]
seed, shape = mo.ALL_FIXTURES[fam]
shape_over = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
shape = replace(shape, **shape_over)
mo.generate(fam, int(sys.argv[5]) if len(sys.argv) > 5 else 31, shape, out)
