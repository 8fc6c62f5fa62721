# The --json KIND part of scripts/bench/tokenize (sourced by it, with its variables: root tok work corpus bytes vocab
# runs cores mb out json python): tokenizer.json throughput, the tokenizers library's encode_batch against
# diloco-tokenize, at 1 and 2 threads on the same cores.
# shellcheck disable=SC2154
helper="$root/scripts/bench/tokenize_json.py"
"$python" -c "import tokenizers" || { echo "no tokenizers in $python (--python)" >&2; exit 1; }
model="$work/$json-$vocab/tokenizer.json"
mkdir -p "$(dirname "$model")"
[[ -s "$model" ]] || "$python" "$helper" train "$json" "$vocab" "$root/tests/data/tinyshakespeare.txt" "$model"
seconds() {
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
theirs() { RAYON_NUM_THREADS=$1 taskset -c "$cores" "$python" "$helper" time "$model" "$corpus" 2>/dev/null; }
ours() {
  rm -rf "$work/out" "$work/out.partial"
  taskset -c "$cores" "$tok" --text "$corpus" --vocab-size "$vocab" --tokenizer-model "$model" --threads "$1" \
    --out "$work/out"
}
declare -a h_1 h_2 o_1 o_2
for ((i = 0; i < runs; ++i)); do  # interleaved, so a slow moment of the machine hits every tool alike
  h_1+=("$(theirs 1)")
  o_1+=("$(seconds ours 1)")
  h_2+=("$(theirs 2)")
  o_2+=("$(seconds ours 2)")
  echo "run $((i + 1))/$runs: tokenizers ${h_1[-1]} / ${h_2[-1]} s, diloco-tokenize ${o_1[-1]} / ${o_2[-1]} s" >&2
done
m_h1=$(median "${h_1[@]}") m_h2=$(median "${h_2[@]}") m_o1=$(median "${o_1[@]}") m_o2=$(median "${o_2[@]}")
rate() { echo "scale=2; $bytes / 1000000 / $1" | bc -l; }
ratio() { echo "scale=2; $1 / $2" | bc -l; }
version=$("$python" -c "import tokenizers; print(tokenizers.__version__)")
table=$(cat <<MD
Corpus: $(echo "scale=1; $bytes / 1000000" | bc -l) MB ($bytes bytes) of tinyshakespeare lines shuffled (seed 1234);
tokenizer.json: BPE of kind $json (scripts/bench/tokenize_json.py), vocab $vocab, trained by tokenizers $version;
cores: taskset -c $cores ($(nproc) online); $runs runs each, interleaved; median wall time. tokenizers: read the
file, cut it into ~8 KiB pieces of whole lines, encode_batch(add_special_tokens=False), timed inside Python;
diloco-tokenize: the whole process, writing the shards and the manifest too.

| tool | threads | median s | MB/s | diloco-tokenize vs tokenizers |
|---|---|---|---|---|
| tokenizers encode_batch | 1 | $m_h1 | $(rate "$m_h1") | |
| diloco-tokenize --tokenizer-model tokenizer.json | 1 | $m_o1 | $(rate "$m_o1") | $(ratio "$m_h1" "$m_o1")x |
| tokenizers encode_batch | 2 | $m_h2 | $(rate "$m_h2") | |
| diloco-tokenize --tokenizer-model tokenizer.json | 2 | $m_o2 | $(rate "$m_o2") | $(ratio "$m_h2" "$m_o2")x |

All runs (s): tokenizers ${h_1[*]} / ${h_2[*]}; diloco-tokenize ${o_1[*]} / ${o_2[*]}.
MD
)
echo "$table"
if [[ -n "$out" ]]; then
  {
    echo "# Tokenizer throughput: diloco-tokenize against the tokenizers library (tokenizer.json, $json)"
    echo
    echo "Command: \`scripts/bench/tokenize --json $json --mb $mb --runs $runs --vocab $vocab --cores $cores\`" \
      "($(date -u +%Y-%m-%d))"
    echo
    echo "$table"
  } >"$out"
fi
