package module

import (
	"testing"
	"unicode/utf8"
)

// TestHeadCutsOnARuneBoundary: the message of a refusal is cut to 1024 bytes for the Module's
// condition; a cut inside a multi-byte character would leave invalid UTF-8 in the status.
func TestHeadCutsOnARuneBoundary(t *testing.T) {
	cases := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"short enough: unchanged", "héllo", 6, "héllo"},
		{"ASCII cut", "abcdef", 3, "abc…"},
		{"cut after a two-byte character", "aé b", 3, "aé…"},
		{"cut inside a two-byte character", "aéb", 2, "a…"},
		{"cut inside a three-byte character", "ab€c", 3, "ab…"},
		{"cut inside a three-byte character, second byte", "ab€c", 4, "ab…"},
		{"cut inside a four-byte character", "a😀", 3, "a…"},
		{"cut inside the first character", "😀x", 2, "…"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := head(tc.s, tc.n)
			if got != tc.want {
				t.Errorf("head(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
			}
			if !utf8.ValidString(got) {
				t.Errorf("head(%q, %d) = %q is not valid UTF-8", tc.s, tc.n, got)
			}
		})
	}
}
