#!/usr/bin/env bash
# deploy/check.sh: validates everything under deploy/ (run by `make test`
# through `make deploy-check`):
#   - deploy/kubernetes/: `kustomize build` renders the kustomization, and
#     kubectl-validate checks every manifest and the rendered output against
#     the Kubernetes API's own OpenAPI schemas (strict: an unknown field, a
#     wrong type or an invalid name is an error); two broken manifests in
#     testdata/ must be rejected, or the check itself is broken;
#   - deploy/prometheus/: `promtool check rules` and `promtool test rules`,
#     and `promtool check config` for the Prometheus configurations.
# The Go tools are pinned and installed with `go install` into a cache
# directory outside the work tree when missing (about 2 minutes once per machine).
set -euo pipefail
cd "$(dirname "$0")/.."

KUBECTL_VALIDATE_VERSION=v0.0.4   # sigs.k8s.io/kubectl-validate; embeds the schemas of Kubernetes 1.23-1.30
KUSTOMIZE_VERSION=v5.8.2          # sigs.k8s.io/kustomize/kustomize/v5
K8S_VERSION=1.30                  # newest schema set kubectl-validate $KUBECTL_VALIDATE_VERSION carries
TOOLS_DIR=${RATEGATE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rategate-tools}
GO=${GO:-go}

# tool NAME MODULE VERSION: the path of a pinned Go tool, installed if missing.
tool() {
	local name=$1 module=$2 version=$3
	local dir="$TOOLS_DIR/$name-$version"
	if [ ! -x "$dir/$name" ]; then
		echo "installing $module@$version into $dir" >&2
		mkdir -p "$dir"
		GOBIN="$dir" GOFLAGS= "$GO" install "$module@$version" >&2
	fi
	echo "$dir/$name"
}

need() {
	command -v "$1" >/dev/null 2>&1 || { echo "deploy/check.sh: $1 not found: apt-get install -y $2 (or run make deps)" >&2; exit 1; }
}
need promtool prometheus

validate=$(tool kubectl-validate sigs.k8s.io/kubectl-validate "$KUBECTL_VALIDATE_VERSION")
kustomize=$(tool kustomize sigs.k8s.io/kustomize/kustomize/v5 "$KUSTOMIZE_VERSION")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== kustomize build deploy/kubernetes"
"$kustomize" build deploy/kubernetes >"$work/rendered.yaml"
echo "rendered $(grep -c '^kind:' "$work/rendered.yaml") objects"

# The overlay docs/kubernetes.md shows ("When Redis is down"): readiness on
# /healthz. It must build and change exactly that path.
overlay=deploy/.check-overlay-$$
trap 'rm -rf "$work" "$overlay"' EXIT
mkdir -p "$overlay"
cat >"$overlay/kustomization.yaml" <<OVERLAY
resources:
  - ../kubernetes
patches:
  - target: {kind: Deployment, name: rategate}
    patch: |
      - op: replace
        path: /spec/template/spec/containers/0/readinessProbe/httpGet/path
        value: /healthz
OVERLAY
"$kustomize" build "$overlay" >"$work/overlay.yaml"
rm -rf "$overlay"
if [ "$(diff "$work/rendered.yaml" "$work/overlay.yaml" | grep -c '^[<>]')" != 2 ] || ! grep -q 'path: /healthz' "$work/overlay.yaml"; then
	echo "FAIL: the readiness overlay of docs/kubernetes.md does not change exactly the readiness path:" >&2
	diff "$work/rendered.yaml" "$work/overlay.yaml" >&2 || true
	exit 1
fi
echo "the readiness overlay of docs/kubernetes.md builds"

echo "== kubectl-validate (Kubernetes $K8S_VERSION schemas)"
manifests=()
for f in deploy/kubernetes/*.yaml deploy/kubernetes/examples/*.yaml; do
	[ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
"$validate" --version "$K8S_VERSION" "${manifests[@]}" "$work/rendered.yaml" "$work/overlay.yaml"

echo "== the validator rejects broken manifests"
for f in deploy/kubernetes/testdata/*.yaml; do
	if out=$("$validate" --version "$K8S_VERSION" "$f" 2>&1); then
		echo "FAIL: kubectl-validate accepted $f:" >&2
		echo "$out" >&2
		exit 1
	fi
	echo "rejected as it must be: $f: $(echo "$out" | grep -m1 -o 'spec\..*' || true)"
done

echo "== promtool check rules"
promtool check rules deploy/prometheus/*.yaml

echo "== promtool test rules"
promtool test rules deploy/prometheus/tests/*.yaml

echo "== promtool check config"
# credentials_file must exist for promtool: point the configs at a stand-in.
for f in deploy/prometheus/prometheus-kubernetes.yml deploy/compose/prometheus.yml; do
	mkdir -p "$work/cfg"
	sed -e "s#/etc/prometheus/rules/#$PWD/deploy/prometheus/#" \
		-e "s#credentials_file: .*#credentials_file: $work/token#" "$f" >"$work/cfg/$(basename "$f")"
	echo stand-in >"$work/token"
	promtool check config "$work/cfg/$(basename "$f")"
done
echo "deploy/: all checks passed"
