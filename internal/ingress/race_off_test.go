//go:build !race

package ingress

// raceBuild: see race_on_test.go.
const raceBuild = false
