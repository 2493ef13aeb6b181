// Package arch holds no code: its test keeps the dependency rules of the codebase (STYLE.md,
// "Dependencies point one way") from eroding.
package arch
