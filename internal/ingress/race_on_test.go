//go:build race

package ingress

// raceBuild: the race detector's shadow memory makes every goroutine and allocation cost
// several times its size, which memory figures must allow for.
const raceBuild = true
