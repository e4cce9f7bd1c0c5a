#!/usr/bin/env bash
# A/B of the reduce-scatter epilogue's atomics (session 46): old = d9234d3 (element atom),
# A = 69cf574 (blocked layout, red.v4), B = working tree (accumulator layout, red.v2).
R=${OUT:-gpu-out}; mkdir -p $R/conf $R/ab
export TRIDENT_CACHE_DIR=$PWD/bundle/cache
for w in 1 2 4 8; do
  echo "== world $w" >> $R/conf/conformance.log
  timeout 60 bundle/trident-alt test --backend nvidia --world $w >> $R/conf/conformance.log 2>&1
  echo "world $w rc=$?"
done
grep -E "^conformance:|FAIL" $R/conf/conformance.log | cut -c1-250
for shape in "moe_block bf16 2048 2048" "moe_block bf16 4096 4096" "moe_block bf16 4096 7168"; do
  for v in old A B; do
    bin=bundle/trident; [ $v = old ] && bin=bundle/trident-old; [ $v = B ] && bin=bundle/trident-alt
    [ "$shape" = "moe_block bf16 4096 7168" ] && [ $v = A ] && continue
    timeout 150 $bin bench --world 1 --only "$shape" --json $R/ab/$v-${shape// /_}.json > $R/ab/$v-${shape// /_}.log 2>&1
    echo "$v $shape rc=$?: $(grep -oE '\("moe-tp/down-rs", [0-9.]+\)|\("grouped/down", [0-9.]+\)|\("moe-tp/block", [0-9.]+\)' $R/ab/$v-${shape// /_}.log | tr '\n' ' ')"
  done
done
