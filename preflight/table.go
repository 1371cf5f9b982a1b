package preflight

import (
	"fmt"
	"io"
	"text/tabwriter"

	kmmv1beta2 "github.com/kmm-project/kmm/api/v1beta2"
)

// WriteTable prints one row per Module: the Module, whether it is served on the kernel, the reason
// and the message (the image for a Module that is served). It is what `kubectl kmm preflight` shows.
func WriteTable(w io.Writer, kernel string, verdicts []Verdict) error {
	if len(verdicts) == 0 {
		_, err := fmt.Fprintf(w, "No Modules: nothing to verify for kernel %s.\n", kernel)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "MODULE\tVERIFIED\tREASON\tDETAIL")
	for _, v := range verdicts {
		detail := v.Message
		if v.Verified && v.Image != "" {
			detail = v.Image
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Key(), verified(v), v.Reason, detail)
	}
	return tw.Flush()
}

// verified is the VerificationStatus word of a verdict, as the stored PreflightValidation (v1beta2)
// spells it.
func verified(v Verdict) string {
	switch {
	case v.Verified:
		return kmmv1beta2.VerificationSuccess
	case !v.Final:
		return kmmv1beta2.VerificationInProgress
	}
	return kmmv1beta2.VerificationFailure
}

// Summary counts the verdicts: how many Modules are served and how many are not.
func Summary(kernel string, verdicts []Verdict) string {
	served := 0
	for _, v := range verdicts {
		if v.Verified {
			served++
		}
	}
	return fmt.Sprintf("kernel %s: %d of %d Modules served", kernel, served, len(verdicts))
}
