//go:build tools

// Package tools pins helm.sh/helm/v4 (deploy/tools/build-helm.sh builds its cmd/helm).
package tools

import _ "helm.sh/helm/v4/cmd/helm"
