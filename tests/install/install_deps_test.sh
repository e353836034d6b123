#!/usr/bin/env bash
# scripts/install-deps.sh on a stock Debian python3 whose pip refuses to install (PEP 668, an externally managed
# environment) and with numpy not importable: the script must finish (the README chains it with cmake) and say why.
# dpkg, apt-get and python3 are stand-ins on PATH; nothing is installed.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
fake="$(mktemp -d)"
trap 'rm -rf "$fake"' EXIT
printf '#!/bin/sh\nexit 0\n' > "$fake/dpkg"  # every package present
printf '#!/bin/sh\necho "apt-get must not run" >&2; exit 1\n' > "$fake/apt-get"
cat > "$fake/python3" <<'PY'
#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "error: externally-managed-environment" >&2
  exit 1
fi
exit 1  # import numpy fails
PY
chmod +x "$fake/dpkg" "$fake/apt-get" "$fake/python3"
err="$(PATH="$fake:$PATH" bash "$repo/scripts/install-deps.sh" 2>&1 >/dev/null)" || { echo "install-deps.sh failed: $err"; exit 1; }
case "$err" in
  *"numpy is missing"*) echo "ok: $err" ;;
  *) echo "install-deps.sh said nothing about numpy: '$err'"; exit 1 ;;
esac
