package worker

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/kmm-project/kmm/registry"

	"github.com/kmm-project/kmm/contract"
)

// Error is a worker failure with its class. Stderr holds modprobe's standard error when a modprobe
// run failed.
type Error struct {
	// Reason is the failure class.
	Reason contract.Reason
	// Err is what went wrong.
	Err error
	// Stderr is modprobe's standard error, when the failure is a modprobe run.
	Stderr string
}

// Error returns the message of the underlying error.
func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// classified wraps err with reason unless it is already classified.
func classified(reason contract.Reason, err error) error {
	if err == nil {
		return nil
	}
	var we *Error
	if errors.As(err, &we) {
		return err
	}
	return &Error{Reason: reason, Err: err}
}

// errorf builds a classified error from a format.
func errorf(reason contract.Reason, format string, args ...any) error {
	return &Error{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// ReasonOf returns the class of err: the Reason of the first *Error in its chain, else contract.ReasonOther.
func ReasonOf(err error) contract.Reason {
	var we *Error
	if errors.As(err, &we) {
		return we.Reason
	}
	return contract.ReasonOther
}

// stderrOf returns the modprobe stderr recorded in err's chain, if any.
func stderrOf(err error) string {
	var we *Error
	if errors.As(err, &we) {
		return we.Stderr
	}
	return ""
}

// pullError classifies a registry error as ImagePull with a message that says what kind of problem
// it is (authentication, TLS, missing image) before the library's own text.
func pullError(image string, err error) error {
	var le *limitError
	if errors.As(err, &le) {
		return &Error{Reason: contract.ReasonOther, Err: fmt.Errorf("pulling %s: %w", image, le)}
	}
	return &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("pulling %s: %s: %w", image, describePullError(err), err)}
}

// describePullError names the kind of registry failure err is.
func describePullError(err error) string {
	// TLS first: with a loopback or RFC 1918 registry, go-containerregistry also tries plain HTTP
	// and reports both failures, and the HTTP one is rarely the interesting one.
	var uerr x509.UnknownAuthorityError
	var herr x509.HostnameError
	var cerr x509.CertificateInvalidError
	if errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &cerr) || strings.Contains(err.Error(), "x509:") {
		return "TLS certificate of the registry not trusted (registryTLS.insecureSkipTLSVerify skips the check)"
	}
	if strings.Contains(err.Error(), "credential provider") {
		return "the kubelet credential provider plugin failed"
	}
	if strings.Contains(err.Error(), "does not match") {
		return "the registry served content that does not match its digest (refused)"
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden:
			return "authentication failed (check the pull secret)"
		case terr.StatusCode == http.StatusNotFound || hasDiagnostic(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return "image not found"
		case hasDiagnostic(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return "authentication failed (check the pull secret)"
		}
		return fmt.Sprintf("registry error (HTTP %d)", terr.StatusCode)
	}
	if strings.Contains(err.Error(), "basic credential not found") || strings.Contains(err.Error(), "UNAUTHORIZED") {
		return "authentication failed (check the pull secret)"
	}
	return "registry unreachable or refused the request"
}

func hasDiagnostic(terr *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

// endpointFailure is what one endpoint of a pull answered.
type endpointFailure struct {
	ep  registry.Endpoint
	err error
}

// pullFailure classifies a pull that no endpoint served. With the origin alone the message is
// pullError's; with mirrors it names every host tried, in order, with the kind of each failure,
// and wraps the last error.
func pullFailure(image string, fails []endpointFailure) error {
	if len(fails) == 1 && !fails[0].ep.Mirror && fails[0].ep.Source == "" {
		return pullError(image, fails[0].err)
	}
	parts := make([]string, 0, len(fails))
	for _, f := range fails {
		parts = append(parts, fmt.Sprintf("%s: %s", f.ep, describePullError(f.err)))
	}
	last := fails[len(fails)-1].err
	return &Error{Reason: contract.ReasonImagePull, Err: fmt.Errorf("pulling %s: no host served it, tried in order: %s; last error: %w", image, strings.Join(parts, "; "), last)}
}
