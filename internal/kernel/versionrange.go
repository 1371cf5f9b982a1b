package kernel

import (
	"fmt"
	"strings"
)

// Range is a parsed version range: alternatives separated by "||", each a list of comparisons that
// must all hold, separated by spaces or commas, e.g. ">=5.14.0 <6.0 || =4.18".
type Range struct {
	alternatives [][]comparison
}

type comparison struct {
	op    string
	bound Version
}

// operators are tried longest first so that ">=" is not read as ">".
var operators = []string{">=", "<=", "==", "!=", ">", "<", "="}

// ParseRange parses a version range.
func ParseRange(s string) (Range, error) {
	var r Range
	for _, alt := range strings.Split(s, "||") {
		fields := strings.FieldsFunc(alt, func(c rune) bool { return c == ' ' || c == ',' || c == '\t' })
		fields = joinOperators(fields)
		if len(fields) == 0 {
			return Range{}, fmt.Errorf("version range %q has an empty alternative", s)
		}
		var cmps []comparison
		for _, f := range fields {
			c, err := parseComparison(f)
			if err != nil {
				return Range{}, fmt.Errorf("version range %q: %w", s, err)
			}
			cmps = append(cmps, c)
		}
		r.alternatives = append(r.alternatives, cmps)
	}
	return r, nil
}

// joinOperators glues an operator written apart from its version (">= 5.14") to that version.
func joinOperators(fields []string) []string {
	out := make([]string, 0, len(fields))
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if isOperator(f) && i+1 < len(fields) {
			f += fields[i+1]
			i++
		}
		out = append(out, f)
	}
	return out
}

func isOperator(s string) bool {
	for _, op := range operators {
		if s == op {
			return true
		}
	}
	return false
}

func parseComparison(f string) (comparison, error) {
	op, rest := "=", f
	for _, candidate := range operators {
		if strings.HasPrefix(f, candidate) {
			op, rest = candidate, f[len(candidate):]
			break
		}
	}
	bound, err := Parse(rest)
	if err != nil {
		return comparison{}, fmt.Errorf("bad comparison %q: %w", f, err)
	}
	return comparison{op: op, bound: bound}, nil
}

// Contains reports whether v lies in the range.
func (r Range) Contains(v Version) bool {
	for _, alt := range r.alternatives {
		if allHold(alt, v) {
			return true
		}
	}
	return false
}

func allHold(cmps []comparison, v Version) bool {
	for _, c := range cmps {
		if !c.holds(v) {
			return false
		}
	}
	return true
}

func (c comparison) holds(v Version) bool {
	d := v.Compare(c.bound)
	switch c.op {
	case ">=":
		return d >= 0
	case "<=":
		return d <= 0
	case ">":
		return d > 0
	case "<":
		return d < 0
	case "!=":
		return d != 0
	default: // "=" and "=="
		return d == 0
	}
}
