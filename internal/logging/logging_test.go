package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNewWritesStructuredLines(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "info", false)
	if err != nil {
		t.Fatal(err)
	}
	log.WithValues("node", "n1").Info("Creating load pod", "module", "ns/m")
	log.V(1).Info("detail that info level hides")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1 (the V(1) line is below info): %q", len(lines), buf.String())
	}
	var entry map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &entry); err != nil {
		t.Fatalf("line is not JSON: %v: %s", err, lines[0])
	}
	for k, want := range map[string]string{"node": "n1", "module": "ns/m", "message": "Creating load pod", "level": "info"} {
		if entry[k] != want {
			t.Errorf("field %q = %v, want %q (line %s)", k, entry[k], want, lines[0])
		}
	}
}

func TestNewRejectsUnknownLevel(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, "loud", false); err == nil || !strings.Contains(err.Error(), `unknown log level "loud"`) {
		t.Fatalf("error = %v, want an unknown level error", err)
	}
}
