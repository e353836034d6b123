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
# A python3 outside a virtual environment (pyenv, conda, run as root): pip must not install into it (it did, as root,
# into whatever python3 came first); the script says what to run instead. Inside a venv pip may.
cat > "$fake/python3" <<PY
#!/bin/sh
if [ "\$1" = "-m" ] && [ "\$2" = "pip" ]; then
  touch "$fake/pip-ran"
  exit 0
fi
case "\$2" in
  *base_prefix*) exit \${FAKE_VENV:-0} ;;  # sys.exit(sys.prefix == sys.base_prefix): 1 outside a venv
esac
exit 1  # import numpy fails
PY
err="$(FAKE_VENV=1 PATH="$fake:$PATH" bash "$repo/scripts/install-deps.sh" 2>&1 >/dev/null)" || { echo "install-deps.sh failed: $err"; exit 1; }
if [ -e "$fake/pip-ran" ]; then echo "install-deps.sh ran pip for a python3 outside a virtual environment"; exit 1; fi
case "$err" in
  *"python3 -m pip install numpy"*) echo "ok: $err" ;;
  *) echo "install-deps.sh did not say how to get numpy: '$err'"; exit 1 ;;
esac
FAKE_VENV=0 PATH="$fake:$PATH" bash "$repo/scripts/install-deps.sh" >/dev/null 2>&1
[ -e "$fake/pip-ran" ] || { echo "install-deps.sh did not pip-install numpy into a virtual environment"; exit 1; }
echo "ok: pip only inside a virtual environment"
