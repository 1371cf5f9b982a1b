package kernel

import (
	"fmt"
	"regexp"
	"regexp/syntax"
)

// MaxLength is the longest kernel version string kmm accepts from a Node: the kernel's own release
// string (uname -r) holds at most 64 bytes (__NEW_UTS_LEN), so anything longer is not a kernel.
const MaxLength = 64

// CheckString reports why s cannot be a kernel release string as a node reports it: empty, longer
// than MaxLength, or holding a character outside letters, digits and ". _ + ~ -". The same string
// becomes a directory name on the node (lib/modules/<kernel>) and part of image references, so a
// "/" or a NUL must never pass.
func CheckString(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty kernel version")
	case len(s) > MaxLength:
		return fmt.Errorf("kernel version of %d bytes is longer than %d", len(s), MaxLength)
	case s == "." || s == "..":
		return fmt.Errorf("kernel version %q is not a kernel version", s)
	}
	for i := 0; i < len(s); i++ {
		if !releaseChar(s[i]) {
			return fmt.Errorf("kernel version %q holds %q: only letters, digits and . _ + ~ - are allowed", s, s[i])
		}
	}
	return nil
}

func releaseChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return c == '.' || c == '_' || c == '+' || c == '~' || c == '-'
}

// Bounds of a kernel-mapping or namespace pattern: its length and the size of its compiled program.
// Go's regexp matches in time linear in the input, but a pattern like \pL{1000} compiles to a
// program of thousands of instructions that every match walks; these bounds keep one match of a
// MaxLength kernel string within microseconds.
const (
	MaxPatternLength       = 1024
	MaxPatternInstructions = 2000
)

// CompilePattern compiles a Go regular expression within the bounds above.
func CompilePattern(pattern string) (*regexp.Regexp, error) {
	if len(pattern) > MaxPatternLength {
		return nil, fmt.Errorf("pattern of %d bytes is longer than %d", len(pattern), MaxPatternLength)
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, err
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, err
	}
	if n := len(prog.Inst); n > MaxPatternInstructions {
		return nil, fmt.Errorf("pattern compiles to %d instructions, more than %d: simplify it (e.g. fewer or smaller repetitions)", n, MaxPatternInstructions)
	}
	return regexp.Compile(pattern)
}
