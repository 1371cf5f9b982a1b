package main

import (
	"fmt"
	"io"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

// validate loads the bundle in dir as OLM's tools do and runs the library's default bundle
// validators (ClusterServiceVersion, CRDs, the bundle's owned CRDs), its OperatorHub and object
// validators; it prints every finding and fails on an error.
func validate(dir string, out io.Writer) error {
	bundle, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		return fmt.Errorf("loading the bundle: %w", err)
	}
	validators := append(validation.DefaultBundleValidators, validation.OperatorHubValidator, validation.ObjectValidator)
	objs := []interface{}{bundle, bundle.CSV}
	for _, crd := range bundle.V1CRDs {
		objs = append(objs, crd)
	}
	var failed int
	for _, res := range validators.Validate(objs...) {
		for _, e := range res.Errors {
			failed++
			_, _ = fmt.Fprintf(out, "ERROR %s: %s\n", res.Name, e)
		}
		for _, w := range res.Warnings {
			_, _ = fmt.Fprintf(out, "WARNING %s: %s\n", res.Name, w)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d validation errors", failed)
	}
	_, _ = fmt.Fprintf(out, "bundle %s (%s, %d CRDs): valid\n", dir, bundle.CSV.Name, len(bundle.V1CRDs))
	return nil
}

var _ = errors.ErrorInvalidCSV
