// Package logging builds the operator's logger: zerolog, structured JSON (or console text for
// people), bridged to logr so that controller-runtime and client-go log through it too.
package logging

import (
	"fmt"
	"io"

	"github.com/go-logr/logr"
	"github.com/go-logr/zerologr"
	"github.com/rs/zerolog"
)

// New returns a logr.Logger writing to w through zerolog at the given level ("debug", "info",
// "warn", "error"). With console set, lines are human-readable text instead of JSON.
func New(w io.Writer, level string, console bool) (logr.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return logr.Discard(), fmt.Errorf("unknown log level %q: use debug, info, warn or error", level)
	}
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000"}
	}
	zl := zerolog.New(w).Level(lvl).With().Timestamp().Logger()
	// logr verbosity V(n) maps to zerolog level (debug - n + 1) in zerologr; V(1) and above are debug detail.
	zerologr.VerbosityFieldName = ""
	return zerologr.New(&zl), nil
}
