//go:build chaosbugs

package chaosbug

import (
	"os"
	"slices"
	"strings"
)

// enabled are the bugs KMM_CHAOS_BUGS names, read once at start.
var enabled = strings.Split(os.Getenv("KMM_CHAOS_BUGS"), ",")

// Enabled says whether the seeded bug name is planted in this process.
func Enabled(name string) bool { return name != "" && slices.Contains(enabled, name) }
