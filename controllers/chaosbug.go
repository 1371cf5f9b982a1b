package controllers

import (
	"sync"

	"github.com/kmm-project/kmm/internal/chaosbug"
)

// cordonsSetHere are the nodes this process cordoned, kept only for the seeded bug
// chaosbug.ForgetCordon (off in production builds: see internal/chaosbug).
var cordonsSetHere sync.Map

// rememberCordon records a cordon this process set (the seeded bug only).
func rememberCordon(node string) {
	if chaosbug.Enabled(chaosbug.ForgetCordon) {
		cordonsSetHere.Store(node, true)
	}
}

// forgetsCordon is the seeded bug: a cordon set by an earlier process is not lifted.
func forgetsCordon(node string) bool {
	if !chaosbug.Enabled(chaosbug.ForgetCordon) {
		return false
	}
	_, mine := cordonsSetHere.Load(node)
	return !mine
}

// errorAsNoPods is the seeded bug chaosbug.ErrorAsNoPods: a failed read of a drain's workload pods
// is taken as an empty list.
func errorAsNoPods(err error) bool {
	return err != nil && chaosbug.Enabled(chaosbug.ErrorAsNoPods)
}
