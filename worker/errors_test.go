package worker

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/kmm-project/kmm/contract"
)

func TestDescribePullError(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"401", &transport.Error{StatusCode: http.StatusUnauthorized}, "authentication failed"},
		{"403", &transport.Error{StatusCode: http.StatusForbidden}, "authentication failed"},
		{"404", &transport.Error{StatusCode: http.StatusNotFound}, "image not found"},
		{"manifest unknown", &transport.Error{StatusCode: http.StatusBadRequest, Errors: []transport.Diagnostic{{Code: transport.ManifestUnknownErrorCode}}}, "image not found"},
		{"denied", &transport.Error{StatusCode: http.StatusBadRequest, Errors: []transport.Diagnostic{{Code: transport.DeniedErrorCode}}}, "authentication failed"},
		{"500", fmt.Errorf("wrapped: %w", &transport.Error{StatusCode: http.StatusInternalServerError}), "registry error (HTTP 500)"},
		{"x509", errors.New(`Get "https://r/v2/": tls: failed to verify certificate: x509: certificate signed by unknown authority`), "TLS certificate"},
		{"network", errors.New("dial tcp: connection refused"), "registry unreachable"},
	}
	for _, tc := range cases {
		if got := describePullError(tc.err); !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
		err := pullError("r/i:t", tc.err)
		if ReasonOf(err) != contract.ReasonImagePull || !errors.Is(err, tc.err) || !strings.HasPrefix(err.Error(), "pulling r/i:t: ") {
			t.Errorf("%s: pullError = %v (%s)", tc.name, err, ReasonOf(err))
		}
	}
}

func TestReasonOf(t *testing.T) {
	inner := &Error{Reason: contract.ReasonBusy, Err: errors.New("in use"), Stderr: "FATAL"}
	wrapped := fmt.Errorf("unloading: %w", inner)
	if ReasonOf(wrapped) != contract.ReasonBusy || stderrOf(wrapped) != "FATAL" {
		t.Errorf("wrapped classified error lost its class or stderr")
	}
	if ReasonOf(errors.New("plain")) != contract.ReasonOther {
		t.Errorf("an unclassified error is Other")
	}
	if got := ReasonOf(classified(contract.ReasonImagePull, wrapped)); got != contract.ReasonBusy {
		t.Errorf("classified must not override an existing class, got %s", got)
	}
	if classified(contract.ReasonOther, nil) != nil {
		t.Errorf("classified(nil) must be nil")
	}
}
