// Package check tests the deployment files under deploy/ against the
// commands they run. The Kubernetes manifests decode strictly into the
// API's types (an unknown or misspelt field is an error) and agree with
// each other and with the commands: the peers list names the
// StatefulSet's pods, the ports, probes, volumes and Secrets line up. The
// systemd units hold the keys their hardening relies on. Every flag and
// RATION_* variable that a manifest, unit or environment file sets is one
// the command's -help lists, with a value its parser accepts.
//
// It is a module of its own, so that the Kubernetes API types stay out of
// ration's module; run it with `go test` in this directory.
package check
