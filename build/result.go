package build

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Result is what the build pod reports, as JSON in its termination message.
type Result struct {
	// Image is the reference pushed.
	Image string `json:"image"`
	// Digest is the pushed image's digest (sha256:...), on success.
	Digest string `json:"digest,omitempty"`
	// Message says why the build failed; empty on success.
	Message string `json:"message,omitempty"`
	// Log is the tail of the build's log, on failure.
	Log string `json:"log,omitempty"`
}

// MaxResultBytes bounds the encoded Result: Kubernetes keeps at most 4096 bytes of a termination
// message.
const MaxResultBytes = 4096

const maxMessageBytes = 512

// Succeeded says whether the build pushed the image.
func (r Result) Succeeded() bool { return r.Digest != "" && r.Message == "" }

// Marshal encodes r in at most MaxResultBytes, keeping the end of the log (where a build says what
// failed) and the start of the message.
func (r Result) Marshal() ([]byte, error) {
	if len(r.Message) > maxMessageBytes {
		r.Message = r.Message[:maxMessageBytes]
	}
	for {
		data, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		if len(data) <= MaxResultBytes {
			return data, nil
		}
		if r.Log == "" {
			return nil, fmt.Errorf("build result of %d bytes exceeds %d bytes without its log", len(data), MaxResultBytes)
		}
		r.Log = r.Log[len(r.Log)-len(r.Log)/2:]
	}
}

// ParseResult decodes a build pod's termination message.
func ParseResult(data []byte) (Result, error) {
	var r Result
	if err := json.Unmarshal(data, &r); err != nil {
		return Result{}, fmt.Errorf("build result is not JSON: %w", err)
	}
	switch {
	case r.Image == "":
		return Result{}, errors.New("build result names no image")
	case r.Digest == "" && r.Message == "":
		return Result{}, errors.New("build result has neither a digest nor a failure message")
	}
	return r, nil
}
