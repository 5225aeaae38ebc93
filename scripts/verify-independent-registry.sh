# shellcheck shell=bash disable=SC2154
# Step 11 of scripts/verify-independent.sh (VERIFYING.md): the registry. Sourced by it with --registry: it uses
# its functions (fail, ok, note, sha, j, need) and what the steps before verified (KEY, TAG, RSHA, INDEX, FOLDER,
# PUB, CURRENT_SEQ, CURRENT_MANIFEST_SHA, CURRENT_LEVEL, WORK, LIMIT). Not a command of its own.

step 11 "the registry: images by digest, the version tags, the DSSE attestations beside each image"
if [[ -z $FETCH ]]; then FETCH=$(command -v skopeo >/dev/null 2>&1 && echo skopeo || echo curl); fi
need "$FETCH" "fetching from the registry"
AUTH_FILE=${AUTH_FILE:-${REGISTRY_AUTH_FILE:-$HOME/.docker/config.json}}
[[ -f $AUTH_FILE ]] || AUTH_FILE=""
if [[ -n $CA ]]; then readable "$CA"; mkdir -p "$WORK/certs"; cp "$CA" "$WORK/certs/ca.crt"; fi
host_of() { echo "${1%%/*}"; }
# fetch_manifest NAME REF OUT: the manifest bytes the registry serves for NAME:REF or NAME@REF
fetch_manifest() {
  local sep=":"
  [[ $2 == sha256:* ]] && sep="@"
  if [[ $FETCH == skopeo ]]; then
    skopeo inspect --raw ${CA:+--cert-dir "$WORK/certs"} ${AUTH_FILE:+--authfile "$AUTH_FILE"} "docker://$1$sep$2" >"$3" 2>"$WORK/err" ||
      fail "$1$sep$2: skopeo could not fetch it: $(head -c 300 "$WORK/err")"
  else
    curl_get "$1" "manifests/$2" "$3"
  fi
}
fetch_blob() {  # fetch_blob NAME DIGEST OUT
  if [[ $FETCH == skopeo ]]; then
    [[ -f $WORK/att/${2#sha256:} ]] || fail "$1@$2: not among the blobs skopeo copied"
    cp "$WORK/att/${2#sha256:}" "$3"
  else
    curl_get "$1" "blobs/$2" "$3"
  fi
}
curl_get() {  # basic auth from the auth file (htpasswd registries); token registries: use skopeo
  local host path auth
  host=$(host_of "$1") path=${1#*/}
  auth=""
  if [[ -n $AUTH_FILE ]]; then auth=$(jq -r --arg h "$host" '.auths[$h].auth // empty' "$AUTH_FILE"); fi
  curl -fsSL --max-filesize "$LIMIT" ${CA:+--cacert "$CA"} ${auth:+-H "Authorization: Basic $auth"} \
    -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json' \
    "https://$host/v2/$path/$2" -o "$3" 2>"$WORK/err" || fail "https://$host/v2/$path/$2: $(head -c 300 "$WORK/err")"
}
mapfile -t IMAGES < <(jq -c '.images[]' "$PUB")
for img in "${IMAGES[@]}"; do
  t=$(jq -r .target <<<"$img") digest=$(jq -r .digest <<<"$img")
  name=$(jq -r '.reference | sub("@sha256:[0-9a-f]{64}$"; "")' <<<"$img")
  fetch_manifest "$name" "$digest" "$WORK/image.json"
  [[ "sha256:$(sha "$WORK/image.json")" == "$digest" ]] || fail "$name@$digest: the registry serves other bytes"
  fetch_manifest "$name" "$TAG" "$WORK/tagged.json"
  [[ "sha256:$(sha "$WORK/tagged.json")" == "$digest" ]] || fail "$name:$TAG is not $digest (the version tag moved)"
  ok "$t: $name@$digest, and $name:$TAG is that digest"
  att="sha256-${digest#sha256:}.att"
  fetch_manifest "$name" "$att" "$WORK/att.json"
  if [[ $FETCH == skopeo ]]; then
    rm -rf "$WORK/att"
    skopeo copy -q ${CA:+--src-cert-dir "$WORK/certs"} ${AUTH_FILE:+--src-authfile "$AUTH_FILE"} \
      "docker://$name:$att" "dir:$WORK/att" >/dev/null 2>"$WORK/err" || fail "$name:$att: skopeo copy: $(head -c 300 "$WORK/err")"
  fi
  mapfile -t LAYERS < <(jq -r '.layers[]? | "\(.digest)\t\(.annotations.predicateType // "")"' "$WORK/att.json")
  ((${#LAYERS[@]})) || fail "$name:$att: no layers (not an attestation image)"
  : >"$WORK/verified.jsonl"
  n=0
  for layer in "${LAYERS[@]}"; do
    ld=${layer%%$'\t'*} ptype=${layer#*$'\t'} n=$((n + 1))
    [[ $ld =~ ^sha256:[0-9a-f]{64}$ ]] || fail "$name:$att: layer $n's digest is not sha256"
    fetch_blob "$name" "$ld" "$WORK/layer"
    [[ "sha256:$(sha "$WORK/layer")" == "$ld" ]] || fail "$name:$att: layer $ld does not match its content"
    # DSSE: the signature is over PAE(type, payload) = "DSSEv1 <len(type)> <type> <len(payload)> <payload>".
    if ! jq -e --arg it "$IN_TOTO" 'type == "object" and .payloadType == $it' "$WORK/layer" >/dev/null 2>&1; then
      note "layer $n ($ptype): not an in-toto DSSE envelope, not ours"
      continue
    fi
    j .payload "$WORK/layer" | openssl base64 -d -A >"$WORK/payload" 2>/dev/null || true
    { printf 'DSSEv1 %d %s %d ' "${#IN_TOTO}" "$IN_TOTO" "$(wc -c <"$WORK/payload")"; cat "$WORK/payload"; } >"$WORK/pae"
    good=0
    while read -r sig; do
      printf '%s' "$sig" | openssl base64 -d -A >"$WORK/dsse.der" 2>/dev/null || continue
      if openssl dgst -sha256 -verify "$KEY" -signature "$WORK/dsse.der" "$WORK/pae" >/dev/null 2>&1; then good=1; fi
    done < <(j '.signatures[]?.sig // empty' "$WORK/layer")
    if ((!good)); then
      note "layer $n ($ptype): not signed by the release key (another tool's attestation, or a forgery): it does not count"
      continue
    fi
    jq -e --arg st "$STATEMENT" --arg pt "$ptype" --arg d "${digest#sha256:}" \
      '._type == $st and .predicateType == $pt and .subject[0].digest.sha256 == $d' "$WORK/payload" >/dev/null 2>&1 ||
      fail "$name:$att: layer $n is signed with the release key, but is not a Statement of type $ptype about $digest"
    jq -c --arg sha "$(sha "$WORK/payload")" --arg n "$n" --arg ns "$NS/release-statement/" '{layer: $n, sha256: $sha,
        type: .predicateType, subject: .subject[0].name,
        predicate: (if (.predicateType | startswith($ns)) then .predicate else null end),
        level: (if .predicateType == "'"$QUALIFICATION"'" then (.predicate.support_level // "" | tostring) else null end)}' \
      "$WORK/payload" >>"$WORK/verified.jsonl"
    cp "$WORK/payload" "$WORK/payload.$n"
    ok "layer $n: $ptype, DSSE signature over its PAE verifies with the release key, about $digest"
  done
  # The release statement of this release and promotion decides; the qualification statement it names.
  cur=${CURRENT_SEQ[$t]}
  rs=$(jq -s -c --arg rt "$RELEASE_STATEMENT" --arg tag "$TAG" --arg r "$RSHA" --arg t "$t" \
    '[.[] | select(.type == $rt) | .predicate | select(.tag == $tag and .release_sha256 == $r and .target == $t)]' \
    "$WORK/verified.jsonl")
  if [[ $(jq 'length' <<<"$rs") == 0 ]]; then
    other=$(jq -s -r --arg rt "$RELEASE_STATEMENT" '[.[] | select(.type == $rt) | .predicate.tag] | unique | join(", ")' "$WORK/verified.jsonl")
    fail "$name:$att: no signed release statement of release $TAG (release.json ${RSHA:0:12}...)${other:+; it attests release(s) $other}"
  fi
  top=$(jq -r 'map(.promotion) | max' <<<"$rs")
  ((top <= cur)) || fail "$name:$att: attests promotion $top of $t, but this folder holds promotion $cur: the folder is older than what was published"
  ((top == cur)) || fail "$name:$att: attests promotion $top of $t; this folder holds promotion $cur: publish again (nox -s publish -- $TAG --to ...)"
  [[ $(jq --argjson c "$cur" '[.[] | select(.promotion == $c)] | unique | length' <<<"$rs") == 1 ]] ||
    fail "$name:$att: two different signed release statements claim promotion $cur of $TAG"
  stmt=$(jq -c --argjson c "$cur" '[.[] | select(.promotion == $c)][0]' <<<"$rs")
  jq -e --argjson s "$stmt" --arg m "${CURRENT_MANIFEST_SHA[$t]}" '$s.sequence == .sequence and $s.time == .time and $s.manifest_sha256 == $m' \
    "$INDEX" >/dev/null || fail "$name:$att: the release statement's sequence, time or manifest_sha256 is not this release's"
  [[ $(jq -r .manifest_subject <<<"$stmt") == "$(j '.subject[0].name' "$FOLDER/$t.json")" ]] ||
    fail "$name:$att: the release statement names the manifest's subject $(jq -r .manifest_subject <<<"$stmt"), the manifest $(j '.subject[0].name' "$FOLDER/$t.json")"
  q=$(jq -s -r --arg q "$QUALIFICATION" --arg s "$(jq -r .statement_sha256 <<<"$stmt")" \
    '[.[] | select(.type == $q and .sha256 == $s) | .layer][0] // empty' "$WORK/verified.jsonl")
  [[ -n $q ]] || fail "$name:$att: no signed qualification statement is the one the release statement names ($(jq -r .statement_sha256 <<<"$stmt" | cut -c1-12)...)"
  [[ $(j '.subject[0].name' "$WORK/payload.$q") == "$name" ]] ||
    fail "$name:$att: the qualification statement names $(j '.subject[0].name' "$WORK/payload.$q"), not the repository it was published to"
  # Renamed back to the released subject it is the released manifest (compared as JSON values: jq 1.6 rewrites 1.0 as 1).
  [[ $(jq -S -c --arg n "$(jq -r .manifest_subject <<<"$stmt")" '.subject[0].name = $n' "$WORK/payload.$q") == \
     "$(jq -S -c . "$FOLDER/$t.json")" ]] || fail "$name:$att: the qualification statement, renamed back, is not the released manifest $t.json"
  ok "$t: release statement $TAG (sequence $(jq -r .sequence <<<"$stmt"), promotion $cur) names the qualification statement in layer $q, which is $t.json renamed for $name"
  # Which is current: a publish after promote replaces the older level's statements (and says which). Any other
  # signed statement of ours still at the tag is one a consumer reading the attestations by type also gets.
  # A copy of the named qualification statement (the same bytes: from release/v3 promote never rewrites the
  # manifest, so every publish of a release signs the same one) says nothing more and is not stale.
  stale=$(jq -s -r --arg q "$QUALIFICATION" --arg ns "$NS/release-statement/" --arg qs "$(jq -r .statement_sha256 <<<"$stmt")" --argjson s "$stmt" '
    [.[] | select((.type == $q and .sha256 != $qs) or ((.type | startswith($ns)) and .predicate != $s))
     | if .type == $q then "layer \(.layer): qualification statement (level \(.level))"
       else "layer \(.layer): release statement \(.predicate.tag // "?") (sequence \(.predicate.sequence // "?"), promotion \(.predicate.promotion // "?"))" end]
    | join("; ")' "$WORK/verified.jsonl")
  [[ -z $stale ]] || fail "$name:$att: also holds signed statements the current ones supersede ($stale): a consumer reading them by type sees more than the current level; publish again (nox -s publish -- $TAG --to ...)"
  ok "$t: no superseded statement of ours is left at $att: the current level (${CURRENT_LEVEL[$t]}) is the only one"
done
while read -r ref; do
  [[ -n $ref ]] || continue
  iname=${ref%@*} idigest=${ref##*@}
  fetch_manifest "$iname" "$idigest" "$WORK/index.json"
  [[ "sha256:$(sha "$WORK/index.json")" == "$idigest" ]] || fail "$ref: the registry serves other bytes"
  jq -e --slurpfile p "$PUB" --arg ref "$ref" '($p[0].indexes[] | select(.reference == $ref) | .targets) as $ts
    | ($p[0].images | map({key: .target, value: .digest}) | from_entries) as $d
    | [.manifests[].digest] as $have | all($ts[]; . as $x | $have | index([$d[$x]]) != null)' "$WORK/index.json" >/dev/null ||
    fail "$ref: the index does not hold every target's published digest"
  ok "index $ref holds its targets' digests"
done < <(j '.indexes[].reference' "$PUB")
