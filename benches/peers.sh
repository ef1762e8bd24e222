#!/usr/bin/env bash
# Each layer against its natural peer and against its floor (the least any
# layer of its kind must do), as instructions added per request over the
# bare inner service, counted by callgrind in the bench binaries: steady on
# a shared, noisy machine, unlike time. One command for the whole table, so
# that anyone can repeat it:
#
#   bash benches/peers.sh            # about a minute after the build
#
# Needs valgrind. Counts are for this machine's compiler and this bench
# source; compare them within one run, not across builds.
#
# - rate_limit: `TT_LOOP=<contender>` runs one contender's requests in
#   `request_loop` (governor's own calls in `check_loop`), and callgrind
#   counts that function alone: its total over the requests is the cost of
#   one request, the bare service's included.
# - concurrency, identity: `TT_<BENCH>_COUNT=<contender>` runs one
#   contender n times; the count at 40,000 less the count at 20,000, over
#   20,000, is one request's, start-up excluded.
set -euo pipefail
shopt -s inherit_errexit # a failed count inside $(...) stops the script
cd "$(dirname "$0")/.."
# The rate-limit bench's request would change with it.
unset TT_HEADERS
fail() {
  echo "peers.sh: $*" >&2
  exit 1
}

command -v valgrind >/dev/null || fail "valgrind is needed (apt-get install valgrind)"

N=20000
work=$(mktemp -d "${TMPDIR:-/tmp}/peers.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "building the benches..." >&2
cargo bench --no-run --message-format=json \
  --bench rate_limit --bench concurrency --bench identity >"$work/build.json"
binary() {
  local path
  path=$(grep -o "\"executable\":\"[^\"]*/deps/$1-[^\"]*\"" "$work/build.json" |
    tail -1 | cut -d'"' -f4) || true
  [[ -x $path ]] || fail "no $1 bench binary in cargo's output"
  echo "$path"
}
rate_limit=$(binary rate_limit)
concurrency=$(binary concurrency)
identity=$(binary identity)

# The total a callgrind run collected; a run that failed, or counted
# nothing (a pattern that matched no function), stops the script rather
# than print a plausible wrong number.
collected() {
  local total
  total=$(awk '/^(summary|totals):/ { print $2; exit }' "$1")
  [[ $total =~ ^[0-9]+$ && $total -gt 0 ]] || fail "no count in $1"
  echo "$total"
}

# Instructions per request of one rate-limit contender, counted in `$2`.
in_loop() {
  local out="$work/$1.out"
  TT_LOOP=$1 TT_LOOP_N=$N valgrind --tool=callgrind --callgrind-out-file="$out" \
    --collect-atstart=no --toggle-collect="rate_limit::$2*" "$rate_limit" \
    >/dev/null 2>"$out.log" || fail "$1 failed: $(grep -m1 -A1 panicked "$out.log" || tail -3 "$out.log")"
  local total
  total=$(collected "$out")
  echo $((total / N))
}

# Instructions per request of one contender of a bench with a count mode.
by_difference() {
  local bin=$1 env=$2 name=$3 total totals=()
  for iters in $N $((2 * N)); do
    local out="$work/$env-$name-$iters.out"
    env "${env}_COUNT=$name" "${env}_ITERS=$iters" \
      valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" \
      >/dev/null 2>"$out.log" || fail "$name failed: $(grep -m1 -A1 panicked "$out.log" || tail -3 "$out.log")"
    total=$(collected "$out")
    totals+=("$total")
  done
  echo $(((totals[1] - totals[0]) / N))
}

echo "counting..." >&2
declare -A rl cc id
for c in bare_inner ours_global floor_global tower_limit_rate ours_header floor_header \
  tower_governor_header ours_header_response_headers tower_http_two_headers_fixed \
  tower_http_two_headers_formatted; do
  rl[$c]=$(in_loop "$c" request_loop)
done
rl[governor_direct]=$(in_loop governor_direct check_loop)
for c in bare_inner tower_concurrency_limit ours_global ours_header floor_header; do
  cc[$c]=$(by_difference "$concurrency" TT_CONCURRENCY "$c")
done
for c in bare_inner tower_http_set_header tower_map_request_host_path ours_1_rule_hit; do
  id[$c]=$(by_difference "$identity" TT_IDENTITY "$c")
done

# "a/b" as a ratio with two decimals.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f×", a / b }'
}

gl=$((rl[ours_global] - rl[bare_inner]))
gl_floor=$((rl[floor_global] - rl[bare_inner]))
gl_tower=$((rl[tower_limit_rate] - rl[bare_inner]))
gov=${rl[governor_direct]} # a bare call: all of it is added
hk=$((rl[ours_header] - rl[bare_inner]))
hk_floor=$((rl[floor_header] - rl[bare_inner]))
hk_peer=$((rl[tower_governor_header] - rl[bare_inner]))
rh=$((rl[ours_header_response_headers] - rl[ours_header]))
rh_fixed=$((rl[tower_http_two_headers_fixed] - rl[bare_inner]))
rh_formatted=$((rl[tower_http_two_headers_formatted] - rl[bare_inner]))
cg=$((cc[ours_global] - cc[bare_inner]))
ch=$((cc[ours_header] - cc[bare_inner]))
ch_floor=$((cc[floor_header] - cc[bare_inner]))
tcl=$((cc[tower_concurrency_limit] - cc[bare_inner]))
ir=$((id[ours_1_rule_hit] - id[bare_inner]))
ir_peer=$((id[tower_http_set_header] - id[bare_inner]))
ir_closure=$((id[tower_map_request_host_path] - id[bare_inner]))

cat <<EOF

Instructions added per request over the bare service ($N requests a count).

| layer, shape | ours | natural peer | ours / peer | floor | floor / peer | goal |
| --- | ---: | ---: | ---: | ---: | ---: | ---: |
| \`RateLimitLayer\` + \`GlobalKey\`, reject | $gl | governor direct \`check()\` $gov; tower \`RateLimit\` $gl_tower | $(ratio $gl $gov) | $gl_floor | floor $(ratio $gl_floor $gov) | ≤ 1.0× governor |
| \`RateLimitLayer\` + header key | $hk | tower_governor $hk_peer | $(ratio $hk $hk_peer) | $hk_floor | floor $(ratio $hk_floor $hk_peer) | ≤ 0.6× |
| \`ConcurrencyLayer\` + \`GlobalKey\` | $cg | tower \`ConcurrencyLimit\` $tcl | $(ratio $cg $tcl) | | | ≤ 1.0× |
| \`ConcurrencyLayer\` + header key | $ch | tower \`ConcurrencyLimit\` $tcl | $(ratio $ch $tcl) | $ch_floor | floor $(ratio $ch_floor $tcl) | ≤ 1.3× |
| \`IdentityHeaderLayer\`, one rule | $ir | tower-http \`SetRequestHeader\` $ir_peer; the rule as a closure $ir_closure | $(ratio $ir $ir_peer) | | | ≤ 2.0× |
| response headers (IETF), their part | $rh | tower-http, the value formatted $rh_formatted | $(ratio $rh $rh_formatted) | tower-http, two constant headers: $rh_fixed | | ≤ 800 |
EOF
