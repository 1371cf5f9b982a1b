package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// MaxLabelValue is the longest label value (and the longest name the DaemonSet and worker pod
// labels carry).
const MaxLabelValue = 63

// Bounded returns s when it has at most limit characters, else a prefix of s, a dash and 16 hex
// digits of s's SHA-256, limit characters in all. Distinct inputs stay distinct (up to a hash
// collision), and the result stays a valid object name or label value when s is one: the prefix is
// cut back to end in a letter or digit.
func Bounded(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	prefix := strings.TrimRight(s[:limit-17], "-._")
	return prefix + "-" + hex.EncodeToString(sum[:8])
}
