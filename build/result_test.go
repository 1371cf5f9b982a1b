package build

import (
	"strings"
	"testing"
)

func TestResultRoundTrip(t *testing.T) {
	for _, r := range []Result{
		{Image: "r/m:k", Digest: "sha256:abc"},
		{Image: "r/m:k", Message: "buildctl: exit status 1", Log: "#5 ERROR: process \"make\" did not complete"},
	} {
		data, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseResult(data)
		if err != nil || got != r {
			t.Errorf("round trip of %+v: %+v, %v", r, got, err)
		}
		if got.Succeeded() != (r.Digest != "") {
			t.Errorf("%+v: Succeeded %t", r, got.Succeeded())
		}
	}
}

func TestResultKeepsTheLogsEndWithinTheLimit(t *testing.T) {
	r := Result{Image: "r/m:k", Message: strings.Repeat("m", 5000), Log: strings.Repeat("x", 100000) + "the error at the end"}
	data, err := r.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > MaxResultBytes {
		t.Fatalf("%d bytes, over %d", len(data), MaxResultBytes)
	}
	got, err := ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(got.Log, "the error at the end") || len(got.Log) < 1000 {
		t.Errorf("log kept: %d bytes ending %q", len(got.Log), got.Log[max(0, len(got.Log)-30):])
	}
	if len(got.Message) != maxMessageBytes {
		t.Errorf("message kept: %d bytes, want %d", len(got.Message), maxMessageBytes)
	}
}

func TestParseResultRejects(t *testing.T) {
	for _, in := range []string{``, `{}`, `{"image":"r/m:k"}`, `{"digest":"sha256:abc"}`, `not json`} {
		if _, err := ParseResult([]byte(in)); err == nil {
			t.Errorf("ParseResult(%q) accepted", in)
		}
	}
}
