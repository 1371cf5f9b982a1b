package kernel

import (
	"fmt"
	"strconv"
	"strings"
)

// maxComponents bounds the numeric release components a version may have.
const maxComponents = 6

// Version is a parsed kernel version.
type Version struct {
	// Full is the version string as the node reports it, without a trailing '+'.
	Full string
	// Release are the dot-separated numeric components before the first '-'.
	Release []int
	// Build is the leading number of the suffix after the first '-' (0 when absent).
	Build int
	// HasBuild says whether the suffix started with a number.
	HasBuild bool
}

// Parse parses a kernel version such as "5.14.0-553.el9.x86_64" or "6.1.0-56-cloud-amd64". What
// CheckString refuses (too long, a character a release string cannot hold) is an error.
func Parse(s string) (Version, error) {
	if len(s) > MaxLength {
		return Version{}, fmt.Errorf("kernel version of %d bytes is longer than %d", len(s), MaxLength)
	}
	full := strings.TrimRight(strings.TrimSpace(s), "+")
	if err := CheckString(full); err != nil {
		return Version{}, err
	}
	release, suffix, _ := strings.Cut(full, "-")
	parts := strings.Split(release, ".")
	if len(parts) > maxComponents {
		return Version{}, fmt.Errorf("kernel version %q has more than %d numeric components", s, maxComponents)
	}
	v := Version{Full: full, Release: make([]int, 0, len(parts))}
	for _, p := range parts {
		n, err := parseNumber(p)
		if err != nil {
			return Version{}, fmt.Errorf("kernel version %q: component %q is not a number", s, p)
		}
		v.Release = append(v.Release, n)
	}
	digits := leadingDigits(suffix)
	if digits != "" {
		n, err := parseNumber(digits)
		if err != nil {
			return Version{}, fmt.Errorf("kernel version %q: build number %q is too large", s, digits)
		}
		v.Build, v.HasBuild = n, true
	}
	return v, nil
}

// XYZ returns the first three release components joined by dots ("5.14.0"), padding with zeros.
func (v Version) XYZ() string {
	c := v.components(3)
	return fmt.Sprintf("%d.%d.%d", c[0], c[1], c[2])
}

// components returns the first n release components, padded with zeros.
func (v Version) components(n int) []int {
	out := make([]int, n)
	copy(out, v.Release)
	return out
}

// Compare compares v with bound over the components bound names (see the package comment) and
// returns -1, 0 or +1.
func (v Version) Compare(bound Version) int {
	mine := v.components(max(len(bound.Release), 1))
	for i, b := range bound.components(len(mine)) {
		if c := compareInt(mine[i], b); c != 0 {
			return c
		}
	}
	if bound.HasBuild {
		return compareInt(v.Build, bound.Build)
	}
	return 0
}

func compareInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func parseNumber(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("not a number: %q", s)
	}
	n, err := strconv.ParseInt(s, 10, 32)
	return int(n), err
}

func leadingDigits(s string) string {
	end := len(s) - len(strings.TrimLeft(s, "0123456789"))
	return s[:end]
}
