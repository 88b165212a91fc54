pip install --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site
A='{"E": 256, "Ev": 8, "L": 65, "S": 65, "area": "sdpa", "batch": [2], "causal": false, "dtype": "bfloat16", "empty_rows": 16, "gqa": true, "hkv": 2, "hq": 16, "layout_dout": "contiguous", "layout_k": "transposed", "layout_q": "transposed", "layout_v": "transposed", "mask": "bool_bcast", "scale": 0.75, "score_target": 0.0, "seed": 65065, "value_scale": 1.0}'
C='{"E": 64, "Ev": 128, "L": 255, "S": 255, "area": "sdpa", "batch": [2], "causal": false, "dtype": "bfloat16", "empty_rows": 31, "gqa": false, "hkv": 2, "hq": 2, "layout_dout": "transposed", "layout_k": "sliced", "layout_q": "sliced", "layout_v": "sliced", "mask": "finfo_min_bcast", "scale": null, "score_target": 0.0, "seed": 255255, "value_scale": 30.0}'
E='{"E": 64, "Ev": 64, "L": 255, "S": 255, "area": "sdpa", "batch": [1], "causal": true, "dtype": "float16", "empty_rows": 0, "gqa": true, "hkv": 1, "hq": 1, "layout_dout": "broadcast", "layout_k": "contiguous", "layout_q": "sliced", "layout_v": "sliced", "mask": "none", "scale": 1.3541, "score_target": 10000.0, "seed": 1125, "value_scale": 1.0}'
{
for imp in torch torch-cudnn; do echo "== A $imp"; timeout 60 python3 -m attention_oracle replay --impl $imp --check sdpa.fully_masked_rows "$A" 2>&1 | grep -v "^  \|^$" | head -4; done
for imp in torch torch-cudnn; do echo "== C strided $imp"; timeout 60 python3 -m attention_oracle replay --impl $imp --check sdpa.strided_dout "$C" 2>&1 | grep -v "^  \|^$" | head -4; echo "== C gradient $imp"; timeout 60 python3 -m attention_oracle replay --impl $imp --check sdpa.gradient_agreement "$C" 2>&1 | grep -v "^  \|^$" | head -4; done
for imp in torch torch-cudnn torch-flash torch-efficient torch-math; do echo "== E $imp"; timeout 60 python3 -m attention_oracle replay --impl $imp --check sdpa.mismatched_value_rows "$E" 2>&1 | grep -v "^  \|^$" | head -4; echo "rc ${PIPESTATUS[0]}"; done
} > $OUT/replays.log 2>&1
cat $OUT/replays.log | cut -c1-250
OUT=$OUT/g BUDGET=330 WORKERS=14 bash .ci/gpu fastoracle --impl fast --impl oracle --oracle-check-budget 30 attention_oracle/conformance/test_sdpa.py 2>&1 | grep -A40 "^implementation " | head -42
cd $OUT && tar czf all.tgz replays.log g && ls
