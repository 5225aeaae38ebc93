#!/bin/sh
# The user the server runs as (images/targets.toml [defaults.user]), and the
# cache directories it writes. A base that has the uid already keeps its user
# (nvidia/cuda's ubuntu24.04: ubuntu, 1000). Otherwise the passwd, group and
# shadow lines are written by hand: useradd stamps /etc/shadow with the day it
# ran, which would make two builds of the hermetic base differ.
set -eu
name=$1 uid=$2
if existing=$(getent passwd "$uid"); then
  name=${existing%%:*}
  home=$(echo "$existing" | cut -d: -f6)
else
  home=/home/$name
  getent group "$uid" >/dev/null || echo "$name:x:$uid:" >>/etc/group
  echo "$name:x:$uid:$uid:vLLM server:$home:/bin/sh" >>/etc/passwd
  if [ -f /etc/shadow ]; then echo "$name:!:::::::" >>/etc/shadow; fi
  if [ -f /etc/gshadow ]; then echo "$name:!::" >>/etc/gshadow; fi
fi
# The model, vLLM and Triton caches (the deploy mounts its volumes here): a
# new named volume takes the directory's owner, so the server can write it.
mkdir -p "$home" /var/cache/blackwell/huggingface /var/cache/blackwell/vllm /var/cache/blackwell/triton
chown "$uid:$uid" "$home" /var/cache/blackwell/huggingface /var/cache/blackwell/vllm /var/cache/blackwell/triton
chmod 0755 "$home"
echo "runtime user: $name (uid $uid), home $home"
