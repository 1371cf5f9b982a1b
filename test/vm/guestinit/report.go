package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/kmm-project/kmm/test/vm"
)

// reporter prints the protocol lines of package vm, each with a single write so that kernel
// messages on the same console cannot split a line.
type reporter struct {
	out            io.Writer
	passed, failed int
}

func (r *reporter) line(kind, text string) {
	// A line must stay one line whatever the detail holds.
	text = strings.NewReplacer("\r", " ", "\n", " | ").Replace(text)
	_, _ = io.WriteString(r.out, vm.Prefix+kind+" "+text+"\n")
}

// info prints a diagnostic line.
func (r *reporter) info(format string, args ...any) {
	r.line(vm.KindInfo, fmt.Sprintf(format, args...))
}

// check prints a CHECK line for step/name and returns ok.
func (r *reporter) check(step, name string, ok bool, format string, args ...any) bool {
	verdict := vm.Pass
	if ok {
		r.passed++
	} else {
		r.failed++
		verdict = vm.Fail
	}
	r.line(vm.KindCheck, fmt.Sprintf("%s/%s %s %s", step, name, verdict, fmt.Sprintf(format, args...)))
	return ok
}

// result prints the worker's JSON result of a step.
func (r *reporter) result(step string, data []byte) {
	r.line(vm.KindResult, step+" "+strings.TrimSpace(string(data)))
}

// done prints the closing line.
func (r *reporter) done() {
	r.line(vm.KindDone, fmt.Sprintf("%d passed, %d failed", r.passed, r.failed))
}
