// Package deploy holds no code. Its tests check the files that deploy the
// gateway, which live here and at the repository root: the Prometheus
// config, rules and their unit tests, the Grafana provisioning and
// dashboard, the compose gateway configs, docker-compose.yml, the Dockerfile
// and .dockerignore, the Helm chart in helm/tollgate (rendered with helm
// template, decoded strictly into the Kubernetes API types, and a rolling
// restart of two gateway processes with its timings), the test scripts in
// .ci (the README's test command and what it installs), and the Markdown
// files' relative links and the README's length. Where a check needs a
// running gateway it builds the binary from ../cmd/gateway.
//
// Tests that need a tool (Debian's prometheus package, docker-compose,
// helm) skip without it, unless CI is set: then they fail, as .ci/run
// installs them.
package deploy
