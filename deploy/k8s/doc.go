// Package k8s holds b2bd's Kubernetes manifests (*.yaml); its test decodes
// each one strictly into k8s.io/api types and checks what b2bd needs.
package k8s
