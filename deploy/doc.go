// Package deploy holds what runs prefixrouter in Kubernetes and watches it
// there — the container image (deploy/image), the kustomizations
// (deploy/kustomize), the alerting rules (deploy/prometheus) and the
// Grafana dashboard (deploy/grafana) — and the tests that keep them honest:
// every kustomization builds and decodes strictly into its API types, the
// rules pass promtool's checks and unit tests, and every metric they and
// the dashboard name is one a live router exports.
package deploy
