package main

import (
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ellipsis marks text cut to fit a column.
const ellipsis = "…"

// table is a plain-text table: left-aligned columns separated by two spaces. Each column may be
// capped; the last column takes what is left of width (or all it needs when width is 0).
type table struct {
	headers []string
	// caps are the most runes a column may take (0: no cap); the last column's cap comes from width.
	caps []int
	// width is the terminal width the rows must fit (0: no limit).
	width int
	// minLast is the least the last column keeps when the others already fill width.
	minLast int
	// mins are the least runes a column takes (0: its widest cell), so that rows printed later
	// (status -w) line up with the table.
	mins []int
	rows [][]string
}

const columnGap = "  "

// add appends a row; cells are cleaned of control characters (messages may carry modprobe's stderr).
func (t *table) add(cells ...string) {
	row := make([]string, len(cells))
	for i, c := range cells {
		row[i] = oneLine(c)
	}
	t.rows = append(t.rows, row)
}

// write renders the table to w.
func (t *table) write(w io.Writer) error {
	widths := t.columnWidths()
	var b strings.Builder
	t.writeRow(&b, t.headers, widths)
	for _, r := range t.rows {
		t.writeRow(&b, r, widths)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// columnWidths sizes every column to its widest cell within its cap, and the last one to the room left.
func (t *table) columnWidths() []int {
	n := len(t.headers)
	widths := make([]int, n)
	for i := range n {
		widths[i] = runeLen(t.headers[i])
		for _, r := range t.rows {
			widths[i] = max(widths[i], runeLen(r[i]))
		}
		if i < len(t.mins) {
			widths[i] = max(widths[i], t.mins[i])
		}
		if i < n-1 && i < len(t.caps) && t.caps[i] > 0 {
			widths[i] = min(widths[i], max(t.caps[i], runeLen(t.headers[i])))
		}
	}
	if t.width > 0 {
		used := 0
		for i := range n - 1 {
			used += widths[i] + len(columnGap)
		}
		widths[n-1] = min(widths[n-1], max(t.width-used, t.minLast, runeLen(t.headers[n-1])))
	}
	return widths
}

func (t *table) writeRow(b *strings.Builder, cells []string, widths []int) {
	for i, c := range cells {
		c = truncate(c, widths[i])
		b.WriteString(c)
		if i < len(cells)-1 {
			b.WriteString(strings.Repeat(" ", widths[i]-runeLen(c)))
			b.WriteString(columnGap)
		}
	}
	b.WriteString("\n")
}

// truncate shortens s to at most n runes, ending with … when it cut something.
func truncate(s string, n int) string {
	if runeLen(s) <= n {
		return s
	}
	if n <= 0 {
		return ""
	}
	runes := []rune(s)
	return strings.TrimRightFunc(string(runes[:n-1]), unicode.IsSpace) + ellipsis
}

func runeLen(s string) int { return utf8.RuneCountInString(s) }

// oneLine turns every run of whitespace and control characters into one space.
func oneLine(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
}
