package sign

import (
	"errors"
	"fmt"
)

// Class is the kind of a signing failure, for the sign pod's result and the user's status.
type Class string

// The failure classes. Every error SignModule, NewSigner and Image return has one.
const (
	// ClassKey: the key or the certificate cannot be used: unreadable, malformed, encrypted, of an
	// unsupported type, or larger than MaxKeyBytes.
	ClassKey Class = "Key"
	// ClassKeyMismatch: the private key is not the key of the certificate.
	ClassKeyMismatch Class = "KeyMismatch"
	// ClassNotModule: a file to sign is not an ELF kernel module (ET_REL with a .modinfo section):
	// another kind of file, a compressed module (.ko.xz, .ko.zst, .ko.gz), or not a regular file.
	ClassNotModule Class = "NotModule"
	// ClassMalformedSignature: a file ends with the signature magic but its trailer is not one the
	// kernel would accept, so the module cannot be told apart from its signature.
	ClassMalformedSignature Class = "MalformedSignature"
	// ClassNoMatch: an entry of filesToSign matched no file of the image (the shell upstream runs
	// leaves such a glob unexpanded and sign-file fails on it).
	ClassNoMatch Class = "NoMatch"
	// ClassInvalidInput: filesToSign or the image references are not valid.
	ClassInvalidInput Class = "InvalidInput"
	// ClassTooLarge: a bound of docs/sign.md was exceeded (module size, file count, image size).
	ClassTooLarge Class = "TooLarge"
	// ClassPull: the unsigned image could not be pulled.
	ClassPull Class = "ImagePull"
	// ClassPush: the signed image could not be pushed.
	ClassPush Class = "ImagePush"
)

// Error is a signing failure with its class.
type Error struct {
	// Class is the kind of failure.
	Class Class
	// Err is what went wrong.
	Err error
}

// Error returns the message of the underlying error.
func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// ClassOf returns the class of the first *Error in err's chain, "" when there is none.
func ClassOf(err error) Class {
	var se *Error
	if errors.As(err, &se) {
		return se.Class
	}
	return ""
}

// errorf builds a classified error from a format.
func errorf(c Class, format string, args ...any) error {
	return &Error{Class: c, Err: fmt.Errorf(format, args...)}
}

// classify wraps err with class c unless it already has a class.
func classify(c Class, err error) error {
	if err == nil || ClassOf(err) != "" {
		return err
	}
	return &Error{Class: c, Err: err}
}
