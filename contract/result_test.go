package contract

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestResultRoundTrip(t *testing.T) {
	in := Result{Action: ActionLoad, Namespace: "ns", Name: "m", KernelModule: "kmm_a", Kernel: "6.1.0", BootID: "b",
		ImageDigest: "sha256:" + strings.Repeat("a", 64), FromCache: true, Outcome: OutcomeSucceeded}
	data, err := in.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"action":"load","namespace":"ns","name":"m","kernelModule":"kmm_a","kernel":"6.1.0","bootID":"b","imageDigest":"sha256:` +
		strings.Repeat("a", 64) + `","fromCache":true,"outcome":"Succeeded"}`
	if string(data) != want {
		t.Errorf("JSON (a contract with the operator) changed:\n got %s\nwant %s", data, want)
	}
	out, err := ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Errorf("round trip: got %+v, want %+v", out, in)
	}
}

func TestResultMarshalStaysUnderTheTerminationMessageLimit(t *testing.T) {
	// Control characters grow sixfold in JSON (\u0001), and stderr can be long.
	hostile := strings.Repeat("\x01é", 5000) + "modprobe: FATAL: the last line"
	r := Result{Action: ActionUnload, Namespace: strings.Repeat("n", 63), Name: strings.Repeat("m", 253), Kernel: "6.1.0",
		Outcome: OutcomeFailed, Reason: ReasonBusy, Message: strings.Repeat("\x02", 3000), Stderr: hostile}
	data, err := r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > MaxResultBytes {
		t.Fatalf("encoded result is %d bytes, more than %d", len(data), MaxResultBytes)
	}
	got, err := ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(got.Stderr, "modprobe: FATAL: the last line") || !utf8.ValidString(got.Stderr) {
		t.Errorf("stderr should keep its valid UTF-8 tail, got %q", got.Stderr)
	}
	if got.Reason != ReasonBusy || got.Name != r.Name {
		t.Errorf("shortening lost fields: %+v", got)
	}
}

func TestResultStderrTailIsAbout2KiB(t *testing.T) {
	r := Result{Action: ActionLoad, Namespace: "n", Name: "m", Outcome: OutcomeFailed, Reason: ReasonOther, Stderr: strings.Repeat("x", 10000) + "END"}
	data, _ := r.Marshal()
	got, _ := ParseResult(data)
	if len(got.Stderr) != maxStderrBytes || !strings.HasSuffix(got.Stderr, "END") {
		t.Errorf("stderr is %d bytes (want %d, ending in END)", len(got.Stderr), maxStderrBytes)
	}
}

func TestParseResultRejects(t *testing.T) {
	cases := map[string]string{
		"not JSON":             `modprobe: FATAL`,
		"unknown action":       `{"action":"restart","namespace":"n","name":"m","outcome":"Succeeded"}`,
		"unknown outcome":      `{"action":"load","namespace":"n","name":"m","outcome":"Maybe"}`,
		"failed without class": `{"action":"load","namespace":"n","name":"m","outcome":"Failed"}`,
		"unknown class":        `{"action":"load","namespace":"n","name":"m","outcome":"Failed","reason":"Weird"}`,
		"success with class":   `{"action":"load","namespace":"n","name":"m","outcome":"Succeeded","reason":"Busy"}`,
		"success for nobody":   `{"action":"load","outcome":"Succeeded"}`,
	}
	for name, in := range cases {
		if _, err := ParseResult([]byte(in)); err == nil {
			t.Errorf("%s: ParseResult(%s) accepted it", name, in)
		}
	}
	if _, err := ParseResult([]byte(`{"action":"load","namespace":"n","name":"m","outcome":"Succeeded","newField":1}`)); err != nil {
		t.Errorf("unknown fields must be ignored for forward compatibility: %v", err)
	}
}

func TestResultFailedStepOnlyForAFailedReload(t *testing.T) {
	base := `{"action":%q,"namespace":"ns","name":"m","kernel":"k","outcome":%q%s%s}`
	cases := []struct {
		action, outcome, reason, step string
		ok                            bool
	}{
		{"reload", "Failed", "Busy", "unload", true},
		{"reload", "Failed", "NotFound", "load", true},
		{"reload", "Failed", "Busy", "", false},
		{"reload", "Failed", "Busy", "both", false},
		{"reload", "Succeeded", "", "", true},
		{"reload", "Succeeded", "", "load", false},
		{"load", "Failed", "Busy", "unload", false},
	}
	for _, tc := range cases {
		reason, step := "", ""
		if tc.reason != "" {
			reason = `,"reason":"` + tc.reason + `"`
		}
		if tc.step != "" {
			step = `,"failedStep":"` + tc.step + `"`
		}
		r, err := ParseResult([]byte(fmt.Sprintf(base, tc.action, tc.outcome, reason, step)))
		if (err == nil) != tc.ok {
			t.Errorf("%+v: error %v", tc, err)
		}
		if err == nil && r.FailedStep != tc.step {
			t.Errorf("%+v: failedStep decoded as %q", tc, r.FailedStep)
		}
	}
}
