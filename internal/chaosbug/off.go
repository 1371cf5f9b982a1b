//go:build !chaosbugs

package chaosbug

// Enabled is false outside chaosbugs builds.
func Enabled(string) bool { return false }
