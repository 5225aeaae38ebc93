#!/usr/bin/env bash
# scripts/verify-independent.sh RELEASE_FOLDER [--key PUB | --fingerprint sha256:HEX] [--hosts FILE]
#     [--hosts-history DIR] [--registry [--fetch skopeo|curl] [--ca FILE] [--auth-file FILE]]
#
# VERIFYING.md, step by step, with openssl, jq and sha256sum (bash and coreutils around them; git only to
# read earlier versions of hosts.json, skopeo or curl only to fetch from the registry). No code of the
# toolkit runs: this is what someone who does not trust it can check.
#
# Exit: 0 verified; 1 a check failed (the message names the step, the file and what differs); 2 usage or a
# missing tool; 3 incomplete: everything read verified, but something could not be checked with these tools
# (a keyless host's evidence, an earlier hosts.json not at hand), named in the output.
set -euo pipefail
export LC_ALL=C

STEP=0
INCOMPLETE=()
LIMIT=$((16 * 1024 * 1024))  # every record is kilobytes; an attestation layer (an SBOM) well under this
NS="https://blackwell-qualify.dev"
STATEMENT="https://in-toto.io/Statement/v1"
QUALIFICATION="$NS/qualification/v1"
RELEASE_STATEMENT="$NS/release-statement/v2"
IN_TOTO="application/vnd.in-toto+json"
# The implied rule of a release signed before release.json held a policy (release/policy.py).
IMPLIED_PASSES=7
IMPLIED_CHECKS='["gpu.memory","gpu.triton-scratch","gpu.bf16-matmul","gpu.torch-compile"]'
# The serving matrix's checks (probe/servematrix.py: CHECK_IDS), the only ones a policy's level_checks may name.
SERVE_CHECKS='["serve.determinism","serve.niah","serve.tools","serve.soak","serve.providers","serve.accuracy"]'
SERVE_TYPE="$NS/serve-check/v1"
TARGET_RE='^[a-z0-9][a-z0-9-]{0,31}$'
HEX_RE='^[0-9a-f]{64}$'

usage() {
  sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --- output -------------------------------------------------------------------------------------------

clean() { printf '%s' "$*" | tr -c '[:print:]\n' '?'; }
step() { STEP=$1; shift; printf 'step %s: %s\n' "$STEP" "$(clean "$*")"; }
ok() { printf '  ok: %s\n' "$(clean "$*")"; }
note() { printf '  note: %s\n' "$(clean "$*")"; }
fail() {
  printf 'verify-independent: FAILED at step %s: %s\n' "$STEP" "$(clean "$*")" >&2
  exit 1
}
incomplete() {
  INCOMPLETE+=("step $STEP: $*")
  printf '  NOT CHECKED: %s\n' "$(clean "$*")"
}
need() { command -v "$1" >/dev/null 2>&1 || { echo "verify-independent: $1 is needed ($2)" >&2; exit 2; }; }

# --- files, hashes, signatures ------------------------------------------------------------------------

# A regular file (never a symbolic link) of at most LIMIT bytes.
readable() {
  [[ -f $1 && ! -L $1 ]] || fail "$1: missing, or not a regular file"
  local size
  size=$(wc -c <"$1")
  ((size <= LIMIT)) || fail "$1: $size bytes, more than the $LIMIT a record may have"
}
sha() { readable "$1"; sha256sum "$1" | cut -d' ' -f1; }
j() { jq -r "$@"; }  # one value of a JSON file, raw
US=$'\x1f'  # the separator of several values read at once (never in our values; tabs would merge empty fields)
json() { readable "$1"; jq -e 'type == "object"' "$1" >/dev/null 2>&1 || fail "$1: not a JSON object"; }

fingerprint_of() { openssl pkey -pubin -in "$1" -outform DER 2>/dev/null | sha256sum | cut -d' ' -f1; }
hint_of() { openssl pkey -pubin -in "$1" -outform DER 2>/dev/null | openssl dgst -sha256 -binary | openssl base64 -A; }

# verify_sig KEY DATA B64SIG WHAT: an ECDSA P-256 signature over SHA-256 of DATA (cosign sign-blob's format).
# The signature text must be strict base64 (whitespace aside) of one DER SEQUENCE and nothing after it, as the
# toolkit reads it (signing/formats.py: decode_signature, then a strict DER parse): openssl would skip the rest.
sig_der() {  # sig_der B64SIG OUT: decode, or return 1
  local b64 size head
  b64=$(printf '%s' "$1" | tr -d ' \n\r\t')
  [[ -n $b64 && $b64 =~ ^[A-Za-z0-9+/]*={0,2}$ ]] && ((${#b64} % 4 == 0)) || return 1
  printf '%s' "$b64" | openssl base64 -d -A >"$2" 2>/dev/null || return 1
  size=$(wc -c <"$2")
  read -r -a head < <(od -An -tu1 -N2 "$2")
  ((size >= 2 && head[0] == 48 && head[1] < 128 && head[1] + 2 == size))
}

verify_sig() {
  local der="$WORK/sig.der"
  sig_der "$3" "$der" || fail "$4: the signature is not base64 of one DER signature (nothing before or after it)"
  openssl dgst -sha256 -verify "$1" -signature "$der" "$2" >/dev/null 2>&1 ||
    fail "$4: its signature does not verify with $(basename "$1") (the file changed after signing, or another key signed it)"
}

# sig_verifies KEY DATA B64SIG: verify_sig's test, without failing (which of several keys signed DATA).
sig_verifies() {
  local der="$WORK/try.der"
  sig_der "$3" "$der" || return 1
  openssl dgst -sha256 -verify "$1" -signature "$der" "$2" >/dev/null 2>&1
}

# verify_bundle KEY DATA BUNDLE: a Sigstore bundle v0.3 of DATA: digest, algorithm, key hint, signature.
verify_bundle() {
  local key=$1 data=$2 bundle=$3 media alg digest hint sig
  json "$bundle"
  IFS=$US read -r media alg digest hint sig < <(jq -r '[(.mediaType // "" | tostring),
      (.messageSignature.messageDigest.algorithm // "" | tostring), (.messageSignature.messageDigest.digest // "" | tostring),
      (.verificationMaterial.publicKey.hint | if . == null then "\u0001" else tostring end),
      (.messageSignature.signature // "" | tostring)] | join("\u001f")' "$bundle")
  case $media in
    application/vnd.dev.sigstore.bundle.v0.3+json | "application/vnd.dev.sigstore.bundle+json;version=0."[123]) ;;
    *) fail "$bundle: not a Sigstore bundle (mediaType $media)" ;;
  esac
  [[ $alg == SHA2_256 ]] || fail "$bundle: the message digest is not SHA2_256"
  [[ $digest == "$(openssl dgst -sha256 -binary "$data" | openssl base64 -A)" ]] ||
    fail "$bundle: the bundle of other bytes (its message digest is not $(basename "$data")'s sha256)"
  # absent: no hint; present, it must be the key's (an empty hint names no key: refused, as the toolkit refuses it)
  [[ $hint == $'\x01' || $hint == "$(hint_of "$key")" ]] || fail "$bundle: names another key (hint '$hint')"
  verify_sig "$key" "$data" "$sig" "$bundle"
}

# verify_signed KEY FILE: FILE.sig verifies, and FILE.sigstore.json holds when it is there.
verify_signed() {
  readable "$2"
  readable "$2.sig"
  verify_sig "$1" "$2" "$(cat "$2.sig")" "$2"
  if [[ -e $2.sigstore.json ]]; then verify_bundle "$1" "$2" "$2.sigstore.json"; fi
}

# canonical FILE: a JSON object in the one form the toolkit writes and reads signed records in (VERIFYING.md,
# Canonical JSON; trust/records.py: canonical_problem): every line one of `{`, `[`, `}`, `]`, or at most one key
# and one value (a scalar, `{`, `[`, `{}` or `[]`), with a comma after it or not; two spaces of indent a level;
# keys sorted; strings with no escape canonical JSON does not write; numbers as Python writes them (no `7.10`,
# `7e0`, `1E+5`, `-0`); a newline at the end. So no key is written twice (jq would keep the last): as many key
# lines as distinct keys. Prints its schema.
CANON_S='"([^"\\[:cntrl:]]|\\["\\nrtbf]|\\u00(0[0-7]|0b|0e|0f|1[0-9a-f]))*"'
CANON_N='(0|-?[1-9][0-9]*|-?0(?=\.))(\.([0-9]*[1-9]|0))?(e[-+][0-9]{2,})?'
canonical() {
  local lines keys schema bad
  readable "$1"
  IFS=$US read -r keys schema < <(jq -r 'if type == "object" then [([.. | objects | keys | length] | add // 0 | tostring),
      (.schema // "" | tostring)] | join("\u001f") else empty end' "$1" 2>/dev/null) || fail "$1: not a JSON object"
  bad=$(jq -R -s -r --arg s "$CANON_S" --arg n "$CANON_N" '
    ("^ *((" + $s + ": )?(" + $s + "|" + $n + "|true|false|null|\\[\\]|\\{\\}|\\[|\\{)|[\\]}]),?$") as $line
    | split("\n") as $l
    | if $l[-1] != "" then "it does not end with a newline"
      else (reduce ($l[:-1] | to_entries[]) as $x ({d: 0, bad: ""};
        if .bad != "" then .
        else ($x.value | test("^ *[\\]}]")) as $close | (if $close then .d - 1 else .d end) as $d
          | if ($x.value | test($line) | not) then .bad = "line \($x.key + 1) is not one key and one value: \($x.value[:80])"
            elif ($x.value | match("^ *").length) != 2 * $d then .bad = "line \($x.key + 1) is not indented two spaces a level"
            else .d = $d + (if ($x.value | test("[\\[{]$")) then 1 else 0 end) end end) | .bad) end' "$1")
  [[ -z $bad ]] || fail "$1: not in the canonical form signed records are written in: $bad"
  lines=$(jq -R -s '[split("\n")[] | select(test("^ *\"([^\"\\\\]|\\\\.)*\": "))] | length' "$1")
  [[ $lines == "$keys" ]] || fail "$1: $lines keys written, $keys distinct: a key is written twice"
  jq -e '[.. | objects | keys_unsorted == keys] | all' "$1" >/dev/null || fail "$1: not in the canonical form signed records are written in: its keys are not sorted"
  printf '%s' "$schema"
}

# The keys whose values are integers in the signed records (manifests/*.schema.json, "type": "integer"; the
# toolkit reads them as whole numbers and refuses 7.0): their numbers must be written without fraction or
# exponent. tests/test_verify_differential.py checks this list is the schemas' own.
INTEGER_KEYS='consecutive_passes|gpus|host_reserve_gib|hosts_sequence|kv_cache_gib|min_gpu_memory_gib|policy_version|promotion|required_consecutive_passes|runs|sequence|server_memory_gib|tensor_parallel_size|uid|version'
integers() {
  local bad
  bad=$(grep -nE "^ *\"($INTEGER_KEYS)\": -?[0-9][0-9.eE+-]*,?\$" "$1" | grep -vE "\": -?[0-9]+,?\$" | head -1 || true)
  [[ -z $bad ]] || fail "$1: line ${bad%%:*}: an integer written as a number with a fraction or an exponent (${bad#*: }): the toolkit refuses it"
}

# signed_record FILE SCHEMA...: a record signed with the release key, canonical, of one of the schemas.
signed_record() {
  local schema
  verify_signed "$KEY" "$1"
  schema=$(canonical "$1")
  integers "$1"
  [[ " ${*:2} " == *" $schema "* ]] || fail "$1: schema $schema, expected ${*:2}"
}

# --- jq functions shared by the steps ---------------------------------------------------------------------

# shellcheck disable=SC2016  # jq code: its $names are jq's
JQ_LIB='
def rank: {"unsupported": 0, "unverified": 1, "experimental": 2, "baseline": 3, "optimized": 4}[.] // 0;
def lower: {"optimized": "experimental", "baseline": "experimental", "experimental": "unverified"}[.] // .;
def utc: capture("^(?<d>[0-9]{4}-[0-9]{2}-[0-9]{2})[Tt](?<t>[0-9]{2}:[0-9]{2}:[0-9]{2})(\\.[0-9]{1,9})?(?<z>[Zz]|[+-][0-9]{2}:[0-9]{2})$")
  | ((.d + "T" + .t + "Z") | fromdateiso8601)
    - (if (.z | ascii_downcase) == "z" then 0
       else ((.z[1:3] | tonumber) * 3600 + (.z[4:6] | tonumber) * 60) * (if .z[0:1] == "+" then 1 else -1 end) end)
  | todate;
def text: if . == null then "" elif type == "string" then . else tostring end;
# the Blackwell support RFC by an allow-list over the required checks (release/evidence.py: outcome_of); input: the checks
def outcome($required; $seen; $capability):
  [.[] | objects | select((.id // "" | text) as $i | any($required[]; . == $i))] as $listed
  | if any($listed[]; .status == "fail") then "product-failure"
    elif any($required[]; . as $r | all($listed[]; (.id | text) != $r)) then "infrastructure"
    elif any($listed[]; .status != "pass") then "infrastructure"
    elif $seen != $capability then "infrastructure"
    else "pass" end;
# the rule over the runs in time order (release/promote.py: standing); input: [{identity, time, outcome}]; $lifts:
# identity -> true for a run whose GPU checks passed but whose serving evidence is missing (it lifts, no streak)
def standing($n; $intended; $released; $lifts):
  (($intended | rank) >= 3) as $can
  | sort_by(.time, .identity)
  | reduce .[] as $c ({level: $released, streak: 0};
      if $c.outcome == "pass" then
        .streak += 1
        | if .streak >= $n and $can and ((.level | rank) < 3) then .level = "baseline"
          elif (.level | rank) < 2 then .level = "experimental" else . end
      elif ($lifts[$c.identity] // false) and (.level | rank) < 2 then .level = "experimental"
      elif $c.outcome == "product-failure" then .level |= lower | .streak = 0
      else . end);
def standing($n; $intended; $released): standing($n; $intended; $released; {});
# a multi-GPU pass judged by the signed all-reduce floors (release/rows.py: by_floor): below the floor for its
# topology and GPU count, a product failure; no floor for it, or no bus bandwidth measured, infrastructure
def by_floor($floors; $configuration; $checks):
  if $configuration == "1 GPU" or . != "pass" then .
  else ($configuration | capture("^(?<g>[0-9]+) GPUs tp(?<tp>[0-9]+) (?<topo>.+)$")) as $c
    | ([$floors[] | select(.topology == $c.topo and .gpus <= ($c.tp | tonumber))] | max_by(.gpus)) as $f
    | ([$checks[] | objects | select(.id == "gpu.nccl-allreduce")][0] | (.evidence? | objects | .bandwidth? | objects
       | .busbw_gbs?) // null) as $bw
    | if $f == null or ($bw | type) != "number" then "infrastructure"
      elif $bw < $f.min_bus_gbps then "product-failure" else . end end;
# a run of the serving matrix (release/serving.py), from a serve-check record; input: the record
def serve_run:
  (.predicate // {}) as $p
  | {form: "serve", release: ($p.release | text), target: ($p.target | text), capability: ($p.capability | text),
     image_digest: ("sha256:" + (.subject[0].digest.sha256 | text)),
     image_ok: ($p.image != null and $p.image == "\(.subject[0].name)@sha256:\(.subject[0].digest.sha256)"),
     probe: ($p.toolkit.probe_sha256 | text), host_id_sha256: ($p.host.id_sha256 | text), gpu_capability: "none",
     run_id: ($p.run_id | text), time: ($p.created | utc), configuration: "1 GPU",
     link: ($p.gpu_evidence | if type == "object" then {run_id: (.run_id | text), time: (.time | utc),
            host_id_sha256: (.host_id_sha256 | text), gpu_uuid_sha256: (.gpu_uuid_sha256 | text),
            tensor_parallel_size: (.tensor_parallel_size // 0)} else null end),
     checks: [$p.checks[]? | objects], declared: ($p.outcome | text),
     required_listed: [$p.checks[]? | objects | select(.required == true) | .id | text]};
# the outcome of a serve-check run over $required (serving.outcome_of: none required is never a pass)
def serve_outcome($required):
  if ($required | length) == 0 then "infrastructure" else .checks | outcome($required; "none"; "none") end;
'

# ------------------------------------------------------------------------------------------------------

FOLDER="" PIN_KEY="" PIN_FP="" HOSTS="" HISTORY="" REGISTRY=0 FETCH="" CA="" AUTH_FILE=""
while (($#)); do
  case $1 in
    --key) PIN_KEY=${2:?--key PUB}; shift 2 ;;
    --fingerprint) PIN_FP=${2:?--fingerprint sha256:HEX}; shift 2 ;;
    --hosts) HOSTS=${2:?--hosts FILE}; shift 2 ;;
    --hosts-history) HISTORY=${2:?--hosts-history DIR}; shift 2 ;;
    --registry) REGISTRY=1; shift ;;
    --fetch) FETCH=${2:?--fetch skopeo|curl}; shift 2 ;;
    --ca) CA=${2:?--ca FILE}; shift 2 ;;
    --auth-file) AUTH_FILE=${2:?--auth-file FILE}; shift 2 ;;
    -h | --help) usage ;;
    -*) echo "verify-independent: unknown option $1" >&2; usage ;;
    *) [[ -z $FOLDER ]] || usage; FOLDER=$1; shift ;;
  esac
done
[[ -n $FOLDER ]] || usage
need openssl "signatures and digests"
need jq "JSON"
need sha256sum "file hashes"
[[ -d $FOLDER && ! -L $FOLDER ]] || { echo "verify-independent: $FOLDER: not a release folder" >&2; exit 2; }
FOLDER=${FOLDER%/}
TAG=$(basename "$FOLDER")
HOSTS=${HOSTS:-$(dirname "$FOLDER")/hosts.json}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# --- 1. the release key ----------------------------------------------------------------------------------
step 1 "the release key ($FOLDER/cosign.pub)"
KEY="$FOLDER/cosign.pub"
readable "$KEY"
openssl pkey -pubin -in "$KEY" -noout -text 2>/dev/null | grep -q 'ASN1 OID: prime256v1' ||
  fail "$KEY: not an ECDSA P-256 public key (PEM, SubjectPublicKeyInfo)"
FP="sha256:$(fingerprint_of "$KEY")"
HINT=$(hint_of "$KEY")
ok "fingerprint $FP (sha256 of the DER SubjectPublicKeyInfo); bundle key hint $HINT (the same digest, base64)"
if [[ -n $PIN_KEY ]]; then
  readable "$PIN_KEY"
  [[ "sha256:$(fingerprint_of "$PIN_KEY")" == "$FP" ]] || fail "$KEY is $FP, not the key you trust ($PIN_KEY)"
  ok "it is the key you trust ($PIN_KEY)"
elif [[ -n $PIN_FP ]]; then
  [[ $PIN_FP == "$FP" ]] || fail "$KEY is $FP, not the pinned $PIN_FP"
  ok "it is the pinned fingerprint"
else
  note "no --key or --fingerprint: the folder's own key is trusted (trust on first use; pin the announced fingerprint)"
fi

# --- 2. release.json ----------------------------------------------------------------------------------------
INDEX="$FOLDER/release.json"
step 2 "release.json: signature, bundle, tag, key, targets"
signed_record "$INDEX" "$NS/release/v3" "$NS/release/v2"
RSHA=$(sha "$INDEX")
# release/v3: promote never rewrites a manifest (one hash rule: release.json's); release/v2: it did (step 6)
REWRITES=$([[ $(j .schema "$INDEX") == "$NS/release/v2" ]] && echo 1 || echo 0)
[[ $(j .tag "$INDEX") == "$TAG" ]] || fail "$INDEX: the index of release $(j .tag "$INDEX"), but the folder is named $TAG"
jq -e --arg tag "$TAG" '
  ($tag | test("^v?(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)\\.(0|[1-9][0-9]*)(-((0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*)(\\.(0|[1-9][0-9]*|[0-9]*[A-Za-z-][0-9A-Za-z-]*))*))?$")) as $semver
  | .version == (if $semver then ($tag | ltrimstr("v")) else null end)' "$INDEX" >/dev/null ||
  fail "$INDEX: version $(j .version "$INDEX") is not what tag $TAG says"
jq -e --arg fp "$FP" --arg hint "$HINT" '.public_key == {"file": "cosign.pub", "fingerprint": $fp, "hint": $hint}' \
  "$INDEX" >/dev/null || fail "$INDEX: names release key $(j .public_key.fingerprint "$INDEX"), not the folder's $FP"
[[ $(j '.files["cosign.pub"] // ""' "$INDEX") == "$(sha "$KEY")" ]] || fail "$INDEX: files[cosign.pub] is not cosign.pub's sha256"
jq -e '(.sequence | type == "number" and . >= 1) and (.time | test("^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"))
       and (.allow_partial == (.withheld | length > 0)) and ([.targets[].target] | length == (unique | length))' \
  "$INDEX" >/dev/null || fail "$INDEX: sequence, time, allow_partial or the target list is not as a release writes it"
mapfile -t TARGETS < <(j '.targets[].target' "$INDEX")
for t in "${TARGETS[@]}"; do [[ $t =~ $TARGET_RE ]] || fail "$INDEX: target $t is not a target name"; done
RTIME=$(j .time "$INDEX")
ok "release $TAG, sequence $(j .sequence "$INDEX"), time $RTIME, sha256 $RSHA; targets: ${TARGETS[*]:-none}"

# --- 3. the policy section ------------------------------------------------------------------------------------
step 3 "release.json's policy (the promotion rule promote applies)"
if jq -e 'has("policy")' "$INDEX" >/dev/null; then
  jq -e '.policy.version == 1' "$INDEX" >/dev/null || fail "$INDEX: policy version $(j .policy.version "$INDEX"): this recipe knows version 1"
  jq -e '([.policy.targets[].target] | sort) == ([.targets[].target] | sort)
         and (.policy.targets | map(.intended_level | IN("baseline", "optimized", "experimental")) | all)
         and (.policy.promotion.consecutive_passes | type == "number" and . >= 1)
         and (.policy.promotion.required_gpu_checks | length > 0 and length == (unique | length))' "$INDEX" >/dev/null ||
    fail "$INDEX: the policy does not name each released target once, or its pass count or checks are not usable"
  # issue 39's serving checks per level, issue 44's all-reduce floors: applied in step 7; a check or topology this
  # recipe does not know is refused, as the toolkit refuses a rule it does not apply
  jq -e --argjson serve "$SERVE_CHECKS" '(.policy.level_checks | type == "array")
         and all(.policy.level_checks[]; (.level | IN("baseline", "optimized", "experimental"))
             and (.checks | type == "array" and length == (unique | length)) and all(.checks[]; IN($serve[])))
         and ([.policy.level_checks[].level] | length == (unique | length))' "$INDEX" >/dev/null ||
    fail "$INDEX: policy.level_checks: each level once, of baseline, optimized, experimental, naming distinct checks of $(jq -r 'join(", ")' <<<"$SERVE_CHECKS") (a check this recipe does not judge is refused)"
  jq -e '(.policy.allreduce_floors | type == "array")
         and all(.policy.allreduce_floors[]; (.topology | IN("nvlink", "pcie-switch", "host-bridge", "cross-socket"))
             and (.gpus | type == "number" and . >= 2 and . == floor)
             and (.min_bus_gbps | type == "number" and . > 0))
         and ([.policy.allreduce_floors[] | [.topology, .gpus]] | length == (unique | length))' "$INDEX" >/dev/null ||
    fail "$INDEX: policy.allreduce_floors: each a topology of nvlink, pcie-switch, host-bridge, cross-socket, gpus >= 2 and min_bus_gbps > 0, one per topology and GPU count"
  # issue 51's PTX JIT table (a deploy rule, not a promotion rule): well formed where it is there
  jq -e '(has("policy") | not) or (.policy | has("ptx_jit") | not)
         or ((.policy.ptx_jit | type == "array" and length > 0)
             and all(.policy.ptx_jit[]; (.isa | test("^[0-9]{1,3}\\.[0-9]{1,3}$")) and (.cuda | test("^[0-9]{1,2}\\.[0-9]{1,2}$"))
                 and (.driver | test("^[0-9]{3,4}(\\.[0-9]{1,3}){0,2}$")))
             and ([.policy.ptx_jit[].isa] | length == (unique | length)))' "$INDEX" >/dev/null ||
    fail "$INDEX: policy.ptx_jit: each row an isa (once), a cuda and a driver version"
  # issue 52's deploy facts (what start.sh matches the host to and checks its driver and memory by, instead of a
  # targets file): each released target once, besides them only cpu targets; a GPU target with a CUDA and a floor
  jq -e '(.policy | has("deploy") | not)
         or ((.policy.deploy | keys) == ["drivers", "targets"]
             and ([.policy.deploy.targets[].target] | length == (unique | length))
             and ([.targets[].target] - [.policy.deploy.targets[].target] | length == 0)
             and ([.targets[].target] as $r | all(.policy.deploy.targets[]; IN(.target; $r[]) or .accelerator == "cpu"))
             and all(.policy.deploy.targets[]; (.platform | IN("linux/amd64", "linux/arm64"))
                 and (.runtime.gpu_memory_utilization | type == "number" and . > 0 and . < 1)
                 and (.user.uid | type == "number" and . >= 0)
                 and (if .accelerator == "cpu" then .capability == "cpu" and .cuda == "" and .driver_floor == ""
                      else .accelerator == "cuda" and (.capability | test("^[0-9]{1,2}\\.[0-9]{1,2}$"))
                           and (.cuda | test("^[0-9]{1,2}\\.[0-9]{1,2}$"))
                           and (.driver_floor | test("^[0-9]{3,4}(\\.[0-9]{1,3}){0,2}$")) end))
             and ([.policy.deploy.drivers[].cuda] | length == (unique | length)))' "$INDEX" >/dev/null ||
    fail "$INDEX: policy.deploy: each released target once (others only cpu targets), each GPU target a capability, CUDA and driver floor, a fraction between 0 and 1, each CUDA once in drivers"
  if jq -e '.policy | has("deploy")' "$INDEX" >/dev/null; then
    ok "deploy facts (start.sh's targets): $(j '[.policy.deploy.targets[] | "\(.target) \(.capability) \(.platform)"] | join("; ")' "$INDEX")"
  fi
  POLICY_VERSION=1
  ok "version 1: $(j .policy.promotion.consecutive_passes "$INDEX") consecutive passes of $(j '.policy.promotion.required_gpu_checks | join(", ")' "$INDEX")"
  if jq -e '.policy.level_checks | length > 0' "$INDEX" >/dev/null; then
    ok "serving checks (for a serving image: the cpu target or a vllm profile): $(j '[.policy.level_checks[] | "\(.level): \(.checks | join(", "))"] | join("; ")' "$INDEX")"
  else
    note "no serving checks (level_checks empty): GPU evidence alone counts; the cpu target cannot be promoted"
  fi
  if jq -e '.policy.allreduce_floors | length > 0' "$INDEX" >/dev/null; then
    ok "all-reduce floors (multi-GPU runs): $(j '[.policy.allreduce_floors[] | "\(.topology) from \(.gpus) GPUs \(.min_bus_gbps) GB/s"] | join("; ")' "$INDEX")"
  else
    note "no all-reduce floors: a multi-GPU run's pass cannot be judged and counts as infrastructure (as promote counts it)"
  fi
else
  POLICY_VERSION=0
  note "no policy (signed before it existed): the implied rule, $IMPLIED_PASSES passes of $IMPLIED_CHECKS, the manifest's intended level"
fi
# rule_of TARGET: {n, required, intended, floors, serves, serving, alone, lift_needs_serving} as JSON. serving: the
# serve-check checks a run of a serving image (the cpu target, a vllm profile) needs (release/servecount.py: rule_for,
# baseline's and experimental's); alone: the cpu target, whose serve-check records are runs of their own.
rule_of() {
  jq -c --arg t "$1" --argjson checks "$IMPLIED_CHECKS" --argjson n "$IMPLIED_PASSES" --argjson all "$SERVE_CHECKS" \
    --slurpfile m "$FOLDER/$1.json" '
    ($m[0].predicate.target | (.capability == "cpu") as $cpu | {cpu: $cpu, serves: ($cpu or .profile == "vllm")}) as $img
    | if has("policy") then
        ([.policy.level_checks[] | select(.level == "baseline") | .checks[]]) as $base
        | ([.policy.level_checks[] | select(.level == "experimental") | .checks[]]) as $lift
        | (if $img.serves then ($base + $lift | reduce .[] as $c ([]; if index([$c]) then . else . + [$c] end)) else [] end) as $serving
        | {n: .policy.promotion.consecutive_passes, required: .policy.promotion.required_gpu_checks,
           intended: (.policy.targets[] | select(.target == $t) | .intended_level), floors: .policy.allreduce_floors,
           serves: $img.serves, serving: $serving, alone: ($img.cpu and ($serving | length > 0)),
           lift_needs_serving: ($img.serves and ($lift | length > 0))}
      else {n: $n, required: $checks, intended: ($m[0].predicate.target.intended_support_level
            | if IN("baseline", "optimized", "experimental") then . else "experimental" end), floors: [],
            serves: $img.serves, serving: (if $img.cpu then $all else [] end), alone: $img.cpu,
            lift_needs_serving: false} end' "$INDEX"
}

# --- 4. the enrolled hosts chain ----------------------------------------------------------------------------
step 4 "the enrolled hosts ($HOSTS): signature, chain, the version each promotion was checked against"
mkdir -p "$WORK/hosts"
# Every version at hand, by sha256: the file, --hosts-history DIR, and what git's history holds of it.
keep_version() {  # keep_version FILE SIGFILE [BUNDLE]
  local s
  [[ -f $1 && -f $2 ]] || return 0
  s=$(sha "$1")
  cp "$1" "$WORK/hosts/$s.json"
  cp "$2" "$WORK/hosts/$s.json.sig"
  if [[ -n ${3:-} && -f $3 ]]; then cp "$3" "$WORK/hosts/$s.json.sigstore.json"; fi
}
HOSTS_SHA="" HOSTS_SEQ=0 HOSTS_STOP="" HOSTS_STOP_AT=0
declare -A CHAIN_AT=()
if [[ -e $HOSTS || -L $HOSTS ]]; then
  signed_record "$HOSTS" "$NS/enrolled-hosts/v2" "$NS/enrolled-hosts/v1"
  HOSTS_SHA=$(sha "$HOSTS")
  HOSTS_SEQ=$(j .sequence "$HOSTS")
  keep_version "$HOSTS" "$HOSTS.sig" "$HOSTS.sigstore.json"
  for f in "$(dirname "$HOSTS")"/"$(basename "$HOSTS" .json)".[0-9]*.json; do
    if [[ $f =~ \.[0-9]+\.json$ ]]; then keep_version "$f" "$f.sig" "$f.sigstore.json"; fi
  done
  if [[ -n $HISTORY ]]; then
    for f in "$HISTORY"/*; do [[ $f == *.sig || $f == *.sigstore.json ]] || keep_version "$f" "$f.sig" "$f.sigstore.json"; done
  fi
  hdir=$(dirname "$HOSTS") hname=$(basename "$HOSTS")
  if command -v git >/dev/null 2>&1 && git -C "$hdir" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    while read -r rev; do
      git -C "$hdir" show "$rev:./$hname" >"$WORK/h.json" 2>/dev/null || continue
      git -C "$hdir" show "$rev:./$hname.sig" >"$WORK/h.json.sig" 2>/dev/null || continue
      git -C "$hdir" show "$rev:./$hname.sigstore.json" >"$WORK/h.json.sigstore.json" 2>/dev/null || rm -f "$WORK/h.json.sigstore.json"
      keep_version "$WORK/h.json" "$WORK/h.json.sig" "$WORK/h.json.sigstore.json"
    done < <(git -C "$hdir" log --format=%H -- "$hname" 2>/dev/null)
  fi
  # the chain back from the current file, as far as versions are at hand: CHAIN_AT[sequence] is the sha256 of
  # the version at that sequence on it (the lowest one only named by its successor); HOSTS_STOP says why it ends
  # (first: a version naming no predecessor; gap: a predecessor not at hand), step 8 holds each promotion to it
  CHAIN_AT[$HOSTS_SEQ]=$HOSTS_SHA
  cur="$HOSTS" seq=$HOSTS_SEQ
  while :; do
    prev=$(j '.previous_sha256 // empty' "$cur")
    if [[ -z $prev ]]; then
      HOSTS_STOP=first HOSTS_STOP_AT=$seq
      ok "sequence $seq is the first of its chain"
      break
    fi
    [[ $prev =~ $HEX_RE ]] || fail "$cur: previous_sha256 is not a sha256"
    CHAIN_AT[$((seq - 1))]=$prev
    if [[ ! -f $WORK/hosts/$prev.json ]]; then
      HOSTS_STOP=gap HOSTS_STOP_AT=$seq
      note "sequence $seq names sequence $((seq - 1)) (sha256 ${prev:0:12}...), which is not at hand (commit hosts.json, or --hosts-history DIR): the chain is checked from there on"
      break
    fi
    signed_record "$WORK/hosts/$prev.json" "$NS/enrolled-hosts/v2" "$NS/enrolled-hosts/v1"
    [[ $(j .sequence "$WORK/hosts/$prev.json") == $((seq - 1)) ]] ||
      fail "$cur: names a predecessor whose sequence is $(j .sequence "$WORK/hosts/$prev.json"), not $((seq - 1))"
    ok "sequence $seq names sequence $((seq - 1)) (sha256 ${prev:0:12}...), which verifies"
    cur="$WORK/hosts/$prev.json" seq=$((seq - 1))
  done
  jq -e '[.hosts[].name] | length == (unique | length)' "$HOSTS" >/dev/null || fail "$HOSTS: a host name is enrolled twice"
  ok "sequence $HOSTS_SEQ, sha256 $HOSTS_SHA: $(j '[.hosts[].name] | join(", ")' "$HOSTS")"
else
  note "no enrolled-hosts file: only promotions without evidence checks against one can verify"
fi
# host_version SHA SEQUENCE: the path of that hosts version, verified; "" when not at hand
host_version() {
  local f="$WORK/hosts/$1.json"
  [[ -f $f ]] || { echo ""; return 0; }
  signed_record "$f" "$NS/enrolled-hosts/v2" "$NS/enrolled-hosts/v1" >/dev/null
  [[ $2 == 0 || $(j .sequence "$f") == "$2" ]] || fail "hosts.json sha256 ${1:0:12}... is sequence $(j .sequence "$f"), not $2"
  echo "$f"
}

# host_key HOSTS_VERSION_FILE HOSTS_SHA NAME: the path of NAME's enrolled key (its fingerprint checked), or ""
# when NAME enrolled keylessly
host_key() {
  local hk="$WORK/hosts/$2.$3.pub" kind pem_fp
  if [[ ! -f $hk ]]; then
    IFS=$US read -r kind pem_fp < <(jq -r --arg h "$3" '[.hosts[] | select(.name == $h)][0] // {} |
        [(if .key then "key" elif .keyless then "keyless" else "" end), (.key.fingerprint // "")] | join("\u001f")' "$1")
    [[ $kind == key ]] || { echo ""; return 0; }
    jq -r --arg h "$3" '.hosts[] | select(.name == $h) | .key.pem' "$1" >"$hk"
    [[ "sha256:$(fingerprint_of "$hk")" == "$pem_fp" ]] || fail "$1: $3's key is not its fingerprint"
  fi
  echo "$hk"
}

# serve_signed FILE RECORD HOSTS_SHA HOSTS_SEQ UNSIGNED_OK HOST: a serve-check record a GPU run counted with is signed
# by the host that signed the GPU run (HOST: a record from another host never completes a GPU run; the GPU host signs
# its own matrix), with its key in the hosts version the record was checked against; unsigned only where the record
# says that was allowed.
serve_signed() {
  local f=$1 r=$2 name=$6 sig="" hv hk
  if [[ -e $f.sig ]]; then sig=$(cat "$f.sig")
  elif [[ -e $f.sigstore.json ]]; then json "$f.sigstore.json"; sig=$(j '.messageSignature.signature // ""' "$f.sigstore.json")
  fi
  if [[ $name == unsigned ]]; then
    [[ $5 == true ]] || fail "$f: the serve-check record of an unsigned run, and $(basename "$r") does not say unsigned evidence was allowed"
    note "$(basename "$f"): the serve-check record of an unsigned run, counted with --allow-unsigned-evidence (the record says so)"
    return 0
  fi
  if [[ -z $sig ]]; then
    [[ $5 == true ]] || fail "$f: a serve-check record counted in $(basename "$r") with no .sig or .sigstore.json beside it, and the record does not say unsigned evidence was allowed"
    note "$(basename "$f"): an unsigned serve-check record, counted with --allow-unsigned-evidence (the record says so)"
    return 0
  fi
  [[ -n $3 ]] || fail "$r: names host $name, but no enrolled-hosts file"
  hv=$(host_version "$3" "$4")
  if [[ -z $hv ]]; then
    incomplete "$(basename "$f") (serve-check record): its signer is enrolled in hosts.json sha256 ${3:0:12}..., which is not at hand (commit hosts.json, or --hosts-history DIR)"
    return 0
  fi
  jq -e --arg h "$name" 'any(.hosts[]; .name == $h)' "$hv" >/dev/null ||
    fail "$r: counts a run from $name, who is not enrolled in the hosts version it was checked against"
  hk=$(host_key "$hv" "$3" "$name")
  if [[ -z $hk ]]; then
    incomplete "$(basename "$f") (serve-check record): $name is enrolled keylessly: needs cosign verify-blob"
    return 0
  fi
  if [[ -e $f.sig ]]; then verify_sig "$hk" "$f" "$(cat "$f.sig")" "$f (serve-check record, not signed by $name, the host of the GPU run it completes)"; fi
  if [[ -e $f.sigstore.json ]]; then verify_bundle "$hk" "$f" "$f.sigstore.json"; fi
  ok "serve-check record $(basename "$f"): signed by $name, the host of the GPU run it completes"
}

# --- 5 to 8, per target --------------------------------------------------------------------------------------
declare -A CURRENT_SEQ CURRENT_MANIFEST_SHA CURRENT_LEVEL SUPERSEDED
for t in "${TARGETS[@]}"; do
  ENTRY=$(jq -c --arg t "$t" '.targets[] | select(.target == $t)' "$INDEX")
  DIGEST=$(jq -r .image.digest <<<"$ENTRY")
  P="$FOLDER/$t.promotion.json"

  # --- 5. the promotion ledger ---------------------------------------------------------------------------
  step 5 "$t: the promotion ledger ($t.promotion.json and the kept $t.promotion.<n>.json)"
  mapfile -t KEPT < <(cd "$FOLDER" && for f in "$t".promotion.*.json; do
    [[ $f =~ ^$t\.promotion\.([1-9][0-9]{0,8})\.json$ ]] && echo "${BASH_REMATCH[1]}"; done | sort -n)
  declare -A VISITED=()
  CHAIN=()  # record files, newest first
  if [[ -e $P || -L $P ]]; then
    signed_record "$P" "$NS/promotion/v3" "$NS/promotion/v2"
    jq -e --arg tag "$TAG" --arg r "$RSHA" --arg t "$t" '.release == $tag and .release_sha256 == $r and .target == $t' \
      "$P" >/dev/null || fail "$P: a promotion of $(j .target "$P") in release $(j .release "$P") (release.json $(j .release_sha256 "$P" | cut -c1-12)...), not of $t in this release"
    CHAIN=("$P")
    cur=$P
    while [[ $(j .schema "$cur") == "$NS/promotion/v3" ]] && (($(j .sequence "$cur") > 1)); do
      n=$(($(j .sequence "$cur") - 1))
      k="$FOLDER/$t.promotion.$n.json"
      [[ -e $k ]] || fail "$cur: the ledger is cut: $t.promotion.$n.json, the record promotion $((n + 1)) replaced, is missing"
      signed_record "$k" "$NS/promotion/v3" "$NS/promotion/v2"
      [[ $(sha "$k") == "$(j .previous_sha256 "$cur")" ]] ||
        fail "$k: not the promotion $n that promotion $((n + 1)) names (sha256 $(sha "$k" | cut -c1-12)..., it names $(j .previous_sha256 "$cur" | cut -c1-12)...): the ledger was rewritten"
      jq -e --arg tag "$TAG" --arg r "$RSHA" --arg t "$t" --argjson n "$n" \
        '.release == $tag and .release_sha256 == $r and .target == $t and .sequence == $n' "$k" >/dev/null ||
        fail "$k: its sequence, release or target is not promotion $n of $t in this release"
      VISITED[$n]=1
      CHAIN+=("$k")
      cur=$k
    done
    if [[ $(j .schema "$cur") == "$NS/promotion/v3" ]]; then
      [[ $(j .previous_sha256 "$cur") == null ]] || fail "$cur: promotion 1 names a predecessor"
      ok "promotion $(j .sequence "$P") and every record before it, back to promotion 1, each named by its successor"
    else
      note "the ledger starts at $(basename "$cur") (promotion/v2, sequence $(j .sequence "$cur")): the records before it were overwritten by the toolkit of that time"
    fi
    for n in "${KEPT[@]}"; do
      [[ -n ${VISITED[$n]:-} ]] || fail "$FOLDER/$t.promotion.$n.json is kept as a replaced record, but the ledger from promotion $(j .sequence "$P") does not lead to it (old files copied back over a demotion?)"
    done
    CURRENT_SEQ[$t]=$(j .sequence "$P")
    CURRENT_LEVEL[$t]=$(j .level "$P")
    if ((REWRITES)); then  # release/v2: the promote rewrote the manifest, and the current record names it
      EXPECTED=$(j .manifest_sha256 "$P")
      SUPERSEDED[$t]=1
    else
      EXPECTED=$(jq -r .manifest_sha256 <<<"$ENTRY")
      [[ $(j .manifest_sha256 "$P") == "$EXPECTED" ]] ||
        fail "$P: names manifest $(j .manifest_sha256 "$P" | cut -c1-12)..., not the released one release.json names ($(cut -c1-12 <<<"$EXPECTED")...): from release/v3 a promote never rewrites the manifest"
    fi
  else
    ((${#KEPT[@]} == 0)) || fail "$P is missing, but ${#KEPT[@]} replaced promotion record(s) of $t are kept: the current record was removed"
    CURRENT_SEQ[$t]=0
    CURRENT_LEVEL[$t]=$(jq -r .support_level <<<"$ENTRY")
    EXPECTED=$(jq -r .manifest_sha256 <<<"$ENTRY")
    ok "not promoted: release.json's manifest_sha256 counts"
  fi

  # --- 6. the manifest, and which hash counts ---------------------------------------------------------------
  M="$FOLDER/$t.json"
  BY=$([[ -n ${SUPERSEDED[$t]:-} ]] && echo "the promotion record" || echo "release.json")
  step 6 "$t: the manifest $t.json (the sha256 that counts: $BY's)"
  [[ $(sha "$M") == "$EXPECTED" ]] ||
    fail "$M: sha256 $(sha "$M" | cut -c1-12)..., but $BY names $(cut -c1-12 <<<"$EXPECTED")... (a manifest of another release or an older promotion$( ((REWRITES)) || echo ", or one rewritten after release: from release/v3 the level is the promotion record's"))"
  verify_signed "$KEY" "$M"
  canonical "$M" >/dev/null
  jq -e --arg st "$STATEMENT" --arg pt "$QUALIFICATION" --argjson e "$ENTRY" '
    ._type == $st and .predicateType == $pt and (.subject | length == 1)
    and ("sha256:" + .subject[0].digest.sha256) == $e.image.digest
    and ((.predicate.image.digest // $e.image.digest) == $e.image.digest)
    and .predicate.target.name == $e.target and .predicate.target.capability == $e.capability
    and .predicate.target.platform == $e.platform' "$M" >/dev/null ||
    fail "$M: does not describe what release.json names ($t, $DIGEST, capability $(jq -r .capability <<<"$ENTRY"), $(jq -r .platform <<<"$ENTRY"))"
  LEVEL=$(j .predicate.support_level "$M")
  if [[ -n ${SUPERSEDED[$t]:-} ]]; then
    [[ $LEVEL == "$(j .level "$P")" ]] || fail "$M: says level $LEVEL, its promotion record $(j .level "$P")"
  else
    [[ $LEVEL == "$(jq -r .support_level <<<"$ENTRY")" ]] || fail "$M: says level $LEVEL, release.json $(jq -r .support_level <<<"$ENTRY")"
  fi
  CURRENT_MANIFEST_SHA[$t]=$EXPECTED
  ok "sha256 $EXPECTED, signed; $DIGEST; level ${CURRENT_LEVEL[$t]}$([[ -e $P ]] && echo " (promotion $(j .sequence "$P"))")"

  ((${#CHAIN[@]})) || continue
  # --- 7. the evidence each record accepted --------------------------------------------------------------
  step 7 "$t: the evidence the promotion records accepted (file, identity, binding, outcome, host signature)"
  RULE=$(rule_of "$t")
  PROBE=$(j '.predicate.toolkit.probe_sha256 // ""' "$M")
  CAP=$(jq -r .capability <<<"$ENTRY")
  [[ ! -L $FOLDER/evidence && ! -L $FOLDER/evidence/$t ]] || fail "$FOLDER/evidence: a symbolic link"
  declare -A FIRST=()  # evidence sha256 -> the record that first accepted it (records oldest first)
  declare -A SERVED=()  # serve-check records whose signature was checked
  : >"$WORK/lifts.$t"
  for ((i = ${#CHAIN[@]} - 1; i >= 0; i--)); do
    R=${CHAIN[$i]}
    V2=$([[ $(j .schema "$R") == "$NS/promotion/v2" ]] && echo 1 || echo 0)
    IFS=$US read -r hsha hseq unsigned_ok count < <(jq -r '[(.hosts_sha256 // ""), (.hosts_sequence // 0 | tostring),
        (.unsigned_evidence_allowed | tostring), (.evidence | length | tostring)] | join("\u001f")' "$R")
    jq -e '[.evidence[].identity] | length == (unique | length)' "$R" >/dev/null || fail "$R: the same run is counted twice"
    twice=$(jq -r '[.evidence[] | .serving_sha256 // empty] | group_by(.) | map(select(length > 1) | .[0]) | .[0] // ""' "$R")
    [[ -z $twice ]] || fail "$R: serve-check record $twice completes $(jq -r --arg s "$twice" '[.evidence[] | select(.serving_sha256 == $s)] | length' "$R") GPU runs: one serving test completes one run, once"
    extra=$(jq -r '[.evidence[] | keys[] | select(IN("sha256", "identity", "file", "time", "outcome", "reason", "gpu",
        "driver", "host", "figures", "configuration", "serving_sha256") | not)] | unique | join(", ")' "$R")
    [[ -z $extra ]] || fail "$R: its evidence entries hold keys this recipe does not know: $extra"
    while IFS=$US read -r s file ident etime eout host econf ssha; do
      [[ $s =~ $HEX_RE && $file == "evidence/$t/$s.json" ]] || fail "$R: evidence file $file is not evidence/$t/<sha256>.json"
      E="$FOLDER/$file"
      [[ $(sha "$E") == "$s" ]] || fail "$E: not the evidence the signed record accepted (sha256 differs)"
      # The run's fields, from either form: start.sh's record or a probe manifest (qualify gpu-evidence).
      RUN=$(jq -c --arg serve "$SERVE_TYPE" "$JQ_LIB"'
        if type != "object" then error("not an object")
        elif ._type == "https://in-toto.io/Statement/v1" and .predicateType == $serve then serve_run
        elif ._type == "https://in-toto.io/Statement/v1" and .predicateType != "https://blackwell-qualify.dev/qualification/v1"
          then {form: (.predicateType | text)}
        elif ._type == "https://in-toto.io/Statement/v1" then
          ([.predicate.gpu.devices[]? | objects][0] // {}) as $d
          | {form: "statement", release: "", target: .predicate.target.name, capability: .predicate.target.capability,
             image_digest: ("sha256:" + .subject[0].digest.sha256), probe: (.predicate.toolkit.probe_sha256 // ""),
             uuid_text: ($d.uuid | text | sub("^\\s+"; "") | sub("\\s+$"; "")),
             host_text: (.predicate.host.hostname | text | sub("^\\s+"; "") | sub("\\s+$"; "")),
             gpu_capability: (if ($d.compute_cap | text) == "" then "none" else ($d.compute_cap | text) end),
             run_id: (.predicate.run_id | if type == "string" then . else "" end),
             time: (.predicate.created | utc),
             configuration: (.predicate.gpu.tensor_parallel_size as $tp | .predicate.gpu.topology.kind? as $k
               | if ($tp | type) == "number" and $tp >= 2 and $tp == ($tp | floor)
                 then "\($tp) GPUs tp\($tp) \(if ($k | IN("nvlink", "pcie-switch", "host-bridge", "cross-socket")) then $k else "unknown" end)"
                 else "1 GPU" end),
             checks: [.predicate.checks[]? | objects | select(.id | text | startswith("gpu."))]}
        elif .schema == "https://blackwell-qualify.dev/gpu-evidence/v1" then
          {form: "record", release: .release, target: .target, capability: .capability, image_digest: .image_digest,
           probe: .probe_sources_digest, uuid_sha256: .gpu.uuid_sha256, host_id_sha256: .host_id_sha256,
           gpu_capability: .gpu.capability, run_id: (.run_id // ""), time: (.time | utc), checks: .checks,
           configuration: (.configuration // {} | if (.tensor_parallel_size // 1) > 1
             then "\(.gpus) GPUs tp\(.tensor_parallel_size) \(.topology)" else "1 GPU" end)}
        else error("not GPU evidence") end' "$E" 2>/dev/null) || fail "$E: neither a gpu-evidence/v1 record nor a probe manifest"
      if [[ $RUN != '{"form":"statement"'* && $RUN != '{"form":"record"'* && $RUN != '{"form":"serve"'* ]]; then
        incomplete "$E: a Statement of type $(jq -r .form <<<"$RUN"), which this recipe does not verify"
        continue
      fi
      if [[ $RUN == '{"form":"serve"'* ]]; then  # the cpu target: a serve-check record is a run of its own
        jq -e '.alone' <<<"$RULE" >/dev/null ||
          fail "$R: counts serve-check record $file as a run, but $t's rule ($(jq -r 'if .serves then "serving checks \(.serving | join(", "))" else "no serving checks: the image does not serve" end' <<<"$RULE")) counts them only beside GPU evidence"
        [[ -z $ssha || $ssha == "$s" ]] || fail "$R: the serve-check run $s names another serve-check record ($ssha)"
      fi
      if [[ $RUN == *'"form":"statement"'* ]]; then  # the probe hashed nothing: the GPU UUID and host name, hashed here
        IFS=$US read -r uuid_text host_text < <(jq -j '[.uuid_text, .host_text] | join("\u001f")' <<<"$RUN"; echo)
        RUN=$(jq -c --arg u "sha256:$(printf '%s' "$uuid_text" | sha256sum | cut -d' ' -f1)" \
          --arg h "sha256:$(printf '%s' "$host_text" | sha256sum | cut -d' ' -f1)" '. + {uuid_sha256: $u, host_id_sha256: $h}' <<<"$RUN")
      fi
      # identity: the sha256 of canonical JSON (sorted keys, two-space indent, a newline) of the run's fields
      if [[ $RUN == '{"form":"serve"'* ]]; then  # release/serving.py: identity
        got=$(jq -S --indent 2 '{kind: "serve-check", image_digest, probe_sources_digest: .probe, host_id_sha256, run_id,
            time}' <<<"$RUN" | sha256sum | cut -d' ' -f1)
      elif ((V2)); then
        got=$(jq -S --indent 2 --arg host "$host" '{gpu_uuid_sha256: .uuid_sha256, image_digest, probe_sources_digest: .probe,
            host: (if $host == "unsigned" then "unsigned:" + .host_id_sha256 else $host end), run_id, time}' <<<"$RUN" |
          sha256sum | cut -d' ' -f1)
      else
        got=$(jq -S --indent 2 '{gpu_uuid_sha256: .uuid_sha256, host_id_sha256, image_digest, probe_sources_digest: .probe,
            run_id, time}' <<<"$RUN" | sha256sum | cut -d' ' -f1)
      fi
      [[ $got == "$ident" ]] || fail "$E: its identity is $got, the record $(basename "$R") says $ident"
      # The serve-check record this GPU run counted with (issue 39): its file, bytes and binding; signature below.
      SERVE=null
      if [[ -n $ssha && $RUN != '{"form":"serve"'* ]]; then
        if jq -e '.serving | length == 0' <<<"$RULE" >/dev/null; then
          note "$s: names serve-check record $ssha, which $t's rule does not count ($(jq -r 'if .serves then "no serving checks signed" else "the image does not serve" end' <<<"$RULE")): not read"
        else
          [[ $ssha =~ $HEX_RE ]] || fail "$R: serving_sha256 $ssha is not a sha256"
          S="$FOLDER/evidence/$t/$ssha.json"
          [[ $(sha "$S") == "$ssha" ]] || fail "$S: not the serve-check record the signed record counted (sha256 differs)"
          SERVE=$(jq -c --arg serve "$SERVE_TYPE" "$JQ_LIB"'if type == "object" and ._type == "https://in-toto.io/Statement/v1"
              and .predicateType == $serve then serve_run else error("not a serve-check record") end' "$S" 2>/dev/null) ||
            fail "$S: not a serve-check record ($SERVE_TYPE)"
          sproblem=$(jq -r --arg tag "$TAG" --arg t "$t" --arg d "$DIGEST" --arg cap "$CAP" --arg probe "$PROBE" \
            --arg rt "$RTIME" --argjson run "$RUN" "$JQ_LIB"'
            if (.release != "" and .release != $tag) or .target != $t or .image_digest != $d or .capability != $cap
              then "it is about \(.release) \(.target) \(.image_digest) (\(.capability)), not \($tag) \($t) \($d) (\($cap))"
            elif (.image_ok | not) then "its predicate.image is not its subject (or names no image)"
            elif $probe != "" and .probe != $probe then "it comes from probe \(.probe), the release'"'"'s is \($probe)"
            elif (.time | fromdateiso8601) < ($rt | fromdateiso8601) then "it is dated \(.time), before the release (\($rt))"
            elif (.checks | map(.id | text) | length != (unique | length)) then "a check is listed twice"
            elif .declared != serve_outcome(.required_listed) then "it declares \(.declared), its checks give \(serve_outcome(.required_listed))"
            elif .link == null or .link.run_id != $run.run_id or .link.host_id_sha256 != $run.host_id_sha256
                 or .link.time != $run.time then "it was not made against the deployment of this GPU run (gpu_evidence: run id, host, time)"
            elif .link.tensor_parallel_size == 0 and $run.configuration != "1 GPU"
              then "it names no GPU or tensor-parallel size (written before they were recorded): it completes a 1-GPU run only, not one on \($run.configuration)"
            elif .link.tensor_parallel_size != 0 and (.link.gpu_uuid_sha256 != $run.uuid_sha256
                 or .link.tensor_parallel_size != ($run.configuration | if . == "1 GPU" then 1 else capture("tp(?<tp>[0-9]+)").tp | tonumber end))
              then "it was made against another GPU run of this deployment (GPU \(.link.gpu_uuid_sha256), tensor parallel \(.link.tensor_parallel_size)), not this one (GPU \($run.uuid_sha256), \($run.configuration))"
            else "" end' <<<"$SERVE")
          [[ -z $sproblem ]] || fail "$S (serving_sha256 of $s in $(basename "$R")): $sproblem"
        fi
      fi
      verdict=$(jq -c --arg tag "$TAG" --arg t "$t" --arg d "$DIGEST" --arg cap "$CAP" --arg probe "$PROBE" \
        --arg rt "$RTIME" --arg etime "$etime" --arg eout "$eout" --arg econf "$econf" --argjson rule "$RULE" \
        --argjson serve "$SERVE" "$JQ_LIB"'
        . as $run
        | ($rule.required + (if .configuration != "1 GPU" and ($rule.required | index(["gpu.nccl-allreduce"]) | not)
                             then ["gpu.nccl-allreduce"] else [] end)) as $req
        | (if .form == "serve" then serve_outcome($rule.serving)
           else .checks | outcome($req; $run.gpu_capability; $cap) | by_floor($rule.floors; $run.configuration; $run.checks) end) as $gpu
        | (if .form == "serve" or ($rule.serving | length) == 0 then {outcome: $gpu, lifts: false}
           else ($serve | if . == null then null else serve_outcome($rule.serving) end) as $so
             | if $gpu == "product-failure" or $so == "product-failure" then {outcome: "product-failure", lifts: false}
               elif $gpu != "pass" then {outcome: $gpu, lifts: false}
               elif $so == "pass" then {outcome: "pass", lifts: true}
               else {outcome: "infrastructure", lifts: ($rule.lift_needs_serving | not)} end end) as $judged
        | $judged.outcome as $outcome
        | {lifts: $judged.lifts, problem: (
          if .time != $etime then "its time \(.time) is not the record'"'"'s \($etime)"
          elif .configuration != $econf then "it ran on \(.configuration), the record counts it in row \($econf)"
          elif .form == "serve" and (.image_ok | not) then "its predicate.image is not its subject (or names no image)"
          elif .form == "serve" and .declared != serve_outcome(.required_listed) then "it declares \(.declared), its checks give \(serve_outcome(.required_listed))"
          elif (.release != "" and .release != $tag) or .target != $t or .image_digest != $d or .capability != $cap
            then "it is about \(.release) \(.target) \(.image_digest) (capability \(.capability)), not \($tag) \($t) \($d) (\($cap))"
          elif (.gpu_capability | IN($cap, "none") | not) then "it was taken on a GPU of capability \(.gpu_capability)"
          elif $probe != "" and .probe != $probe then "it comes from probe \(.probe), the release'"'"'s is \($probe)"
          elif (.time | fromdateiso8601) < ($rt | fromdateiso8601) then "it is dated \(.time), before the release (\($rt))"
          elif $outcome != $eout then "its checks give \($outcome) under the release'"'"'s rule\(if $run.configuration != "1 GPU" then " (all-reduce floors included)" else "" end)\(if $serve != null then " with its serve-check record" elif ($rule.serving | length) > 0 and .form != "serve" then " (no serve-check record counted with it)" else "" end), the record says \($eout)"
          else "" end)}' <<<"$RUN")
      problem=$(jq -r .problem <<<"$verdict")
      [[ -z $problem ]] || fail "$E ($(basename "$R")): $problem"
      printf '%s %s\n' "$ident" "$(jq -r .lifts <<<"$verdict")" >>"$WORK/lifts.$t"
      if [[ $SERVE != null && -z ${SERVED[$ssha]:-} ]]; then
        SERVED[$ssha]=1
        serve_signed "$S" "$R" "$hsha" "$hseq" "$unsigned_ok" "$host"
      fi
      [[ -z ${FIRST[$s]:-} ]] || continue
      FIRST[$s]=$R
      # Who vouched: the enrolled host, in the hosts version the record that first accepted it was checked against.
      if [[ $host == unsigned ]]; then
        [[ $unsigned_ok == true ]] || fail "$R: counts unsigned evidence $s, but does not say it was allowed"
        note "$s: UNSIGNED evidence, counted with --allow-unsigned-evidence (the record says so)"
        continue
      fi
      [[ -n $hsha ]] || fail "$R: names host $host for $s, but no enrolled-hosts file"
      hv=$(host_version "$hsha" "$hseq")
      if [[ -z $hv ]]; then
        incomplete "$s: signed by $host, enrolled in hosts.json sha256 ${hsha:0:12}... ($([[ $hseq == 0 ]] && echo "a promotion/v2 record names no sequence" || echo "sequence $hseq")), which is not at hand (commit hosts.json, or --hosts-history DIR)"
        continue
      fi
      hk="$WORK/hosts/$hsha.$host.pub"
      if [[ ! -f $hk ]]; then
        IFS=$US read -r kind pem_fp identity < <(jq -r --arg h "$host" '[.hosts[] | select(.name == $h)][0] // {} |
            [(if .key then "key" elif .keyless then "keyless" else "" end), (.key.fingerprint // ""),
             (.keyless.identity // "")] | join("\u001f")' "$hv")
        [[ -n $kind ]] || fail "$R: counts $s from $host, who is not enrolled in the hosts version it was checked against"
        if [[ $kind == keyless ]]; then
          incomplete "$s: signed keylessly by $host ($identity): a Fulcio certificate needs cosign verify-blob"
          continue
        fi
        jq -r --arg h "$host" '.hosts[] | select(.name == $h) | .key.pem' "$hv" >"$hk"
        [[ "sha256:$(fingerprint_of "$hk")" == "$pem_fp" ]] || fail "$hv: $host's key is not its fingerprint"
      fi
      if [[ -e $E.sig ]]; then
        verify_sig "$hk" "$E" "$(cat "$E.sig")" "$E (host $host)"
        if [[ -e $E.sigstore.json ]]; then verify_bundle "$hk" "$E" "$E.sigstore.json"; fi
      elif [[ -e $E.sigstore.json ]]; then
        verify_bundle "$hk" "$E" "$E.sigstore.json"
      else
        fail "$E: the record says $host signed it, but no .sig or .sigstore.json is kept beside it"
      fi
    done < <(jq -r '.evidence[] | [.sha256, .file, .identity, .time, .outcome, .host, (.configuration // "1 GPU"),
        (.serving_sha256 // "")] | map(tostring) | join("\u001f")' "$R")
    ok "$(basename "$R"): $count run(s), each file, identity, binding and outcome as recomputed"
  done
  ok "every run's signature verifies with the key of the host the record names, as enrolled when it was accepted"

  # --- 8. the rule, recomputed ------------------------------------------------------------------------------
  step 8 "$t: each promotion record's level, from the release's rule and the runs it lists"
  LIFTS=$(jq -R -s 'split("\n") | map(select(length > 0) | split(" ") | {key: .[0], value: (.[1] == "true")}) | from_entries' \
    "$WORK/lifts.$t")
  for R in "${CHAIN[@]}"; do
    # the 1-GPU row is the target's level; each multi-GPU configuration a row of its own, from unverified (the Blackwell support RFC)
    expect=$(jq -c --argjson rule "$RULE" --arg released "$(jq -r .support_level <<<"$ENTRY")" --argjson lifts "$LIFTS" "$JQ_LIB"'
      [.evidence[] | select((.configuration // "1 GPU") == "1 GPU")] | standing($rule.n; $rule.intended; $released; $lifts)' "$R")
    rows=$(jq -c --argjson rule "$RULE" --argjson lifts "$LIFTS" "$JQ_LIB"'
      [.evidence[] | select(.configuration)] | group_by(.configuration)
      | map(standing($rule.n; $rule.intended; "unverified"; $lifts) as $s | .[0].configuration as $k
            | ($k | capture("^(?<g>[0-9]+) GPUs tp(?<tp>[0-9]+) (?<topo>.+)$")) as $c
            | {configuration: $k, gpus: ($c.g | tonumber), tensor_parallel_size: ($c.tp | tonumber), topology: $c.topo,
               level: $s.level, consecutive_passes: $s.streak, required_consecutive_passes: $rule.n, runs: length})' "$R")
    if [[ $(j .schema "$R") == "$NS/promotion/v2" ]]; then  # made under the targets file's rule: not signed
      if jq -e --argjson s "$expect" '.level == $s.level and .consecutive_passes == $s.streak' "$R" >/dev/null; then
        ok "$(basename "$R") (promotion/v2): $(j .level "$R"), as the implied rule gives"
      else
        note "$(basename "$R") (promotion/v2, made under its checkout's targets file, which nothing signed) says $(j .level "$R"); the implied rule gives $(jq -r .level <<<"$expect")"
      fi
      continue
    fi
    jq -e --argjson s "$expect" --argjson rule "$RULE" --arg released "$(jq -r .support_level <<<"$ENTRY")" \
      --argjson pv "$POLICY_VERSION" '.level == $s.level and .consecutive_passes == $s.streak
        and .required_consecutive_passes == $rule.n and .released_level == $released and .policy_version == $pv' "$R" \
      >/dev/null || fail "$R: says $(j .level "$R") after $(j .consecutive_passes "$R") of $(j .required_consecutive_passes "$R") passes (policy $(j .policy_version "$R")); the rule gives $(jq -r .level <<<"$expect") after $(jq -r .streak <<<"$expect") of $(jq -r .n <<<"$RULE") (policy $POLICY_VERSION)"
    jq -e --argjson rows "$rows" '[.configurations // [] | .[] | del(.note)] | sort_by(.configuration) == $rows' "$R" >/dev/null ||
      fail "$R: its multi-GPU rows are $(jq -c '[.configurations // [] | .[] | "\(.configuration): \(.level) \(.consecutive_passes)/\(.required_consecutive_passes) of \(.runs) run(s)"]' "$R"); the rule gives $(jq -c '[.[] | "\(.configuration): \(.level) \(.consecutive_passes)/\(.required_consecutive_passes) of \(.runs) run(s)"]' <<<"$rows")"
    ok "$(basename "$R"): $(j .level "$R"), $(j .consecutive_passes "$R") of $(j .required_consecutive_passes "$R") consecutive passes$( [[ $rows == "[]" ]] || jq -r '"; " + ([.[] | "\(.configuration): \(.level)"] | join(", "))' <<<"$rows")"
  done
  if [[ $(j .schema "$P") == "$NS/promotion/v3" ]]; then
    hs=$(j .hosts_sequence "$P")
    if ((hs > 0)); then
      [[ -n $HOSTS_SHA ]] || fail "$P: was checked against hosts.json sequence $hs, but $HOSTS is missing"
      ((hs <= HOSTS_SEQ)) || fail "$HOSTS: sequence $HOSTS_SEQ, older than sequence $hs, which promotion $(j .sequence "$P") of $t was checked against (an older file restored)"
      ((hs < HOSTS_SEQ)) || [[ $(j .hosts_sha256 "$P") == "$HOSTS_SHA" ]] ||
        fail "$HOSTS: sequence $HOSTS_SEQ, but not the version promotion $(j .sequence "$P") of $t was checked against"
      # VERIFYING.md step 4: hosts.json descends, link by link, from the version the promotion was checked against
      hsha=$(j .hosts_sha256 "$P")
      if [[ -z ${CHAIN_AT[$hs]:-} ]]; then
        if [[ $HOSTS_STOP == first ]]; then
          fail "$HOSTS: enrolled-hosts sequence $HOSTS_STOP_AT names no predecessor (previous_sha256 null: the first of a new chain), so sequence $HOSTS_SEQ does not descend from sequence $hs, which promotion $(j .sequence "$P") of $t saw: a new chain would re-enroll whatever it lists"
        fi
        fail "$HOSTS: enrolled-hosts sequence $HOSTS_STOP_AT names sequence $((HOSTS_STOP_AT - 1)) (sha256 $(cut -c1-12 <<<"${CHAIN_AT[$((HOSTS_STOP_AT - 1))]}")...), which is not at hand: the chain from sequence $hs, which promotion $(j .sequence "$P") of $t saw, to sequence $HOSTS_SEQ cannot be checked link by link (fetch it: git fetch, or keep it beside hosts.json as hosts.<sequence>.json with its .sig, or --hosts-history DIR)"
      fi
      [[ ${CHAIN_AT[$hs]} == "$hsha" ]] ||
        fail "$HOSTS: enrolled-hosts sequence $HOSTS_SEQ does not descend from sequence $hs (sha256 ${hsha:0:12}...), which promotion $(j .sequence "$P") of $t saw: its chain leads through another sequence $hs (sha256 ${CHAIN_AT[$hs]:0:12}...), a fork of the chain"
      ok "hosts.json sequence $HOSTS_SEQ is not older than the one promotion $(j .sequence "$P") was checked against ($hs)"
    fi
  fi
  unset VISITED FIRST SERVED
done

# --- 9. release.json's files ------------------------------------------------------------------------------
step 9 "release.json's files: each still the bytes the release wrote (in a release/v2 folder a promoted target's manifest excepted)"
while IFS=$'\t' read -r name want; do
  base=${name%.sigstore.json}
  base=${base%.sig}
  if [[ $base == *.json && -n ${SUPERSEDED[${base%.json}]:-} ]]; then
    note "$name: rewritten by promote (release/v2: the promotion record names the manifest now)"
    continue
  fi
  [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}$ ]] || fail "$INDEX: files names $name, which is not a file name"
  readable "$FOLDER/$name"
  [[ $(sha "$FOLDER/$name") == "$want" ]] || fail "$FOLDER/$name: not the file the release wrote (sha256 differs)"
done < <(j '.files | to_entries[] | "\(.key)\t\(.value)"' "$INDEX")
ok "$(j '.files | length' "$INDEX") file(s)"

# --- 10. published.json -----------------------------------------------------------------------------------
PUB="$FOLDER/published.json"
if [[ -e $PUB || -L $PUB ]]; then
  step 10 "published.json: signature, bound to this release.json, naming the released digests"
  signed_record "$PUB" "$NS/publication/v2"
  jq -e --arg tag "$TAG" --arg r "$RSHA" --arg fp "$FP" '.tag == $tag and .release_sha256 == $r and .key_fingerprint == $fp' \
    "$PUB" >/dev/null || fail "$PUB: the publication of release $(j .tag "$PUB") (release.json $(j .release_sha256 "$PUB" | cut -c1-12)...), not of this one"
  jq -e --slurpfile idx "$INDEX" '
    ($idx[0].targets | map({key: .target, value: .image.digest}) | from_entries) as $released
    | .destination as $dest
    | all(.images[]; $released[.target] == .digest and .reference == "\($dest)/\(.target)@\(.digest)"
          and .tag == "\($dest)/\(.target):\($idx[0].tag)"
          and .attestations == "\($dest)/\(.target):sha256-\(.digest | ltrimstr("sha256:")).att")
    and all(.indexes[]; (.reference | test("@sha256:[0-9a-f]{64}$")) and all(.targets[]; $released[.] != null))' \
    "$PUB" >/dev/null || fail "$PUB: names an image, tag or attestation that is not the released digest at its destination"
  ok "$(j '.images | length' "$PUB") image(s) at $(j .destination "$PUB")"
elif ((REGISTRY)); then
  fail "$PUB is missing: --registry verifies what published.json names"
fi

# --- 11. the registry (scripts/verify-independent-registry.sh) ---------------------------------------
if ((REGISTRY)); then
  # shellcheck source-path=SCRIPTDIR source=verify-independent-registry.sh
  source "$(dirname "${BASH_SOURCE[0]}")/verify-independent-registry.sh"
fi

if ((${#INCOMPLETE[@]})); then
  printf 'verify-independent: %s verified, except what could not be checked here:\n' "$FOLDER"
  printf '  %s\n' "${INCOMPLETE[@]}"
  exit 3
fi
printf 'verify-independent: %s verified (release %s, key %s)%s\n' "$FOLDER" "$TAG" "$FP" "$( ((REGISTRY)) && echo ", and what the registry holds")"
